"""Real servers in their own processes on free ports of 127.0.0.1, each a context manager: Debian's nginx with the
shipped deploy/nginx.conf (`Nginx`), Debian's PgBouncer in transaction mode (`PgBouncer`), the console under gunicorn
(`WebServer`). The several-nodes scenario (drills/nodes.py) and the test suite's edge tests use them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[3]  # the repository: manage.py, deploy/


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listening(process: subprocess.Popen, port: int, wait_s: float = 15) -> bool:
    """Whether `process` listens on 127.0.0.1:`port` within `wait_s` (False: it died or never did)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        time.sleep(0.05)
    return False


def _stop(process: subprocess.Popen | None, wait_s: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not ended within `wait_s`."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _daemon(command: list[str], port: int, name: str, log) -> subprocess.Popen:
    """`command` started and listening on `port`; stopped again, with its `log()` in the error, if it never does."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    if _listening(process, port):
        return process
    _stop(process)
    raise RuntimeError(f"{name} did not start: {log()[-2000:]}")


class Nginx:
    """Debian's nginx with the shipped deploy/nginx.conf in front of `upstreams` (host:port), on a free port of
    127.0.0.1: the file as an operator installs it, only its addresses and paths put in (the upstream servers, the
    port, the static root, the proxy settings' path, the MCP gateway's address), inside a minimal main configuration
    of its own."""

    BINARY = "/usr/sbin/nginx"

    def __init__(
        self, upstreams: list[str], *, static_root: Path, workdir: Path, mcp_gateway: str = "127.0.0.1:8765"
    ) -> None:
        self.port, self.tls_port, self.workdir = free_port(), free_port(), workdir
        self.url, self.tls_url = f"http://127.0.0.1:{self.port}", f"https://127.0.0.1:{self.tls_port}"
        workdir.mkdir(parents=True, exist_ok=True)
        certificate, key = workdir / "cert.pem", workdir / "key.pem"
        made = subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"),
                *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(certificate)),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        site = (ROOT / "deploy" / "nginx.conf").read_text()
        servers = "".join(f"    server {address} max_fails=0;\n" for address in upstreams)
        replaced = {
            "    server 127.0.0.1:8000 max_fails=0;  # one line per web process: 10.0.0.11:8000, 10.0.0.12:8000...\n": (
                servers
            ),
            "    server 127.0.0.1:8765 max_fails=0;": f"    server {mcp_gateway} max_fails=0;",
            "listen 80;": f"listen 127.0.0.1:{self.port};",
            "listen 443 ssl;": f"listen 127.0.0.1:{self.tls_port} ssl;",
            "/etc/ssl/certs/recovery-console.pem": str(certificate),
            "/etc/ssl/private/recovery-console.key": str(key),
            "/srv/recovery-console/static/": f"{static_root}/",
            "/etc/nginx/recovery-console-proxy.conf": str(ROOT / "deploy" / "nginx-proxy.conf"),
        }
        for old, new in replaced.items():
            assert old in site, f"deploy/nginx.conf no longer has {old!r}"
            site = site.replace(old, new)
        temp = {name: workdir / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
        for path in temp.values():
            path.mkdir(parents=True, exist_ok=True)
        user = "user root root;\n" if os.geteuid() == 0 else ""
        (workdir / "nginx.conf").write_text(
            f"{user}daemon off;\nworker_processes 1;\npid {workdir}/nginx.pid;\nerror_log {workdir}/error.log;\n"
            "events { worker_connections 1024; }\n"
            f"http {{\ninclude /etc/nginx/mime.types;\naccess_log {workdir}/access.log;\n"
            f"client_body_temp_path {temp['body']};\nproxy_temp_path {temp['proxy']};\n"
            f"fastcgi_temp_path {temp['fastcgi']};\nuwsgi_temp_path {temp['uwsgi']};\nscgi_temp_path {temp['scgi']};\n"
            f"{site}\n}}\n"
        )
        self.certificate = certificate  # what a client verifies the HTTPS server with
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Nginx:
        command = [self.BINARY, "-p", str(self.workdir), "-c", str(self.workdir / "nginx.conf")]
        checked = subprocess.run([*command, "-t"], capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
        self.process = _daemon(command, self.port, "nginx", self.error_log)
        return self

    def __exit__(self, *exc: object) -> None:
        _stop(self.process)

    def error_log(self) -> str:
        path = self.workdir / "error.log"
        return path.read_text() if path.exists() else ""


class PgBouncer:
    """Debian's PgBouncer in transaction mode on a free port of 127.0.0.1, in front of the PostgreSQL at
    `host:port` (every database name passed through as it is), trusting its local clients as the server does."""

    BINARY = "/usr/sbin/pgbouncer"

    def __init__(
        self, host: str, port: int, *, user: str, workdir: Path, pool_size: int = 20, password: str = ""
    ) -> None:
        """`password`: the one PgBouncer logs in to the server with (its clients are trusted, on 127.0.0.1)."""
        self.port, self.workdir, self.user = free_port(), workdir, user
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "users.txt").write_text(f'"{user}" "{password}"\n')
        (workdir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {workdir / 'users.txt'}\nadmin_users = {user}\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 1000\n"
            "server_reset_query =\nignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {workdir / 'pgbouncer.log'}\npidfile = {workdir / 'pgbouncer.pid'}\n"
        )
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> PgBouncer:
        command = [self.BINARY, str(self.workdir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            command[1:1] = ["-u", "postgres"]  # it refuses to run as root
            subprocess.run(["chown", "-R", "postgres", str(self.workdir)], check=True)
        self.process = _daemon(command, self.port, "pgbouncer", self.log)
        return self

    def __exit__(self, *exc: object) -> None:
        _stop(self.process)

    def transactions(self, database: str) -> int:
        """How many transactions PgBouncer has passed to `database` so far (its admin console's SHOW STATS)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, dbname="pgbouncer", user=self.user, autocommit=True
        ) as admin:
            cursor = admin.cursor()
            cursor.execute("SHOW STATS")  # PgBouncer's admin console: a command of its own, no table
            names = [column.name for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        return sum(int(row["total_xact_count"]) for row in rows if row["database"] == database)

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text() if path.exists() else ""


class WebServer:
    """The console under gunicorn on a free port (`env` as given: see production_env), stopped on exit."""

    def __init__(
        self, env: dict[str, str], *, log_path: Path, workers: int = 1, threads: int = 4, shipped: bool = False
    ) -> None:
        """`shipped`: with deploy/gunicorn.conf.py (its workers and threads from `workers` and `threads` through
        the environment, as an operator sets them), else gunicorn's defaults with those counts."""
        self.env, self.log_path = env, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        bind = f"127.0.0.1:{self.port}"
        if shipped:
            self.env = {**env, "GUNICORN_BIND": bind, "WEB_CONCURRENCY": str(workers), "GUNICORN_THREADS": str(threads)}
            self.command = [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "deploy" / "gunicorn.conf.py")]
        else:
            self.command = [sys.executable, "-m", "gunicorn", "console.wsgi:application", "--bind", bind]
            self.command += ["--workers", str(workers), "--threads", str(threads)]
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> WebServer:
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                # A cold first request (Django's URLs, views and templates loaded) may take seconds on a busy
                # machine: a timeout is "not ready yet", like a refused connection, never a leaked server.
                requests.get(self.url + "/sign-in/", timeout=10, allow_redirects=False)
                return self
            except requests.RequestException:
                time.sleep(0.1)
            except BaseException:
                self.__exit__()
                raise
        self.__exit__()
        raise RuntimeError(f"gunicorn did not start:\n{self.log()[-3000:]}")

    def __exit__(self, *exc: object) -> None:
        _stop(self.process, 20)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

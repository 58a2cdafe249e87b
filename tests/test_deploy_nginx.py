"""The shipped front (deploy/nginx.conf, deploy/gunicorn.conf.py; docs/deploy.md) with Debian's nginx in front of
gunicorn, for real: slow-body clients never starve the web process, static files come from nginx, bodies over the
limit are refused before they reach it, and the original scheme reaches Django.

Measured before this front existed: with 6 to 12 slow-body connections held open against gunicorn directly, 0 to 3
of every 5 to 17 health probes timed out at 3 s. The control below reproduces that on a small web process; the same
clients through nginx leave every probe answered.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from recovery.devtools.drills.stage import database_url
from tests.conftest import missing_service
from tests.servers import ROOT, Nginx, WebServer, production_env

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_CLIENTS = 6
PROBES = 8
PROBE_TIMEOUT_S = 3


@pytest.fixture
def nginx_binary():
    if not Path(Nginx.BINARY).exists():
        missing_service("needs Debian's nginx (apt-get install nginx): the front is tested for real")


@pytest.fixture(scope="module")
def static_root(tmp_path_factory) -> Path:
    """STATIC_ROOT as the release step writes it (`collectstatic`: hashed names and their manifest)."""
    root = tmp_path_factory.mktemp("static")
    env = production_env(DATABASE_URL=database_url(), RECOVERY_TOKEN_PEPPER="p", RECOVERY_STATIC_ROOT=str(root))
    built = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"], cwd=ROOT, env=env, capture_output=True, timeout=300
    )
    assert built.returncode == 0, built.stderr
    return root


@pytest.fixture
def web(tmp_path, nginx_binary, static_root):
    """One small web process with the shipped gunicorn settings: 1 process, 2 threads (what slow clients starve)."""
    env = production_env(
        DATABASE_URL=database_url(),
        RECOVERY_TOKEN_PEPPER="nginx-pepper",
        RECOVERY_STATIC_ROOT=str(static_root),
        TRUST_X_FORWARDED_PROTO="1",
        SECURE_SSL_REDIRECT="1",
        RECOVERY_READY_CACHE_S="0",
    )
    with WebServer(env, log_path=tmp_path / "gunicorn.log", workers=1, threads=2, shipped=True) as server:
        yield server


@contextlib.contextmanager
def slow_bodies(port: int, count: int, *, tls: bool = False):
    """`count` clients that announce a 5,000-byte JSON body and send one byte a second, held open."""
    sockets, stop = [], threading.Event()
    head = (
        b"POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer rc_slow\r\n"
        b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
    )
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the test's own certificate
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if tls:
            sock = context.wrap_socket(sock)
        sock.sendall(head + b"{")
        sockets.append(sock)

    def trickle() -> None:
        while not stop.wait(1):
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.sendall(b" ")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # the web process (or nginx) has taken them in
        yield
    finally:
        stop.set()
        thread.join(5)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()


def probes(url: str) -> list[float | None]:
    """PROBES health probes in a row, over plain HTTP as a load balancer sends them: each one's seconds, None for one
    that timed out."""
    found = []
    for _ in range(PROBES):
        started = time.monotonic()
        try:
            ok = requests.get(url + "/readyz", timeout=PROBE_TIMEOUT_S).status_code == 200
            found.append(time.monotonic() - started if ok else None)
        except requests.RequestException:
            found.append(None)
    return found


def test_slow_body_clients_starve_gunicorn_alone_but_never_through_nginx(web, static_root, tmp_path):
    # The control: held open against gunicorn itself, the slow bodies take its threads and probes time out.
    with slow_bodies(web.port, SLOW_CLIENTS):
        direct = probes(web.url)
    assert None in direct, direct  # the harm the front exists to prevent
    # gunicorn works off the control's abandoned requests first: the fronted series starts once it answers again.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            if requests.get(web.url + "/readyz", timeout=PROBE_TIMEOUT_S).ok and time.monotonic() - started < 0.5:
                break
        except requests.RequestException:
            pass
        time.sleep(0.2)

    with Nginx([f"127.0.0.1:{web.port}"], static_root=static_root, workdir=tmp_path / "nginx") as front:
        requests.get(front.url + "/readyz", timeout=10)  # nginx's first connection upstream, before the slow bodies
        with slow_bodies(front.tls_port, SLOW_CLIENTS * 2, tls=True):
            fronted = probes(front.url)
        assert None not in fronted, (fronted, front.error_log()[-2000:])
        assert max(fronted) < 1.0, fronted


def test_nginx_serves_static_files_caps_bodies_and_passes_the_scheme(web, static_root, tmp_path):
    with Nginx([f"127.0.0.1:{web.port}"], static_root=static_root, workdir=tmp_path / "nginx") as front:
        tls = {"verify": str(front.certificate), "timeout": 10, "allow_redirects": False}
        # The pages' static files (hashed names from collectstatic's manifest) come from nginx's disk, cached a year.
        hashed = json.loads((static_root / "staticfiles.json").read_text())["paths"]
        css = next(name for name in hashed.values() if name.endswith(".css"))
        asset = requests.get(f"{front.tls_url}/static/{css}", **tls)
        assert asset.status_code == 200 and asset.content == (static_root / css).read_bytes()
        assert "max-age=31536000" in asset.headers["Cache-Control"] and "immutable" in asset.headers["Cache-Control"]
        assert css not in web.log()  # gunicorn never saw it

        # Over HTTPS, nginx tells Django so: the production settings serve the page instead of redirecting.
        page = requests.get(front.tls_url + "/sign-in/", **tls)
        assert page.status_code == 200 and "csrftoken" in page.cookies
        assert "Secure" in page.headers["Set-Cookie"]
        # Over plain HTTP nginx redirects to HTTPS itself, and a scheme a client makes up is overwritten by nginx's.
        plain = requests.get(front.url + "/sign-in/", timeout=10, allow_redirects=False)
        assert plain.status_code == 301 and plain.headers["Location"].startswith("https://")
        forged = requests.get(
            f"http://127.0.0.1:{web.port}/sign-in/", timeout=10, allow_redirects=False
        )  # straight to gunicorn, no nginx: not secure
        assert forged.status_code == 301

        # A body over the cap is refused by nginx before anything reads it.
        refused = requests.post(front.tls_url + "/api/v1/tasks", data=b"x" * (2 * 1024 * 1024), **tls)
        assert refused.status_code == 413
        assert "/api/v1/tasks" not in web.log()

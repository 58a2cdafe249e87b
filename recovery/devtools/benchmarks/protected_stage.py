"""The `protected` benchmark's stage: a console under gunicorn with deploy/gunicorn.conf.py (this checkout's, or an
earlier commit's for the same-run baseline) and its CPU time read from /proc; and the SQL statements a protected call
costs, counted on a console served from threads of this process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
from django.conf import settings
from django.db.backends.signals import connection_created
from recovery_client import RecoveryClient, recovered

from recovery.devtools.drills.stage import ApiServer, database_url

WORKERS, THREADS = 2, 4  # 2 cores: WEB_CONCURRENCY=2 (the file's default, 2 per core, would be 4)
_TICKS = os.sysconf("SC_CLK_TCK")


class Console:
    """gunicorn -c deploy/gunicorn.conf.py serving `checkout` (None: this one) on a free port, on this database."""

    def __init__(self, name: str, checkout: Path | None, log_dir: Path) -> None:
        self.name, self.checkout = name, checkout or Path(settings.BASE_DIR)
        self.log_path = log_dir / f"api-{name}.log"
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.description = f"{WORKERS} workers x {THREADS} threads"

    def __enter__(self) -> Console:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1", "GUNICORN_LOGLEVEL": "warning"}
        env |= {"GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": str(WORKERS), "GUNICORN_THREADS": str(THREADS)}
        env.pop("PYTHONPATH", None)  # the console never imports the client: nothing of this checkout leaks in
        if settings.REDIS_URL:
            env["REDIS_URL"] = settings.REDIS_URL
        python = self.checkout / ".venv" / "bin" / "python"
        command = [
            str(python if python.exists() else sys.executable),
            "-m",
            "gunicorn",
            "-c",
            "deploy/gunicorn.conf.py",
        ]
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                command, cwd=self.checkout, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                requests.get(f"{self.url}/api/v1/calls/0", timeout=10)
                return self
            except requests.RequestException:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"the {self.name} console did not start: {self.log_path.read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the gunicorn master and its workers so far, reaped workers included."""
        assert self.process is not None
        group, total = self.process.pid, 0.0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) != group:  # the process group (the master's session)
                continue
            total += sum(int(value) for value in fields[11:15]) / _TICKS  # utime stime cutime cstime
        return total


class _NoAdmitOnAdd(RecoveryClient):
    """A client speaking the API as before 1.2: registration, admission and report in three round trips."""

    def answers(self, minor: int) -> bool:
        return minor < 2 and super().answers(minor)


def statements_per_call(sandbox_url: str, token: str, api_key: str, run: str, calls: int = 5) -> dict:
    """SQL statements per protected call (its registration, admission and report; the task opened before), on a
    console served from threads of this process: with API 1.2's admission on registration and the report deferred,
    and in three round trips as before."""
    counted = {"on": False, "n": 0}
    lock = threading.Lock()

    def count(execute, sql, params, many, context):
        if counted["on"]:
            with lock:
                counted["n"] += 1
        return execute(sql, params, many, context)

    def wrap(sender, connection, **kwargs) -> None:
        connection.execute_wrappers.append(count)

    connection_created.connect(wrap)
    server = ApiServer().start()
    try:
        out = {}
        for label, kind, defer in (
            ("one_round_trip", RecoveryClient, True),
            ("three_round_trips", _NoAdmitOnAdd, False),
        ):
            client = kind(server.url, token)
            with recovered.task(
                client, tenant="demo", external_id=f"bench-{run}-sql-{label}", goal="count", defer_reports=defer
            ) as opened:

                @recovered.tool("refund.create", key="refund-{order_id}")
                def refund(order_id: str, amount_cents: int) -> dict:
                    """Refund."""
                    reply = recovered.http().post(
                        f"{sandbox_url}/refunds",
                        json={"order_id": order_id, "amount_cents": amount_cents},
                        headers={"Authorization": f"Bearer {api_key}"},
                    )
                    reply.raise_for_status()
                    return reply.json()

                refund(order_id=f"O-77{int(run, 16) % 10**5}", amount_cents=100)  # warm (not counted)
                opened.agent.reports.settle(opened.id)
                counted.update(on=True, n=0)
                for n in range(calls):
                    refund(order_id=f"O-78{int(run, 16) % 10**5}{1 if label[0] == 'o' else 2}{n}", amount_cents=100)
                opened.agent.reports.settle(opened.id)
                counted["on"] = False
                out[label] = round(counted["n"] / calls, 1)
        return out
    finally:
        connection_created.disconnect(wrap)
        server.stop()

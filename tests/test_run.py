"""`make run` on a fresh machine: the embedded SQLite default, migrations, demo users, and the served console with
the sandbox, the jobs and the demo agent (on PostgreSQL and RQ too)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.conftest import missing_service
from tests.isolation import extra_redis_database

ROOT = Path(__file__).resolve().parent.parent


def _manage(*args: str, var_dir: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(DEBUG="1", RECOVERY_VAR_DIR=str(var_dir), **extra)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_it_prepares_the_embedded_default_from_nothing(tmp_path):
    first = _manage("run", "--no-serve", var_dir=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "demo users: viewer, reviewer, approver, admin" in first.stdout
    assert "sqlite3" in first.stdout
    database = tmp_path / "recovery.sqlite3"
    assert database.exists()
    with sqlite3.connect(database) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        users = {row[0]: row[1] for row in db.execute("SELECT username, is_staff FROM auth_user")}
        tools = {row[0] for row in db.execute("SELECT name FROM recovery_tool")}
    assert users == {"viewer": 0, "reviewer": 0, "approver": 0, "admin": 1}
    shipped = json.loads((ROOT / "recovery" / "fixtures" / "registry.example.json").read_text())
    assert tools == {tool["name"] for tool in shipped["tools"]}  # the sandbox's registry, loaded on the first run

    again = _manage("run", "--no-serve", var_dir=tmp_path)  # a second `make run` keeps what is there
    assert again.returncode == 0, again.stderr
    verified = _manage("verify_audit", var_dir=tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert "audit trail OK" in verified.stdout


def test_the_demo_registry_follows_the_sandbox_address_setting(tmp_path):
    first = _manage("run", "--no-serve", var_dir=tmp_path, RECOVERY_SANDBOX_ADDR="127.0.0.1:18123")
    assert first.returncode == 0, first.stderr
    database = tmp_path / "recovery.sqlite3"

    def base_url() -> str:
        with sqlite3.connect(database) as db:
            return db.execute("SELECT base_url FROM recovery_provider WHERE name = 'sandbox'").fetchone()[0]

    assert base_url() == "http://127.0.0.1:18123"  # loaded at the address, not the shipped file's 8001

    moved = _manage("run", "--no-serve", var_dir=tmp_path, RECOVERY_SANDBOX_ADDR="127.0.0.1:18124")
    assert moved.returncode == 0, moved.stderr
    assert "registry: provider 'sandbox' now at http://127.0.0.1:18124 (RECOVERY_SANDBOX_ADDR)" in moved.stdout
    assert base_url() == "http://127.0.0.1:18124"
    with sqlite3.connect(database) as db:
        (evidence,) = db.execute(
            "SELECT evidence FROM recovery_auditevent WHERE action = 'registry.loaded' ORDER BY id DESC LIMIT 1"
        ).fetchone()
    assert json.loads(evidence)["updated"] == {"providers": {"sandbox": ["base_url"]}}
    same = _manage("run", "--no-serve", var_dir=tmp_path, RECOVERY_SANDBOX_ADDR="127.0.0.1:18124")
    assert "now at" not in same.stdout  # nothing moved, nothing recorded

    bad = _manage("run", "--no-serve", var_dir=tmp_path, RECOVERY_SANDBOX_ADDR="127.0.0.1:http")
    assert bad.returncode != 0 and "RECOVERY_SANDBOX_ADDR='127.0.0.1:http': use host:port" in bad.stderr
    assert _manage("verify_audit", var_dir=tmp_path).returncode == 0


def test_make_run_refuses_a_sandbox_address_in_use_before_starting_anything(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _manage(
            "run", "--addr", f"127.0.0.1:{_free_port()}", var_dir=tmp_path, RECOVERY_SANDBOX_ADDR=f"127.0.0.1:{port}"
        )
    assert result.returncode != 0
    assert f"cannot serve on 127.0.0.1:{port}" in result.stderr and "set RECOVERY_SANDBOX_ADDR" in result.stderr
    assert "make run SANDBOX_ADDR=host:port" in result.stderr  # what a make user can do


def _make_run_shown(*variables: str) -> str:
    """The command `make run` would serve with (`make -n`), as a user's shell runs it: not inside the make that
    runs the suite (whose MAKEFLAGS would add "Entering/Leaving directory" lines)."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL", "MFLAGS"}}
    shown = subprocess.run(
        ["make", "-n", "run", *variables], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    ).stdout
    return [line.strip() for line in shown.splitlines() if "manage.py run" in line][-1]


def test_make_run_passes_the_console_and_sandbox_addresses_on():
    shown = _make_run_shown("ADDR=127.0.0.1:8100", "SANDBOX_ADDR=127.0.0.1:8101")
    assert shown.startswith("RECOVERY_SANDBOX_ADDR=127.0.0.1:8101 ") and shown.endswith(
        "manage.py run --addr 127.0.0.1:8100"
    )
    plain = _make_run_shown()
    assert plain.endswith("manage.py run") and "RECOVERY_SANDBOX_ADDR" not in plain


def test_manage_py_help_needs_no_secret_and_a_missing_one_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"}}
    env["RECOVERY_VAR_DIR"] = str(tmp_path)
    run = [sys.executable, "manage.py", "run"]
    helped = subprocess.run([*run, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "--addr ADDR" in helped.stdout and "Traceback" not in helped.stderr
    refused = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "SECRET_KEY must be set" in refused.stderr and "DEBUG=1" in refused.stderr


def test_the_database_rules_hold_on_sqlite_too(db):
    """CI runs the suite on PostgreSQL; the embedded default must enforce the same state table and audit rules, and
    read and write the same through the raw SQL of the hot paths."""
    if connection.vendor == "sqlite":
        pytest.skip("this run already executes every database test on SQLite")
    # PostgreSQL-only tests in these files already ran in this process: here they may skip.
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REQUIRE_SERVICES"}}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            # The state table and the audit rules, and the raw SQL held equal to the ORM (it must be portable).
            *("tests/test_states.py", "tests/test_audit.py", "tests/test_hot_path.py", "tests/test_queue_selector.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


# `make run` served for real: the sandbox, the jobs, the console, and the demo agent playing its scenarios ---------

DEMO_DONE = re.compile(r"demo: (\d+) of (\d+) scenarios ended as pinned")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _serve_and_watch(env: dict[str, str]) -> tuple[list[str], float]:
    """`manage.py run` until the demo reports, then Ctrl-C: (its output lines, seconds from start to the report).

    Both its ports are free ones (the console's --addr, the sandbox's RECOVERY_SANDBOX_ADDR), so a developer's own
    `make run` on 8000 and 8001 goes on undisturbed."""
    sandbox_port = _free_port()
    env = env | {"RECOVERY_SANDBOX_ADDR": f"127.0.0.1:{sandbox_port}"}
    addr = f"127.0.0.1:{_free_port()}"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run", "--addr", addr],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip()) for line in process.stdout], daemon=True).start()
    seen, start = [], time.monotonic()
    try:
        while time.monotonic() - start < 240:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                assert process.poll() is None, "\n".join(seen[-40:])
                continue
            if DEMO_DONE.search(seen[-1]):
                return seen, time.monotonic() - start
        pytest.fail("the demo never reported:\n" + "\n".join(seen[-60:]))
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: everything `make run` started stops with it
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("`manage.py run` did not stop on Ctrl-C")
        deadline = time.monotonic() + 10
        while _port_open(sandbox_port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _port_open(sandbox_port), "the sandbox outlived `make run`"


def _settled_by_receipts(rows: list[tuple]) -> int:
    return sum(1 for before, after, applied in rows if before == "UNKNOWN" and after == "COMMITTED" and applied)


def test_make_run_serves_and_the_demo_settles_unknown_calls_by_receipts_within_a_minute(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(DEBUG="1", RECOVERY_VAR_DIR=str(tmp_path), PYTHONUNBUFFERED="1")

    output, seconds = _serve_and_watch(env)

    passed, total = map(int, DEMO_DONE.search(output[-1]).groups())
    assert (passed, total) == (total, total) and total >= 9, "\n".join(output)
    assert "jobs: in-process" in "\n".join(output)
    with sqlite3.connect(tmp_path / "recovery.sqlite3") as db:
        receipts = db.execute("SELECT local_state_before, local_state_after, applied FROM recovery_receipt").fetchall()
        sources = {row[0] for row in db.execute("SELECT DISTINCT source FROM recovery_receipt")}
    assert _settled_by_receipts(receipts) >= 1 and seconds < 90, (receipts, seconds)
    assert sources <= {"poll", "callback", "runtime"}


@pytest.mark.postgres
def test_make_run_does_the_same_on_postgresql_with_rq_workers(tmp_path):
    if not settings.REDIS_URL:
        missing_service("needs Redis: run with REDIS_URL=redis://host:6379/0")
    import psycopg

    admin = connection.settings_dict
    name = f"run_test_{os.getpid()}"
    dsn = f"host={admin['HOST'] or 'localhost'} port={admin['PORT'] or 5432} user={admin['USER']} dbname=postgres"
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute(f'DROP DATABASE IF EXISTS "{name}"')
        pg.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(
            DEBUG="1",
            RECOVERY_VAR_DIR=str(tmp_path),
            PYTHONUNBUFFERED="1",
            DATABASE_URL=f"postgres://{admin['USER']}@{admin['HOST'] or 'localhost'}:{admin['PORT'] or 5432}/{name}",
            REDIS_URL=extra_redis_database("make-run"),
        )
        output, seconds = _serve_and_watch(env)
        passed, total = map(int, DEMO_DONE.search(output[-1]).groups())
        assert (passed, total) == (total, total), "\n".join(output)
        assert "jobs: RQ worker and scheduler" in "\n".join(output)
        with psycopg.connect(dsn.replace("dbname=postgres", f"dbname={name}")) as pg:
            receipts = pg.execute(
                "SELECT local_state_before, local_state_after, applied FROM recovery_receipt"
            ).fetchall()
        assert _settled_by_receipts(receipts) >= 1 and seconds < 90, (receipts, seconds)
    finally:
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

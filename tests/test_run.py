"""`make run`'s preparation on a fresh machine: the embedded SQLite default, migrations, demo users."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def _manage(*args: str, var_dir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(DEBUG="1", RECOVERY_VAR_DIR=str(var_dir))
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


def test_the_database_rules_hold_on_sqlite_too(db):
    """CI runs the suite on PostgreSQL; the embedded default must enforce the same state table and audit rules."""
    if connection.vendor == "sqlite":
        pytest.skip("this run already executes every database test on SQLite")
    # PostgreSQL-only tests in these files already ran in this process: here they may skip.
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REQUIRE_SERVICES"}}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_states.py", "tests/test_audit.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout

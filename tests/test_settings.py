"""Settings from the environment: malformed values stop the process, and production mode passes `check --deploy`."""

from __future__ import annotations

import os
import secrets
import sqlite3
import string
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.utils import ConnectionHandler

from console.env import (
    database_from_env,
    env_bool,
    env_int,
    env_list,
    env_str,
    redis_url_from_env,
    sqlite_config,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
VAR = "RECOVERY_TEST_SETTING"  # a variable no real setting reads


# --- the strict readers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"), [("1", True), ("yes", True), (" On ", True), ("0", False), ("off", False)]
)
def test_it_reads_booleans(monkeypatch, raw, expected):
    monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR, not expected) is expected


def test_it_refuses_a_boolean_it_cannot_read(monkeypatch):
    monkeypatch.setenv(VAR, "maybe")
    with pytest.raises(ImproperlyConfigured, match=rf"{VAR}='maybe' is not a boolean"):
        env_bool(VAR, False)


def test_it_refuses_an_integer_it_cannot_read(monkeypatch):
    monkeypatch.setenv(VAR, "ten")
    with pytest.raises(ImproperlyConfigured, match=rf"{VAR}='ten' is not an integer"):
        env_int(VAR, 10)


def test_it_refuses_an_integer_below_its_minimum(monkeypatch):
    monkeypatch.setenv(VAR, "-1")
    with pytest.raises(ImproperlyConfigured, match=rf"{VAR}=-1 must be at least 0"):
        env_int(VAR, 10, minimum=0)
    monkeypatch.setenv(VAR, "0")
    assert env_int(VAR, 10, minimum=0) == 0


@pytest.mark.parametrize("raw", ["a,,b", "a,", ",a", " "])
def test_it_refuses_a_list_with_an_empty_item(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=rf"{VAR}=.* has an empty item"):
        env_list(VAR, ["default"])


def test_it_reads_a_list(monkeypatch):
    monkeypatch.setenv(VAR, "console.example.com, api.example.com")
    assert env_list(VAR, []) == ["console.example.com", "api.example.com"]


def test_it_returns_the_defaults_when_unset(monkeypatch, tmp_path):
    monkeypatch.delenv(VAR, raising=False)
    assert env_bool(VAR, True) is True
    assert env_bool(VAR, False) is False
    assert env_int(VAR, 7, minimum=0) == 7
    assert env_list(VAR, ["x"]) == ["x"]
    assert env_str(VAR, "fallback") == "fallback"
    assert redis_url_from_env(VAR) is None
    sqlite_file = tmp_path / "nested" / "db.sqlite3"
    assert database_from_env(VAR, sqlite_default=sqlite_file) == sqlite_config(sqlite_file)
    assert sqlite_file.parent.is_dir()  # the embedded database's directory is created on first use


def test_it_requires_a_string_without_a_default(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    with pytest.raises(ImproperlyConfigured, match=rf"{VAR} must be set"):
        env_str(VAR)


def test_it_refuses_an_unsupported_database(monkeypatch, tmp_path):
    monkeypatch.setenv(VAR, "mysql://root@127.0.0.1:3306/recovery")
    with pytest.raises(ImproperlyConfigured, match="only postgres:// and sqlite:/// URLs are supported"):
        database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3")


@pytest.mark.parametrize("url", ["postgres://postgres@127.0.0.1:5432", "postgres://postgres@127.0.0.1:5432/"])
def test_it_refuses_a_postgres_url_without_a_database_name(monkeypatch, tmp_path, url):
    monkeypatch.setenv(VAR, url)
    with pytest.raises(ImproperlyConfigured, match=rf"{VAR} must name a database"):
        database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3")


def test_it_reads_a_postgres_url(monkeypatch, tmp_path):
    monkeypatch.setenv(VAR, "postgresql://console:pw@db.internal:6543/recovery")
    config = database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3")
    assert config["ENGINE"] == "console.postgresql"  # Django's backend, its health check without a round trip
    assert (config["NAME"], config["USER"], config["HOST"], config["PORT"]) == (
        "recovery",
        "console",
        "db.internal",
        6543,
    )


def test_postgres_prepares_statements_unless_told_not_to(monkeypatch, tmp_path):
    monkeypatch.setenv(VAR, "postgres://console@db.internal:5432/recovery")
    monkeypatch.delenv("DATABASE_PREPARED_STATEMENTS", raising=False)
    options = database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3")["OPTIONS"]
    assert (options["server_side_binding"], options["prepare_threshold"]) == (True, 5)
    monkeypatch.setenv("DATABASE_PREPARED_STATEMENTS", "0")  # behind PgBouncer in transaction mode
    options = database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3").get("OPTIONS", {})
    assert "server_side_binding" not in options and "prepare_threshold" not in options


def test_behind_a_transaction_pooler_nothing_outlives_a_transaction(monkeypatch, tmp_path):
    monkeypatch.setenv(VAR, "postgres://console@pgbouncer.internal:6432/recovery")
    monkeypatch.delenv("DATABASE_PREPARED_STATEMENTS", raising=False)
    monkeypatch.setenv("DATABASE_TRANSACTION_POOLING", "1")
    config = database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3")
    assert config["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert "server_side_binding" not in config.get("OPTIONS", {})
    assert "prepare_threshold" not in config.get("OPTIONS", {})
    monkeypatch.setenv("DATABASE_TRANSACTION_POOLING", "0")
    assert not database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3").get("DISABLE_SERVER_SIDE_CURSORS")


def test_a_web_process_may_use_djangos_connection_pool(monkeypatch, tmp_path):
    monkeypatch.setenv(VAR, "postgres://console@db.internal:5432/recovery")
    monkeypatch.setenv("DATABASE_POOL", "1")
    monkeypatch.setenv("DATABASE_POOL_MAX", "12")
    config = database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3")
    assert config["CONN_MAX_AGE"] == 0  # Django refuses a pool beside persistent connections
    assert config["OPTIONS"]["pool"] == {"min_size": 2, "max_size": 12, "timeout": 10}
    monkeypatch.delenv("DATABASE_POOL")
    assert "pool" not in database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3").get("OPTIONS", {})


def test_it_reads_a_sqlite_url(monkeypatch, tmp_path):
    path = tmp_path / "elsewhere.sqlite3"
    monkeypatch.setenv(VAR, f"sqlite:///{path}")
    assert database_from_env(VAR, sqlite_default=tmp_path / "db.sqlite3") == sqlite_config(path)


def test_it_refuses_a_redis_url_that_is_not_redis(monkeypatch):
    monkeypatch.setenv(VAR, "http://127.0.0.1:6379/0")
    with pytest.raises(ImproperlyConfigured, match=rf"{VAR}='http://127.0.0.1:6379/0': use redis://"):
        redis_url_from_env(VAR)
    monkeypatch.setenv(VAR, "rediss://cache.internal:6380/1")
    assert redis_url_from_env(VAR) == "rediss://cache.internal:6380/1"


def test_it_opens_sqlite_in_wal_mode_with_immediate_transactions_and_a_busy_timeout(tmp_path, django_db_blocker):
    path = tmp_path / "wal.sqlite3"
    handler = ConnectionHandler({"default": sqlite_config(path)})
    connection = handler["default"]
    other = sqlite3.connect(path, timeout=0.05)  # a second writer that does not wait
    with django_db_blocker.unblock():
        try:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA journal_mode")
                assert cursor.fetchone()[0] == "wal"
                cursor.execute("PRAGMA busy_timeout")
                assert cursor.fetchone()[0] == 20_000  # ms: writers queue instead of failing with "locked"
                cursor.execute("CREATE TABLE item (n INTEGER)")
            # What transaction.atomic() does: the write lock is taken at BEGIN, before the transaction writes.
            connection.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("INSERT INTO item VALUES (1)")
            assert other.execute("SELECT count(*) FROM item").fetchone()[0] == 0  # WAL: readers are not blocked
            connection.rollback()
            connection.set_autocommit(True)
            other.execute("INSERT INTO item VALUES (1)")  # the lock went with the transaction
            other.commit()
        finally:
            other.close()
            handler.close_all()


# --- production mode, in a fresh process ---------------------------------------------------------------------------


def _production_env(tmp_path: Path, **overrides: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    alphabet = string.ascii_letters + string.digits + "!@#%^&*(-_=+)"
    env.update(
        DEBUG="0",
        SECRET_KEY="".join(secrets.choice(alphabet) for _ in range(60)),
        ALLOWED_HOSTS="console.example.com",
        RECOVERY_TOKEN_PEPPER=secrets.token_urlsafe(32),
        RECOVERY_AUDIT_KEYS=f"prod-1:{secrets.token_urlsafe(32)}",
        DJANGO_SETTINGS_MODULE="console.settings",
        RECOVERY_VAR_DIR=str(tmp_path / "var"),
    )
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_passes_the_deployment_checks_in_production_mode(tmp_path):
    result = _manage(_production_env(tmp_path), "check", "--deploy", "--fail-level", "WARNING")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "System check identified no issues" in output
    assert "WARNING" not in output.upper()
    assert "security.W" not in output
    assert (tmp_path / "var").is_dir()  # it used the temporary SQLite location, not the project's var/


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("SECRET_KEY", "SECRET_KEY must be set"),
        ("ALLOWED_HOSTS", "ALLOWED_HOSTS must be set when DEBUG is off"),
        ("RECOVERY_TOKEN_PEPPER", "RECOVERY_TOKEN_PEPPER must be set"),
        ("RECOVERY_AUDIT_KEYS", "RECOVERY_AUDIT_KEYS must be set: id:secret[,id:secret...] (the first one signs)"),
    ],
)
def test_it_refuses_to_start_in_production_without(tmp_path, missing, message):
    result = _manage(_production_env(tmp_path, **{missing: None}), "check")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


@pytest.mark.parametrize("key", ["short-key", "a" * 60])
def test_it_refuses_a_weak_secret_key_in_production(tmp_path, key):
    result = _manage(_production_env(tmp_path, SECRET_KEY=key), "check")
    assert result.returncode != 0
    assert "SECRET_KEY must be at least 50 characters with at least 5 distinct ones" in result.stderr


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("k1", "write id:secret pairs"),
        ("k 1:" + "s" * 40, "write id:secret pairs"),
        ("k1:short", "the secret of key 'k1' must be at least 32 characters"),
        (f"k1:{'s' * 40},k1:{'t' * 40}", "key 'k1' is given twice"),
    ],
)
def test_it_refuses_a_malformed_audit_keyring(tmp_path, keys, message):
    result = _manage(_production_env(tmp_path, RECOVERY_AUDIT_KEYS=keys), "check")
    assert result.returncode != 0 and message in result.stderr


def test_it_refuses_a_malformed_debug_flag(tmp_path):
    result = _manage(_production_env(tmp_path, DEBUG="maybe"), "check")
    assert result.returncode != 0
    assert "DEBUG='maybe' is not a boolean" in result.stderr


# --- the SLA per risk (RECOVERY_SLA_S) -----------------------------------------------------------------------------

RISKS = ("high", "low")
SLA_DEFAULT = {"high": 900, "low": 14_400}


def test_it_reads_an_sla_per_risk(monkeypatch):
    from console.env import env_seconds_by_key

    monkeypatch.setenv(VAR, " low = 7200 , high=600")
    assert env_seconds_by_key(VAR, SLA_DEFAULT, keys=RISKS) == {"low": 7200, "high": 600}
    monkeypatch.delenv(VAR)
    assert env_seconds_by_key(VAR, SLA_DEFAULT, keys=RISKS) == SLA_DEFAULT


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("high=900", "low missing"),
        ("high=900,low=14400,medium=3600", "'medium' is not one of high, low"),
        ("high=900,high=600,low=1", "'high' is given twice"),
        ("high=15m,low=14400", "high='15m' is not a whole number of seconds above 0"),
        ("high=0,low=14400", "high='0' is not a whole number of seconds above 0"),
        ("high=-5,low=14400", "high='-5' is not a whole number of seconds above 0"),
        ("high=²,low=14400", "high='²' is not a whole number of seconds above 0"),
        ("high 900,low=14400", "write key=seconds pairs separated by commas"),
        ("high=900,,low=14400", "write key=seconds pairs separated by commas"),
        ("", "write key=seconds pairs separated by commas"),
    ],
)
def test_it_refuses_an_sla_table_it_cannot_read(monkeypatch, raw, message):
    import re

    from console.env import env_seconds_by_key

    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        env_seconds_by_key(VAR, SLA_DEFAULT, keys=RISKS)


def test_the_sla_table_names_every_risk_a_call_can_have():
    from django.conf import settings

    from recovery.models import Risk

    assert set(settings.RECOVERY_SLA_S) == set(Risk.values)


def test_it_refuses_to_start_with_a_bad_sla_table(tmp_path):
    result = _manage(_production_env(tmp_path, RECOVERY_SLA_S="high=900,lwo=14400"), "check")
    assert result.returncode != 0
    assert "RECOVERY_SLA_S='high=900,lwo=14400': 'lwo' is not one of high, low" in result.stderr

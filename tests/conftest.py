"""Shared fixtures, and the rule for tests that need a real service.

A test that needs PostgreSQL (concurrency, locking, triggers under load) is marked `@pytest.mark.postgres`. When
the suite runs on the embedded SQLite it is skipped with the reason — unless REQUIRE_SERVICES=1, which turns every
such skip into a failure so CI can never go green by silently skipping.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

REQUIRE_SERVICES = os.environ.get("REQUIRE_SERVICES") == "1"


def missing_service(reason: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(f"REQUIRE_SERVICES=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_configure(config):
    config.addinivalue_line("markers", "postgres: needs PostgreSQL (DATABASE_URL=postgres://...)")


def pytest_runtest_setup(item):
    if item.get_closest_marker("postgres") and connection.vendor != "postgresql":
        missing_service("needs PostgreSQL: run with DATABASE_URL=postgres://user@host:5432/dbname")


PGBOUNCER = "RECOVERY_TEST_PGBOUNCER"  # 1: the run's database connections go through PgBouncer (transaction mode)
SERVER_SIDE_STATEMENTS = ("server_side_binding", "prepare_threshold")  # console/env.py's, off behind PgBouncer


@pytest.fixture(scope="session", autouse=True)
def through_pgbouncer(request):
    """With RECOVERY_TEST_PGBOUNCER=1 (CI runs the API, job, reconcile, action and drill modules so:
    docs/development.md, `make test-pgbouncer`), every connection of the run — this process's and every process it
    starts, which read database_url() — goes through a PgBouncer in transaction mode in front of the test database,
    with the settings docs/deploy.md gives: no prepared statements, no server-side cursors
    (DATABASE_TRANSACTION_POOLING=1). The test database itself is made and dropped on PostgreSQL directly (PgBouncer
    would keep server connections to it open)."""
    if os.environ.get(PGBOUNCER) != "1":
        yield None
        return
    import shutil
    import tempfile
    from pathlib import Path

    from django.db import connections

    from tests.servers import PgBouncer

    if connection.vendor != "postgresql":
        missing_service(f"{PGBOUNCER}=1 needs PostgreSQL: run with DATABASE_URL=postgres://...")
    if not Path(PgBouncer.BINARY).exists():
        missing_service("needs Debian's pgbouncer (apt-get install pgbouncer)")
    request.getfixturevalue("django_db_setup")
    config = connections["default"].settings_dict
    direct = {key: config.get(key) for key in ("HOST", "PORT", "DISABLE_SERVER_SIDE_CURSORS")}
    options = dict(config.get("OPTIONS") or {})
    workdir = Path(tempfile.mkdtemp(prefix="recovery-pgbouncer-"))  # PgBouncer runs as postgres: not under pytest's
    user = config.get("USER") or "postgres"
    try:
        with PgBouncer(direct["HOST"] or "127.0.0.1", int(direct["PORT"] or 5432), user=user, workdir=workdir) as pool:
            connections.close_all()
            config.update(HOST="127.0.0.1", PORT=pool.port, DISABLE_SERVER_SIDE_CURSORS=True)
            config["OPTIONS"] = {k: v for k, v in options.items() if k not in SERVER_SIDE_STATEMENTS}
            os.environ["DATABASE_TRANSACTION_POOLING"] = "1"
            try:
                yield pool
                served = pool.transactions(config["NAME"])
                assert served > 0, f"PgBouncer served no transaction of {config['NAME']}: the run went around it"
            finally:
                connections.close_all()
                config.update(direct)
                config["OPTIONS"] = options
                os.environ.pop("DATABASE_TRANSACTION_POOLING", None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


from tests.browser import *  # noqa: E402,F403  (the browser fixtures)
from tests.console import *  # noqa: E402,F403  (the console's people, and what its tests share)
from tests.factories import *  # noqa: E402,F403  (fixtures)
from tests.mcp import *  # noqa: E402,F403  (the MCP gateway's fixtures)
from tests.sandbox import *  # noqa: E402,F403  (the sandbox provider fixtures)

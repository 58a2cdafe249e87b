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


from tests.browser import *  # noqa: E402,F403  (the browser fixtures)
from tests.console import *  # noqa: E402,F403  (the console's people, and what its tests share)
from tests.factories import *  # noqa: E402,F403  (fixtures)
from tests.sandbox import *  # noqa: E402,F403  (the sandbox provider fixtures)

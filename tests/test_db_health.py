"""console/postgresql: the health check of a kept connection costs no round trip, and still finds a connection that
PostgreSQL ended while it sat idle."""

from __future__ import annotations

import time

import psycopg
import pytest
import requests
from django.db import connection

from recovery.audit.chain import Actor
from recovery.devtools.drills.stage import ApiProcesses
from recovery.services.tokens import token_create
from tests.test_hot_path import round_trips

pytestmark = pytest.mark.postgres


def _ended_by_the_server(pids: list[int]) -> None:
    """pg_terminate_backend on these server processes, from a connection of its own."""
    config = connection.settings_dict
    with psycopg.connect(
        host=config["HOST"], port=config["PORT"], user=config["USER"], dbname=config["NAME"], autocommit=True
    ) as other:
        for pid in pids:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.fixture
def checked():
    """This thread's connection with health checks on, as a web process's is, its request just begun."""
    connection.ensure_connection()
    enabled = connection.health_check_enabled
    connection.health_check_enabled, connection.health_check_done = True, False
    yield connection
    connection.health_check_enabled = enabled


@pytest.mark.django_db(transaction=True)
def test_a_kept_connection_is_checked_without_a_round_trip(checked):
    kept = checked.connection
    with round_trips() as trips:
        checked.close_if_health_check_failed()
    assert trips == [0] and checked.connection is kept


@pytest.mark.django_db(transaction=True)
def test_a_connection_postgresql_ended_is_closed_by_the_check_and_the_next_statement_reconnects(checked):
    ended = checked.connection
    _ended_by_the_server([ended.info.backend_pid])
    deadline = time.monotonic() + 10
    while not ended.closed and time.monotonic() < deadline and checked.is_usable():
        time.sleep(0.05)  # the server's goodbye is on its way to the socket
    checked.close_if_health_check_failed()
    assert checked.connection is None
    with checked.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


@pytest.mark.django_db(transaction=True)
def test_a_web_process_whose_connection_postgresql_ended_answers_the_next_request(registry, tmp_path):
    """What a runtime notices: after PostgreSQL ends the connections a web process keeps (a restart, an idle
    timeout), the next API request is answered, not failed with a 500."""
    _, raw = token_create(name="runtime", tenants=["acme"], actor=Actor.system("t"))
    api = ApiProcesses(workers=1, threads=1, log_dir=tmp_path).start()
    try:
        ask = lambda: requests.get(  # noqa: E731
            f"{api.url}/api/v1/calls/1", headers={"Authorization": f"Bearer {raw}"}, timeout=10
        )
        assert ask().status_code == 404  # the token read: the process now keeps a connection
        mine = connection.connection.info.backend_pid
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> %s", [mine])
            kept = [pid for (pid,) in cursor.fetchall()]
        assert kept, "the web process keeps no connection"
        _ended_by_the_server(kept)
        time.sleep(0.2)
        answers = [ask().status_code for _ in range(3)]
    finally:
        api.stop()
    assert answers == [404, 404, 404], api.log_path.read_text()[-3000:]

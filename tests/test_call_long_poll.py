"""GET /calls/{id}?version=V&wait_ms=N, the long poll an agent waits on (recovery.statemachine.watch): answered as soon
as the call has another version, or after the wait unchanged; bad parameters are field-level 422s; the word that a call
changed is sent when its transaction commits, never for a rolled-back one."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
import redis
import requests
from django.conf import settings
from django.db import connection, transaction
from recovery_client import RecoveryError

from recovery.audit.chain import Actor
from recovery.models import Call
from recovery.statemachine import watch as call_watch
from recovery.statemachine.transitions import transition_call
from tests import test_api
from tests.test_api import SENT, fail, new_call

pytestmark = pytest.mark.django_db(transaction=True)

TESTS = Actor.system("tests")
setup = test_api.setup  # the live API with the registry and a runtime's client of two tenants
TIMED_OUT = SENT | {"error": {"kind": "read_timeout", "message": "no reply"}}


@pytest.fixture
def unknown(setup):
    """A refund whose reply was lost: UNKNOWN, and its version as the runtime last saw it."""
    client = setup["client"]
    _, call = new_call(client)
    assert fail(client, call.call_id, TIMED_OUT).call_state == "UNKNOWN"
    detail = client.get_call(call.call_id)
    yield {"client": client, "call_id": call.call_id, "version": detail["version"], "url": setup["url"]}
    for runtime in (client, setup["other"]):  # the live server's threads hold a database connection per open socket
        runtime.session.close()


def _settle_later(call_id: int, after_s: float) -> threading.Thread:
    def settle() -> None:
        time.sleep(after_s)
        try:
            transition_call(Call.objects.get(pk=call_id), "COMMITTED", actor=TESTS, reason="a receipt proved it")
        finally:
            connection.close()  # this thread's own connection, or the test database could not be dropped

    thread = threading.Thread(target=settle)
    thread.start()
    return thread


def test_a_long_poll_is_answered_when_the_call_moves_not_at_the_end_of_its_wait(unknown):
    settler = _settle_later(unknown["call_id"], 0.3)
    started = time.monotonic()
    detail = unknown["client"].get_call(unknown["call_id"], version=unknown["version"], wait_ms=15_000)
    waited = time.monotonic() - started
    settler.join()
    assert (detail["state"], detail["version"]) == ("COMMITTED", unknown["version"] + 1)
    assert 0.3 <= waited < 15  # it waited for the change, and answered with it rather than after the 15 s


def test_an_unchanged_call_is_answered_as_it_is_when_the_wait_is_over(unknown):
    started = time.monotonic()
    detail = unknown["client"].get_call(unknown["call_id"], version=unknown["version"], wait_ms=400)
    assert time.monotonic() - started >= 0.4
    assert (detail["state"], detail["version"]) == ("UNKNOWN", unknown["version"])


def test_a_version_already_behind_is_answered_at_once_with_the_call_as_it_is(unknown):
    transition_call(Call.objects.get(pk=unknown["call_id"]), "COMMITTED", actor=TESTS, reason="settled")
    detail = unknown["client"].get_call(unknown["call_id"], version=unknown["version"], wait_ms=20_000)
    assert (detail["state"], detail["version"]) == ("COMMITTED", unknown["version"] + 1)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"wait_ms": 500}, "version"),  # a wait needs the version it waits to change from
        ({"version": 1, "wait_ms": 20_001}, "wait_ms"),  # at most 20 s: a request holds a web thread
        ({"version": 1, "wait_ms": -1}, "wait_ms"),
        ({"version": 1, "wait_ms": "soon"}, "wait_ms"),
        ({"version": -1, "wait_ms": 500}, "version"),
        ({"version": "latest", "wait_ms": 500}, "version"),
    ],
)
def test_bad_long_poll_parameters_are_field_level_errors_answered_at_once(unknown, params, field):
    token = unknown["client"].session.headers["Authorization"]
    started = time.monotonic()
    response = requests.get(
        f"{unknown['url']}/api/v1/calls/{unknown['call_id']}",
        params=params,
        headers={"Authorization": token},
        timeout=5,
    )
    assert time.monotonic() - started < 5
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (422, "invalid_request")
    assert [e["field"] for e in error["field_errors"]] == [field], error
    assert Call.objects.get(pk=unknown["call_id"]).version == unknown["version"]


def test_another_tenants_call_is_not_found_without_waiting(setup, unknown):
    with pytest.raises(RecoveryError) as refused:
        setup["other"].get_call(unknown["call_id"], version=unknown["version"], wait_ms=20_000)
    assert refused.value.status == 404


def test_the_word_that_a_call_changed_goes_out_on_commit_only(rq_queue, unknown):
    """With REDIS_URL every web process hears it: a PUBLISH on the call's channel once the transaction commits."""
    listener = redis.Redis.from_url(settings.REDIS_URL)  # the test's own Redis database (rq_queue)
    pubsub = listener.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(call_watch.CHANNEL.format(unknown["call_id"]))
    call = Call.objects.get(pk=unknown["call_id"])

    class RolledBack(Exception):
        pass

    with pytest.raises(RolledBack), transaction.atomic():
        transition_call(call, "COMMITTED", actor=TESTS, reason="undone with its transaction")
        raise RolledBack
    assert pubsub.get_message(timeout=0.5) is None

    transition_call(Call.objects.get(pk=unknown["call_id"]), "COMMITTED", actor=TESTS, reason="a receipt proved it")
    message = pubsub.get_message(timeout=5)
    assert message is not None and message["channel"].decode() == call_watch.CHANNEL.format(unknown["call_id"])
    pubsub.close()


def test_a_change_is_not_held_up_by_a_redis_that_does_not_answer(settings, unknown, caplog):
    """The word goes out from the process's publishing thread, not from the request that committed the change: a
    Redis that takes the connection and never answers leaves the transition untouched. Its PUBLISH fails there
    later (its timeout), which the log says; waiters then re-read on their own."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        settings.REDIS_URL = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        call = Call.objects.get(pk=unknown["call_id"])
        try:
            with caplog.at_level(logging.WARNING, logger="recovery.call_watch"):
                transition_call(call, "COMMITTED", actor=TESTS, reason="a receipt proved it")
                assert "did not take the word" not in caplog.text  # the transition did not wait for Redis
                # flush() (what a work horse runs before it ends) waits for the thread's PUBLISH: here, its failure.
                call_watch.flush(timeout_s=10)
            assert f"calls {call.pk} changed, but Redis did not take the word" in caplog.text
        finally:
            call_watch._state["paused_until"] = 0.0  # the next tests' words go out at once
    assert Call.objects.get(pk=call.pk).state == "COMMITTED"

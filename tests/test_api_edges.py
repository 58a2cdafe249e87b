"""The API at its edges (docs/api.md), each case something a hostile tester or a bad network did to it: one JSON error
envelope for every answer (5xx included, with the request id the log line carries), strict types and canonical ids,
a truncated body refused, the seeds' two answers, and a client that survives its reply being dropped after the
server committed. Servers are real (Django's live server, gunicorn) and so is the network in between (a TCP proxy
that cuts connections or drops replies)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
import requests
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings
from django.urls import path
from recovery_client import ApiRetry, RecoveryClient, RecoveryError

from recovery.api.errors import RETRY_AFTER_S
from recovery.audit.chain import Actor
from recovery.devtools.drills.stage import database_url
from recovery.models import Attempt, AuditEvent, Call, Decision, GateDecision, Receipt, Step, Task
from recovery.registry import load_registry
from recovery.services.tokens import token_create
from tests.servers import TcpProxy, WebServer, production_env
from tests.test_api import ORDER, REGISTRY, SENT, new_call

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(live_server):
    load_registry(REGISTRY, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["acme"], actor=Actor.system("tests"))
    return {"url": live_server.url, "token": token, "client": RecoveryClient(live_server.url, token)}


def _post(world, path: str, body: str | dict, **headers) -> requests.Response:
    kwargs = {"data": body.encode()} if isinstance(body, str) else {"json": body}
    headers = {"Authorization": f"Bearer {world['token']}", "Content-Type": "application/json", **headers}
    return requests.post(f"{world['url']}/api/v1{path}", headers=headers, timeout=10, **kwargs)


def _stored() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Task, Step, Call, Attempt, GateDecision, Decision, Receipt, AuditEvent))


def _envelope(response: requests.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text[:500]
    assert response.headers["Content-Type"].startswith("application/json"), response.text[:300]
    error = response.json()["error"]
    assert (error["code"], set(error)) == (code, {"code", "message", "field_errors", "detail"}), error
    assert len(response.headers["X-Request-Id"]) == 32
    return error


# --- one envelope for every answer ----------------------------------------------------------------------------------


def _boom(request):
    raise RuntimeError("a bug outside the API's handlers")


urlpatterns = [path("api/v1/boom", _boom), *__import__("console.urls", fromlist=["urlpatterns"]).urlpatterns]


@pytest.mark.parametrize("debug", [False, True])
def test_an_exception_outside_the_api_handlers_is_the_json_envelope_with_a_logged_request_id(
    world, settings, caplog, debug
):
    # An exception Django handles (here a view that is not the API's; before, a middleware's or a database
    # connection's) answered Django's HTML 500 page, or with DEBUG on its technical page.
    settings.DEBUG = debug
    with override_settings(ROOT_URLCONF=__name__), caplog.at_level(logging.ERROR, logger="recovery.api"):
        answer = requests.get(f"{world['url']}/api/v1/boom", timeout=10)
    error = _envelope(answer, 500, "internal_error")
    rid = answer.headers["X-Request-Id"]
    assert error["detail"] == {"request_id": rid} and "RuntimeError" not in answer.text
    logged = [r for r in caplog.records if r.name == "recovery.api" and rid in r.getMessage()]
    assert logged and logged[0].exc_info[0] is RuntimeError  # the log line carries the same id, and the traceback


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/no-such-route", 404, "not_found"),
        ("GET", "/tasks/", 404, "not_found"),  # a trailing slash matches nothing (no HTML redirect page either)
        ("DELETE", "/tasks", 405, "method_not_allowed"),
    ],
)
def test_what_no_route_answers_is_the_json_envelope_too(world, method, path, status, code):
    answer = requests.request(method, f"{world['url']}/api/v1{path}", timeout=10)
    _envelope(answer, status, code)


# --- strict input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"step": True}, "step"),  # a boolean made a call on step 1
        ({"step": "1"}, "step"),  # a string was read as a number
        ({"step": 1.0}, "step"),
        ({"depends_on": [True]}, "depends_on.0"),
        ({"idempotency_key": 7}, "idempotency_key"),
        ({"arguments": "{}"}, "arguments"),
    ],
)
def test_a_call_with_a_field_of_the_wrong_json_type_is_refused_and_nothing_is_stored(world, body, field):
    task = world["client"].create_task("acme", "strict", agent="a", goal="g")
    before = _stored()
    call = {"step": 2, "tool": "order.lookup", "arguments": ORDER, "idempotency_key": "strict-1"} | body
    error = _envelope(_post(world, f"/tasks/{task.id}/calls", call), 422, "invalid_request")
    assert [e["field"] for e in error["field_errors"]] == [field]
    assert _stored() == before


@pytest.mark.parametrize(
    ("budget", "field"),
    [
        ({"max_rounds": "5"}, "budget.max_rounds"),
        ({"max_rounds": True}, "budget.max_rounds"),
        ({"deadline": 1_900_000_000}, "budget.deadline"),  # seconds since 1970 are not a time in this API
        ({"deadline": "2030-01-01T00:00:00"}, "budget.deadline"),  # no UTC offset
    ],
)
def test_a_budget_with_a_loose_value_is_refused(world, budget, field):
    before = _stored()
    body = {"tenant": "acme", "external_id": "loose", "agent": "a", "goal": "g", "budget": budget}
    error = _envelope(_post(world, "/tasks", body), 422, "invalid_request")
    assert [e["field"] for e in error["field_errors"]] == [field]
    assert _stored() == before


def test_outcome_facts_take_booleans_and_numbers_only_as_such(world):
    _, call = new_call(world["client"])
    world["client"].admit(call.call_id, "a1")
    before = _stored()
    for facts, field in [
        ({"http_status": "200"}, "http_status"),
        ({"http_status": 200, "sent": 1}, "sent"),
        ({"http_status": 200, "tokens_used": "12"}, "tokens_used"),
        ({"http_status": 200, "started_at": 1_900_000_000}, "started_at"),
    ]:
        error = _envelope(_post(world, f"/calls/{call.call_id}/attempts/a1/outcome", facts), 422, "invalid_request")
        assert field in [e["field"] for e in error["field_errors"]]
    assert _stored() == before
    assert world["client"].report(call.call_id, "a1", SENT | {"http_status": 200, "result": {"refund_id": "r"}})


@pytest.mark.parametrize("spelling", ["{id}_0", "{id}.0", "+{id}", "%20{id}%20", "0{id}", "{id}%00", "1" * 19])
def test_an_id_in_a_url_is_canonical_decimal_or_matches_nothing(world, spelling):
    # /tasks/1_3, /tasks/13.0, /tasks/+13 and /tasks/%2013%20 all answered task 13.
    task = world["client"].create_task("acme", "ids", agent="a", goal="g")
    headers = {"Authorization": f"Bearer {world['token']}"}
    assert requests.get(f"{world['url']}/api/v1/tasks/{task.id}", headers=headers, timeout=10).status_code == 200
    answer = requests.get(f"{world['url']}/api/v1/tasks/{spelling.format(id=task.id)}", headers=headers, timeout=10)
    _envelope(answer, 404, "not_found")


def _raw_exchange(url: str, head: bytes, body: bytes, *, half_close: bool) -> bytes:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)  # the client gives up sending: the server reads end-of-stream early
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_body_shorter_than_its_content_length_is_refused_and_nothing_is_stored(world):
    # 80 bytes of valid JSON under "Content-Length: 580", then a half-close: a 201, the task stored.
    body = b'{"tenant": "acme", "external_id": "short", "agent": "a", "goal": "g"}'
    head = (
        f"POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {world['token']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body) + 500}\r\nConnection: close\r\n\r\n"
    ).encode()
    before = _stored()
    reply = _raw_exchange(world["url"], head, body, half_close=True)
    status_line, _, rest = reply.partition(b"\r\n")
    assert b" 400 " in status_line, reply[:400]
    assert b'"incomplete_body"' in rest and f'"received": {len(body)}'.encode() in rest
    assert _stored() == before
    whole = head.replace(f"{len(body) + 500}".encode(), str(len(body)).encode())
    assert b" 201 " in _raw_exchange(world["url"], whole, body, half_close=False).partition(b"\r\n")[0]


# --- the seeds' two answers -----------------------------------------------------------------------------------------


def test_an_added_call_whose_arguments_fail_preflight_carries_the_failure_object(world):
    # Seed 001's first example: amount_cents "800.0" answered preflight.passed false, with no failure object.
    task = world["client"].create_task("acme", "seed-1", agent="a", goal="g")
    added = world["client"].add_call(
        task.id,
        step=1,
        tool="refund.create",
        arguments={"order_id": "O-1", "amount_cents": "800.0"},
        idempotency_key="seed-1",
    )
    failure = added.raw["failure"]
    assert (failure["class"], failure["phase"], failure["stage"]) == ("invalid_arguments", "preflight", "before_send")
    assert (failure["retryable"], failure["tool"], failure["call_id"]) == (False, "refund.create", str(added.call_id))
    assert failure["public_message"] == "amount_cents must be a positive integer in cents."  # the seed's words
    assert (
        [e["field"] for e in failure["field_errors"]]
        == ["amount_cents"]
        == [e["field"] for e in added.preflight["field_errors"]]
    )
    assert added.raw["required_next"] == {
        "action": "repair_args",
        "after_ms": 0,
        "poll": "",
        "detail": {"field_errors": [{k: failure["field_errors"][0][k] for k in ("field", "expected", "suggestion")}]},
    }
    clean = world["client"].add_call(task.id, step=2, tool="order.lookup", arguments=ORDER, idempotency_key="seed-2")
    assert (clean.raw["failure"], clean.raw["required_next"], clean.preflight["passed"]) == (None, None, True)


def test_a_403_no_approval_can_grant_stops_instead_of_inviting_a_replan(world):
    _, call = new_call(world["client"], tool="order.lookup")
    world["client"].admit(call.call_id, "a1")
    answer = world["client"].report(call.call_id, "a1", SENT | {"http_status": 403, "error": {"code": "forbidden"}})
    assert answer.call_state == "FAILED_PERMANENT"
    assert (answer.decision["route"], answer.required_next["action"]) == ("stop", "stop")
    assert "replan" not in answer.decision["next"]


# --- a reply lost after the server committed ------------------------------------------------------------------------


@pytest.fixture
def lossy(world):
    """The client talks to the live server through a proxy that can drop the server's replies."""
    host, port = urlsplit(world["url"]).hostname, urlsplit(world["url"]).port
    with TcpProxy(host, port) as proxy:
        client = RecoveryClient(f"http://127.0.0.1:{proxy.port}", world["token"], retry=ApiRetry(base_s=0.05))
        yield proxy, client


def _dropped(proxy: TcpProxy, action):
    """Run `action` with the next reply dropped; the client must resend and end with the server's answer."""
    proxy.drop_replies(1)
    answer = action()
    assert proxy.dropped >= 1  # the reply really was lost once
    proxy.dropped = 0
    return answer


def test_every_write_survives_its_reply_being_dropped_after_the_commit(lossy):
    proxy, client = lossy
    task = _dropped(proxy, lambda: client.create_task("acme", "lossy", agent="a", goal="g"))
    assert Task.objects.filter(external_id="lossy").count() == 1 and task.status == "open"

    def add(key: str, tool: str = "refund.create"):  # one intent per key: its own amount
        arguments = ORDER | {"amount_cents": 100 + int(key.rsplit("-", 1)[1])}
        return client.add_call(task.id, step=1, tool=tool, arguments=arguments, idempotency_key=key)

    call = _dropped(proxy, lambda: add("lossy-1"))
    assert Call.objects.filter(idempotency_key="lossy-1").count() == 1 and call.state == "READY"

    admission = _dropped(proxy, lambda: client.admit(call.call_id, "a1"))
    assert (admission.call_state, Attempt.objects.filter(call_id=call.call_id).count()) == ("SENT", 1)

    committed = SENT | {"http_status": 200, "result": {"refund_id": "r-1"}}
    answer = _dropped(proxy, lambda: client.report(call.call_id, "a1", committed))
    assert answer.call_state == "COMMITTED" and Receipt.objects.filter(call_id=call.call_id).count() == 1

    lookup = add("lossy-2", tool="order.lookup")
    shot = _dropped(
        proxy, lambda: client.single_shot(lookup.call_id, "s1", SENT | {"http_status": 200, "result": {"status": "x"}})
    )
    assert shot.call_state == "COMMITTED" and Attempt.objects.filter(call_id=lookup.call_id).count() == 1

    unknown = add("lossy-3")
    client.admit(unknown.call_id, "a1")
    client.report(unknown.call_id, "a1", SENT | {"http_status": 504})
    check = _dropped(proxy, lambda: client.reconcile(unknown.call_id))
    assert check["call_state"] in ("UNKNOWN", "STILL_UNKNOWN") and check["poll"] == f"/api/v1/calls/{unknown.call_id}"

    doomed = add("lossy-4")
    abandoned = _dropped(proxy, lambda: client.abandon_call(doomed.call_id, "not needed"))
    assert abandoned["state"] == "FAILED_PERMANENT"
    assert AuditEvent.objects.filter(call_id=doomed.call_id, action="call.transition").count() == 1

    done = _dropped(proxy, lambda: client.complete_task(task.id, "refunded", deliverable={"refund": "r-1"}))
    assert done.status == "submitted"
    assert AuditEvent.objects.filter(task_id=task.id, action="task.submitted").count() == 1

    other = client.create_task("acme", "lossy-abandon", agent="a", goal="g")
    gone = _dropped(proxy, lambda: client.abandon_task(other.id, "changed plans"))
    assert gone.status == "abandoned"
    assert AuditEvent.objects.filter(task_id=other.id, action="task.abandoned").count() == 1


def test_a_repeated_complete_or_abandon_answers_the_stored_result_and_a_different_one_conflicts(world):
    client = world["client"]
    task = client.create_task("acme", "repeat", agent="a", goal="g")
    first = client.complete_task(task.id, "done", deliverable={"n": 1})
    assert client.complete_task(task.id, "done", deliverable={"n": 1}).raw == first.raw
    with pytest.raises(RecoveryError) as other:
        client.complete_task(task.id, "done", deliverable={"n": 2})  # another submission is not a repeat
    assert (other.value.status, other.value.code) == (409, "task_closed")

    _, call = new_call(client)
    abandoned = client.abandon_call(call.call_id, "no")
    assert client.abandon_call(call.call_id, "no") == abandoned
    assert AuditEvent.objects.filter(call_id=call.call_id, action="call.transition").count() == 1


# --- the database goes away -----------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_while_the_database_is_unreachable_the_api_answers_503_with_retry_after_and_stores_nothing(tmp_path):
    load_registry(REGISTRY, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["acme"], actor=Actor.system("tests"))
    db = connection.settings_dict
    with TcpProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)) as proxy:
        url = database_url().replace(f":{db['PORT'] or 5432}/", f":{proxy.port}/").replace("localhost", "127.0.0.1")
        assert str(proxy.port) in url
        pepper = django_settings.RECOVERY_TOKEN_PEPPER  # the tokens made here must authenticate there
        env = production_env(DATABASE_URL=url, RECOVERY_TOKEN_PEPPER=pepper, DATABASE_PREPARED_STATEMENTS="0")
        with WebServer(env, log_path=tmp_path / "gunicorn.log") as web:
            once = RecoveryClient(web.url, token, retry=ApiRetry(attempts=1))
            task = once.create_task("acme", "db-1", agent="a", goal="g")
            call = once.add_call(task.id, step=1, tool="refund.create", arguments=ORDER, idempotency_key="db-k1")
            once.admit(call.call_id, "a1")
            before = _stored()

            proxy.cut()  # PostgreSQL is gone for the web process: its pooled connection and every new one
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            for path, body in [
                ("/tasks", {"tenant": "acme", "external_id": "db-2", "agent": "a", "goal": "g"}),
                (f"/tasks/{task.id}/calls", {"step": 2, "tool": "order.lookup", "arguments": ORDER,
                                             "idempotency_key": "db-k2"}),
                (f"/calls/{call.call_id}/attempts/a1/outcome", SENT | {"http_status": 504}),
            ]:  # fmt: skip
                answer = requests.post(f"{web.url}/api/v1{path}", json=body, headers=headers, timeout=20)
                error = _envelope(answer, 503, "database_unavailable")
                assert answer.headers["Retry-After"] == str(RETRY_AFTER_S)
                assert error["detail"]["request_id"] == answer.headers["X-Request-Id"]
                assert f"database_unavailable request_id={answer.headers['X-Request-Id']}" in web.log()
            proxy.restore()
            assert _stored() == before  # nothing was stored while it was away

            # The client resends after a 503 with Retry-After: a cut shorter than its retries is invisible to it.
            proxy.cut()
            threading.Timer(1.0, proxy.restore).start()
            started = time.monotonic()
            again = RecoveryClient(web.url, token).create_task("acme", "db-3", agent="a", goal="g")
            assert again.status == "open" and time.monotonic() - started >= 1.0
            assert Task.objects.filter(external_id="db-3").count() == 1
            assert once.report(call.call_id, "a1", SENT | {"http_status": 504}).call_state == "UNKNOWN"

"""The machine API end to end: a real HTTP server (Django's live server) driven by recovery_client."""

from __future__ import annotations

import copy
import time

import pytest
import requests
from recovery_client import NotAdmitted, RecoveryClient, RecoveryError

from recovery.audit.chain import Actor
from recovery.models import Attempt, Call, Diagnostic, GateDecision, Task
from recovery.registry import load_registry
from recovery.services.tokens import token_create

pytestmark = pytest.mark.django_db(transaction=True)

STATUS = {"method": "GET", "path": "/status/{idempotency_key}", "status_map": {"ok": "committed"}}
ARGS = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount_cents": {"type": "integer", "minimum": 1, "x-unit": "cents"},
    },
    "required": ["order_id"],
    "additionalProperties": False,
}
REGISTRY = {
    "tenants": [{"name": "acme", "tools": "*"}, {"name": "other", "tools": ["order.lookup"]}],
    "providers": [{"name": "shop", "base_url": "http://127.0.0.1:9"}],
    "tools": [
        {
            "name": "refund.create",
            "provider": "shop",
            "side_effect": "write",
            "risk": "high",
            "request": {"method": "POST", "path": "/refunds"},
            "args_schema": ARGS,
            "provider_ref_field": "refund_id",
            "required_result_fields": ["refund_id"],
            "approvable_codes": ["needs_approval"],
            "status_query": STATUS,
            "budgets": {"max_attempts": 3},
            "backoff": {"base_ms": 50, "cap_ms": 100},
        },
        {
            "name": "order.lookup",
            "provider": "shop",
            "side_effect": "read",
            "request": {"method": "GET", "path": "/orders"},
            "args_schema": ARGS,
            "required_result_fields": ["status"],
            "alternates": ["order.lookup_replica"],
            "budgets": {"max_attempts": 3},
            "backoff": {"base_ms": 500, "cap_ms": 1000},
        },
        {
            "name": "order.lookup_replica",
            "provider": "shop",
            "side_effect": "read",
            "request": {"method": "GET", "path": "/orders"},
            "args_schema": ARGS,
            "required_result_fields": ["status"],
            "backoff": {"base_ms": 50, "cap_ms": 100},
        },
    ],
}
ORDER = {"order_id": "O-1", "amount_cents": 800}
SENT = {"connection_opened": True, "sent": True}


@pytest.fixture
def setup(live_server):
    load_registry(REGISTRY, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["acme"], actor=Actor.system("tests"))
    _, other = token_create(name="other-runtime", tenants=["other"], actor=Actor.system("tests"))
    return {
        "client": RecoveryClient(live_server.url, token),
        "other": RecoveryClient(live_server.url, other),
        "url": live_server.url,
        "token": token,
    }


@pytest.fixture
def client(setup) -> RecoveryClient:
    return setup["client"]


_n = iter(range(1, 10_000))


def new_call(client, tool="refund.create", args=None, task=None, **kw):
    task = task or client.create_task("acme", f"t-{next(_n)}", agent="tests", goal="g")
    call = client.add_call(
        task.id, step=kw.pop("step", 1), tool=tool, arguments=args or ORDER, idempotency_key=f"k-{next(_n)}", **kw
    )
    return task, call


def fail(client, call_id, facts, attempt_id="a1", **admit):
    client.admit(call_id, attempt_id, **admit)
    return client.report(call_id, attempt_id, facts)


def test_it_commits_a_write_and_completes_the_task(client):
    task, call = new_call(client)
    assert (call.created, call.state, call.preflight["passed"]) == (True, "READY", True)
    admission = client.admit(call.call_id, "a1")
    assert (admission.attempt_number, admission.call_state, admission.gate["reason"]) == (1, "SENT", "first_attempt")
    answer = client.report(call.call_id, "a1", SENT | {"http_status": 200, "result": {"refund_id": "r-1"}})
    assert (answer.call_state, answer.decision, answer.failure) == ("COMMITTED", None, None)
    detail = client.get_call(call.call_id)
    assert detail["provider_ref"] == "r-1" and detail["receipts"][0]["source"] == "runtime"
    done = client.complete_task(task.id, "refunded order O-1")
    assert (done.status, done.outcome) == ("submitted", "completed")
    assert [c["call_id"] for c in done.raw["done"]] == [call.call_id]


ROWS = [
    (
        "row 1 client exception",
        {"connection_opened": False, "sent": False, "error": {"kind": "client_exception"}},
        "FAILED_PERMANENT",
        "FAILED_PERMANENT",
    ),
    (
        "row 2 refused",
        {"connection_opened": False, "sent": False, "error": {"kind": "connection_refused"}},
        "RETRYABLE",
        "RETRYABLE",
    ),
    ("row 3 429", SENT | {"http_status": 429, "retry_after_ms": 100}, "RETRYABLE", "RETRYABLE"),
    ("row 3 503", SENT | {"http_status": 503}, "RETRYABLE", "RETRYABLE"),
    ("row 4 422", SENT | {"http_status": 422}, "RETRYABLE", "RETRYABLE"),
    ("row 4b 409", SENT | {"http_status": 409}, "RETRYABLE", "UNKNOWN"),
    ("row 5 401", SENT | {"http_status": 401}, "RETRYABLE", "RETRYABLE"),
    (
        "row 6 403 approvable",
        SENT | {"http_status": 403, "error": {"code": "needs_approval"}},
        "FAILED_PERMANENT",
        "HUMAN_REVIEW",
    ),  # only the refund's registry entry lists needs_approval
    ("row 6 403", SENT | {"http_status": 403, "error": {"code": "forbidden"}}, "FAILED_PERMANENT", "FAILED_PERMANENT"),
    ("row 7 418", SENT | {"http_status": 418}, "FAILED_PERMANENT", "FAILED_PERMANENT"),
    ("row 8 500", SENT | {"http_status": 500}, "RETRYABLE", "UNKNOWN"),
    ("row 8 read timeout", SENT | {"error": {"kind": "read_timeout"}}, "RETRYABLE", "UNKNOWN"),
    ("row 9 202", SENT | {"http_status": 202, "provider_request_id": "p-9"}, "RETRYABLE", "ACCEPTED"),  # a read's 202
    # is a 2xx whose (missing) result fails validation
    (
        "row 10 200",
        SENT | {"http_status": 200, "provider_request_id": "p-1", "result": {"refund_id": "r-1", "status": "ok"}},
        "COMMITTED",
        "COMMITTED",
    ),
    (
        "row 11 invalid",
        SENT | {"http_status": 200, "provider_request_id": "p-1", "result": {"x": 1}},
        "RETRYABLE",
        "UNKNOWN",
    ),
    (
        "hard stop: 2xx write without reference",
        SENT | {"http_status": 200, "result": {"status": "ok"}},
        "COMMITTED",
        "HUMAN_REVIEW",
    ),
]


@pytest.mark.parametrize(("name", "facts", "read_state", "write_state"), ROWS, ids=[r[0] for r in ROWS])
def test_every_row_of_the_table_through_http(client, name, facts, read_state, write_state):
    _, read = new_call(client, tool="order.lookup")
    assert fail(client, read.call_id, facts).call_state == read_state
    _, write = new_call(client)
    answer = fail(client, write.call_id, facts)
    assert answer.call_state == write_state
    if answer.decision:
        assert answer.decision["call_state"] == write_state
        assert answer.decision["required_next"]["action"]


def test_a_timeout_after_send_forbids_an_identical_attempt(client):
    _, call = new_call(client)
    answer = fail(client, call.call_id, SENT | {"error": {"kind": "read_timeout"}})
    assert answer.decision["route"] == "reconcile" and "blind_replay" in answer.decision["forbidden"]
    with pytest.raises(NotAdmitted) as denied:
        client.admit(call.call_id, "a2", evidence=("time_elapsed",))
    assert denied.value.required_next["action"] == "wait_for_reconcile"
    assert GateDecision.objects.filter(call_id=call.call_id, allowed=False).count() == 1
    assert Call.objects.get(pk=call.call_id).state == "UNKNOWN"


def test_time_elapsed_admits_only_after_the_backoff_by_the_servers_clock(client):
    _, call = new_call(client, tool="order.lookup")
    answer = fail(client, call.call_id, SENT | {"http_status": 503})
    with pytest.raises(NotAdmitted) as early:
        client.admit(call.call_id, "a2", evidence=("time_elapsed",))
    assert early.value.gate["reason"] == "no_new_evidence"
    time.sleep(answer.decision["delay_ms"] / 1000 + 0.05)
    assert client.admit(call.call_id, "a2", evidence=("time_elapsed",)).gate["evidence_used"] == "time_elapsed"


def test_args_changed_admits_a_repaired_call_under_the_same_key(client):
    _, call = new_call(client)
    fail(client, call.call_id, SENT | {"http_status": 422})
    with pytest.raises(NotAdmitted):
        client.admit(call.call_id, "a2", evidence=("args_changed",))  # same arguments: no change
    repaired = {"order_id": "O-1", "amount_cents": 700}
    admission = client.admit(call.call_id, "a2", arguments=repaired, evidence=("args_changed",))
    assert admission.gate["evidence_used"] == "args_changed"
    assert Attempt.objects.get(call_id=call.call_id, attempt_id="a2").arguments == repaired


def test_credential_refreshed_needs_a_newer_credential(client):
    _, call = new_call(client, tool="order.lookup")
    fail(client, call.call_id, SENT | {"http_status": 401}, credential_version=1)
    with pytest.raises(NotAdmitted):
        client.admit(call.call_id, "a2", credential_version=1, evidence=("credential_refreshed",))
    admission = client.admit(call.call_id, "a2", credential_version=2, evidence=("credential_refreshed",))
    assert admission.gate["evidence_used"] == "credential_refreshed"


def test_tool_changed_admits_only_an_accepted_alternate(client):
    _, call = new_call(client, tool="order.lookup")
    fail(client, call.call_id, SENT | {"http_status": 503})
    with pytest.raises(RecoveryError):
        client.admit(call.call_id, "a2", tool="refund.create", evidence=("tool_changed",))
    admission = client.admit(call.call_id, "a2", tool="order.lookup_replica", evidence=("tool_changed",))
    assert admission.gate["evidence_used"] == "tool_changed"
    answer = client.report(call.call_id, "a2", SENT | {"http_status": 200, "result": {"status": "shipped"}})
    assert answer.call_state == "COMMITTED"


def test_the_gate_answers_without_acting_and_stores_the_answer(client):
    _, call = new_call(client)
    answer = client.ask_gate(call.call_id, "a1")
    assert answer["allowed"] and answer["reason"] == "first_attempt"
    assert Call.objects.get(pk=call.call_id).state == "READY"
    assert GateDecision.objects.get(call_id=call.call_id).dry_run


def test_a_duplicate_intent_under_a_new_key_is_refused(client):
    task, call = new_call(client)
    with pytest.raises(RecoveryError) as refused:
        client.add_call(task.id, step=2, tool="refund.create", arguments=dict(ORDER), idempotency_key="fresh-key")
    assert (refused.value.status, refused.value.code) == (409, "duplicate_intent")
    assert refused.value.detail["existing_call"] == call.call_id


def test_adding_a_call_is_idempotent_by_key(client):
    task, call = new_call(client)
    key = Call.objects.get(pk=call.call_id).idempotency_key
    again = client.add_call(task.id, step=1, tool="refund.create", arguments=ORDER, idempotency_key=key)
    assert (again.call_id, again.created) == (call.call_id, False)
    with pytest.raises(RecoveryError) as conflict:
        client.add_call(
            task.id, step=1, tool="refund.create", arguments=ORDER | {"amount_cents": 1}, idempotency_key=key
        )
    assert (conflict.value.status, conflict.value.code) == (422, "idempotency_conflict")
    assert Call.objects.filter(task_id=task.id).count() == 1


def test_an_attempt_posted_twice_is_stored_once(client, setup):
    _, call = new_call(client)
    first = client.admit(call.call_id, "a1")
    second = client.admit(call.call_id, "a1")
    assert second.raw == first.raw
    assert Attempt.objects.filter(call_id=call.call_id).count() == 1
    with pytest.raises(RecoveryError) as reused:
        client.admit(call.call_id, "a1", credential_version=3)
    assert (reused.value.status, reused.value.code) == (422, "attempt_id_reused")
    facts = SENT | {"http_status": 503}
    assert client.report(call.call_id, "a1", facts).raw == client.report(call.call_id, "a1", facts).raw
    with pytest.raises(RecoveryError) as rewritten:
        client.report(call.call_id, "a1", SENT | {"http_status": 500})
    assert rewritten.value.status == 422


def test_another_tenants_objects_are_not_found_and_its_tenant_forbidden(setup):
    client, other = setup["client"], setup["other"]
    task, call = new_call(client)
    with pytest.raises(RecoveryError) as hidden:
        other.get_call(call.call_id)
    assert hidden.value.status == 404
    with pytest.raises(RecoveryError) as hidden_task:
        other.get_task(task.id)
    assert hidden_task.value.status == 404
    with pytest.raises(RecoveryError) as forbidden:
        other.create_task("acme", "x", agent="a", goal="g")
    assert forbidden.value.status == 403
    anonymous = requests.get(f"{setup['url']}/api/v1/calls/{call.call_id}", timeout=5)
    assert anonymous.status_code == 401
    forged = requests.get(
        f"{setup['url']}/api/v1/calls/{call.call_id}", timeout=5, headers={"Authorization": "Bearer rc_forged"}
    )
    assert forged.status_code == 401


def test_bad_input_gets_field_errors_and_stores_nothing(setup):
    url, headers = setup["url"] + "/api/v1/tasks", {"Authorization": f"Bearer {setup['token']}"}
    before = Task.objects.count()
    unknown = requests.post(
        url,
        json={"tenant": "acme", "external_id": "x", "agent": "a", "goal": "g", "colour": 1},
        headers=headers,
        timeout=5,
    )
    assert unknown.status_code == 422
    assert unknown.json()["error"]["field_errors"][0]["field"] == "colour"
    missing = requests.post(url, json={"tenant": "acme"}, headers=headers, timeout=5)
    assert missing.status_code == 422
    assert {e["field"] for e in missing.json()["error"]["field_errors"]} == {"external_id", "agent", "goal"}
    huge = requests.post(
        url, data=b"{" + b" " * 300_000 + b"}", headers=headers | {"Content-Type": "application/json"}, timeout=5
    )
    assert huge.status_code == 413
    not_json = requests.post(url, data=b"{nope", headers=headers | {"Content-Type": "application/json"}, timeout=5)
    assert 400 <= not_json.status_code < 500
    assert Task.objects.count() == before


def test_secrets_in_error_text_never_reach_an_answer(client):
    _, call = new_call(client)
    secret = "sk_live_51HdkfjsdkfjskdfjksdjfkSDFKJ"
    facts = SENT | {"http_status": 500, "error": {"message": f"upstream said Authorization: Bearer {secret}"}}
    answer = fail(client, call.call_id, facts)
    detail = client.get_call(call.call_id)
    assert secret not in str(answer.raw) and secret not in str(detail)
    assert answer.failure["diagnostic_ref"]
    diagnostic = Diagnostic.objects.get(ref=answer.failure["diagnostic_ref"])
    assert secret not in diagnostic.detail and "REDACTED" in diagnostic.detail
    assert "upstream said" not in answer.failure["public_message"]


def test_a_single_shot_the_gate_would_deny_sends_a_write_to_review(client):
    _, call = new_call(client)
    fail(client, call.call_id, SENT | {"error": {"kind": "read_timeout"}})  # UNKNOWN: a replay needs approval
    answer = client.single_shot(call.call_id, "a2", SENT | {"http_status": 200, "result": {"refund_id": "r-2"}})
    assert (answer.call_state, answer.raw["policy_bypassed"]) == ("HUMAN_REVIEW", True)
    stored = Attempt.objects.get(call_id=call.call_id, attempt_id="a2")
    assert stored.policy_bypassed and stored.http_status == 200  # the evidence is kept


def test_an_allowed_single_shot_admits_and_reports_in_one_request(client):
    _, call = new_call(client, tool="order.lookup")
    answer = client.single_shot(call.call_id, "a1", SENT | {"http_status": 200, "result": {"status": "shipped"}})
    assert (answer.call_state, answer.raw["policy_bypassed"]) == ("COMMITTED", False)


def test_a_step_waits_for_its_dependency_to_commit(client):
    task, payment = new_call(client)
    fail(client, payment.call_id, SENT | {"error": {"kind": "read_timeout"}})
    shipment = client.add_call(
        task.id,
        step=2,
        depends_on=[1],
        tool="order.lookup",
        arguments={"order_id": "O-2"},
        idempotency_key=f"k-{next(_n)}",
    )
    assert shipment.blocked_by == [payment.call_id]
    with pytest.raises(NotAdmitted) as blocked:
        client.admit(shipment.call_id, "s1")
    assert blocked.value.gate["reason"] == "blocked_by_dependency"
    summary = client.get_task(task.id).raw
    assert summary["blocked_steps"] == [2] and summary["unknown"][0]["call_id"] == payment.call_id


def test_blocked_by_names_the_waited_for_calls_and_blocked_by_steps_the_steps(client):
    task = client.create_task("acme", f"deps-{next(_n)}", agent="tests", goal="pay, then ship, then tell")

    def add(step, depends_on, order):
        return client.add_call(
            task.id,
            step=step,
            depends_on=depends_on,
            tool="order.lookup",
            arguments={"order_id": order},
            idempotency_key=f"{task.id}-{order}",
        )

    shipment = add(2, [1], "O-2")  # step 1 has no call yet: nothing to name but the step
    assert (shipment.blocked_by, shipment.blocked_by_steps) == ([], [1])
    payment = add(1, [], "O-1")
    notice = add(3, [1, 2], "O-3")  # two calls to wait for, in two steps
    assert (notice.blocked_by, notice.blocked_by_steps) == (sorted([payment.call_id, shipment.call_id]), [1, 2])
    client.admit(payment.call_id, "a1")
    client.report(payment.call_id, "a1", SENT | {"http_status": 200, "result": {"status": "shipped"}})
    again = add(3, [1, 2], "O-3")  # the same call, asked again: step 1 committed, step 2 still waits
    assert (again.call_id, again.blocked_by, again.blocked_by_steps) == (notice.call_id, [shipment.call_id], [2])


def test_another_call_of_a_step_that_waits_waits_too(client):
    """A step made by an earlier call keeps its dependencies for the calls registered on it later, which say none of
    their own (the step is found, not made, by the statement that inserts the call: docs/benchmarks.md)."""
    task, payment = new_call(client)  # step 1, not committed
    shipment = client.add_call(
        task.id, step=2, depends_on=[1], tool="order.lookup", arguments={"order_id": "O-2"}, idempotency_key="k-s1"
    )
    again = client.add_call(
        task.id, step=2, depends_on=[], tool="order.lookup", arguments={"order_id": "O-3"}, idempotency_key="k-s2"
    )
    assert again.call_id != shipment.call_id
    assert (again.blocked_by, again.blocked_by_steps) == ([payment.call_id], [1])
    assert Call.objects.get(pk=again.call_id).step_id == Call.objects.get(pk=shipment.call_id).step_id


def test_a_call_without_an_attempt_limit_says_null(client):
    data = copy.deepcopy(REGISTRY)
    next(tool for tool in data["tools"] if tool["name"] == "order.lookup")["budgets"] = {}  # no limit, nor the task's
    load_registry(data, actor=Actor.system("tests"))
    task = client.create_task("acme", f"nolimit-{next(_n)}", agent="tests", goal="look up an order")
    call = client.add_call(
        task.id, step=1, tool="order.lookup", arguments={"order_id": "O-1"}, idempotency_key=f"k-{next(_n)}"
    )
    assert client.get_call(call.call_id)["max_attempts"] is None
    assert Call.objects.get(pk=call.call_id).max_attempts is None


def test_abandoning_a_task_fails_its_pending_calls_and_keeps_unknown_ones(client):
    task, pending = new_call(client)
    _, unknown = new_call(client, task=task, args={"order_id": "O-9"}, step=2)
    fail(client, unknown.call_id, SENT | {"http_status": 502})
    abandoned = client.abandon_task(task.id, "customer cancelled")
    assert (abandoned.status, abandoned.outcome) == ("abandoned", "abandoned")
    assert Call.objects.get(pk=pending.call_id).state == "FAILED_PERMANENT"
    assert Call.objects.get(pk=unknown.call_id).state == "UNKNOWN"


def test_submitting_with_unknowns_says_so(client):
    task, call = new_call(client)
    fail(client, call.call_id, SENT | {"http_status": 504})
    assert client.complete_task(task.id, "tried to refund").outcome == "completed_with_unknowns"


def test_an_unauthorized_tool_is_a_missing_capability_listing_the_tenants_tools(setup):
    other = setup["other"]
    task = other.create_task("other", "o-1", agent="a", goal="g")
    with pytest.raises(RecoveryError) as missing:
        other.add_call(task.id, step=1, tool="refund.create", arguments=ORDER, idempotency_key="k")
    assert (missing.value.status, missing.value.code) == (422, "capability_missing")
    assert missing.value.detail["capabilities"] == ["order.lookup"]
    assert [t["name"] for t in other.capabilities("other")] == ["order.lookup"]


def test_the_openapi_document_describes_every_endpoint(setup):
    document = requests.get(setup["url"] + "/api/v1/openapi.json", timeout=5).json()
    assert set(document["paths"]) >= {
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/{task_id}/complete",
        "/api/v1/tasks/{task_id}/abandon",
        "/api/v1/tasks/{task_id}/calls",
        "/api/v1/calls/{call_id}",
        "/api/v1/calls/{call_id}/abandon",
        "/api/v1/calls/{call_id}/gate",
        "/api/v1/calls/{call_id}/attempts",
        "/api/v1/calls/{call_id}/attempts/{attempt_id}/outcome",
        "/api/v1/capabilities",
    }


@pytest.fixture(autouse=True)
def _close_runtime_sessions(request):
    """Close the clients' keep-alive connections after each test: on PostgreSQL the live-server thread serving one
    keeps its database connection open (CONN_MAX_AGE), which stops the test database from being dropped."""
    runtimes = request.getfixturevalue("setup") if "setup" in request.fixturenames else {}
    yield
    for name in ("client", "other"):
        if name in runtimes:
            runtimes[name].session.close()


# --- regressions found by schema-driven fuzzing (tests/test_api_fuzz.py): each answered 500 before -----------------


def _send(setup, method, path, body=None, *, data=None, params=None, headers=None):
    headers = {"Authorization": f"Bearer {setup['token']}", "Content-Type": "application/json"} | (headers or {})
    url = setup["url"] + "/api/v1" + path
    return requests.request(method, url, json=body, data=data, params=params, headers=headers, timeout=10)


def _refused(response, field: str) -> dict:
    """A 422 naming `field`, in an answer that is strict JSON (no NaN echoed back)."""
    import json

    assert response.status_code == 422, response.text
    body = json.loads(response.text, parse_constant=lambda constant: pytest.fail(f"{constant} in the answer"))
    error = body["error"]["field_errors"][0]
    assert error["field"] == field, body
    return error


def _stored():
    return Task.objects.count(), Call.objects.count(), Attempt.objects.count(), GateDecision.objects.count()


def _fuzz_objects(client):
    """A task with a READY write call and a SENT read call (attempt a1 admitted)."""
    task, ready = new_call(client)
    _, sent = new_call(client, tool="order.lookup", args={"order_id": "O-2"}, task=task, step=2)
    client.admit(sent.call_id, "a1")
    return task, ready, sent


def test_nul_characters_get_field_errors_and_store_nothing(setup, client):
    # PostgreSQL refuses U+0000 in text and jsonb: a NUL anywhere was a database error, on every endpoint.
    task, ready, sent = _fuzz_objects(client)
    before = _stored()
    call_body = {"step": 3, "tool": "order.lookup", "idempotency_key": "nul"}
    report = f"/calls/{sent.call_id}/attempts/a1/outcome"
    for method, path, body, field in [
        ("POST", "/tasks", {"tenant": "acme", "external_id": "n", "agent": "a", "goal": "g\x00"}, "goal"),
        ("POST", "/tasks", {"tenant": "ac\x00me", "external_id": "n", "agent": "a", "goal": "g"}, "tenant"),
        ("POST", f"/tasks/{task.id}/calls", call_body | {"arguments": {"order_id": "O\x00"}}, "arguments"),
        ("POST", f"/tasks/{task.id}/calls", call_body | {"arguments": {"order_id": "O", "x\x00": 1}}, "arguments"),
        ("POST", f"/tasks/{task.id}/complete", {"summary": "s", "deliverable": {"note": ["\x00"]}}, "deliverable"),
        ("POST", f"/tasks/{task.id}/abandon", {"reason": "\x00"}, "reason"),
        ("POST", f"/calls/{ready.call_id}/abandon", {"reason": "r\x00"}, "reason"),
        ("POST", f"/calls/{ready.call_id}/gate", {"attempt_id": "a1", "tool": "\x00"}, "tool"),
        ("POST", f"/calls/{ready.call_id}/attempts", {"attempt_id": "a1", "arguments": {"o": "\x00"}}, "arguments"),
        ("POST", report, {"http_status": 200, "result": {"s": "\x00"}}, "result"),
        ("POST", report, {"error": {"code": "\x00"}}, "error.code"),
    ]:
        error = _refused(_send(setup, method, path, body), field)
        assert "NUL" in error["expected"]
    _refused(_send(setup, "GET", "/tasks", params={"tenant": "acme", "external_id": "\x00"}), "external_id")
    _refused(_send(setup, "GET", "/capabilities", params={"tenant": "\x00"}), "tenant")
    outcome = f"/calls/{sent.call_id}/attempts/a%00/outcome"
    _refused(_send(setup, "POST", outcome, {"http_status": 200}), "attempt_id")
    assert _stored() == before
    assert Task.objects.get(pk=task.id).status == "open"
    assert Call.objects.get(pk=ready.call_id).state == "READY"
    assert Attempt.objects.get(call_id=sent.call_id).facts is None


def test_a_malformed_bearer_token_is_unauthenticated(setup):
    # A NUL in the token reached the token lookup, where PostgreSQL refused it.
    for token in ("rc_\x00" + "a" * 43, "rc_" + "a" * 20 + " " + "a" * 22, "rc_" + "\xe9" * 43):
        bearer = {"Authorization": f"Bearer {token}"}
        answer = _send(setup, "GET", "/capabilities", params={"tenant": "acme"}, headers=bearer)
        assert (answer.status_code, answer.json()["error"]["code"]) == (401, "unauthenticated")


def test_numbers_past_a_columns_range_get_field_errors(setup, client):
    # Integer columns are 32-bit on PostgreSQL and 64-bit on SQLite; past them was a database error.
    _, ready, _ = _fuzz_objects(client)
    before = _stored()
    for big in (2**31, 2**63):
        task = {"tenant": "acme", "external_id": "big", "agent": "a", "goal": "g", "budget": {"token_budget": big}}
        _refused(_send(setup, "POST", "/tasks", task), "budget.token_budget")
        attempt = {"attempt_id": "a1", "credential_version": big}
        _refused(_send(setup, "POST", f"/calls/{ready.call_id}/attempts", attempt), "credential_version")
    assert _stored() == before
    assert client.admit(ready.call_id, "a1", credential_version=2**31 - 1).call_state == "SENT"


def test_times_that_do_not_fit_in_utc_get_field_errors(setup, client):
    # Valid ISO 8601, but outside years 1-9999 once in UTC: SQLite could not store them, PostgreSQL stored rows
    # that could not be read back.
    _, _, sent = _fuzz_objects(client)
    before = _stored()
    for moment in ("9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00"):
        task = {"tenant": "acme", "external_id": "t", "agent": "a", "goal": "g", "budget": {"deadline": moment}}
        assert "UTC" in _refused(_send(setup, "POST", "/tasks", task), "budget.deadline")["expected"]
        outcome = {"http_status": 200, "result": {"status": "ok"}, "started_at": moment}
        _refused(_send(setup, "POST", f"/calls/{sent.call_id}/attempts/a1/outcome", outcome), "started_at")
    assert _stored() == before
    last = client.create_task("acme", "t", agent="a", goal="g", budget={"deadline": "9999-12-31T23:59:59Z"})
    assert client.get_task(last.id).raw["budget"]["deadline"].startswith("9999-12-31T23:59:59")


def test_json_no_database_can_store_gets_field_errors_and_stores_nothing(setup, client):
    # NaN and infinities (json.loads reads them), lone surrogates (valid escapes, not UTF-8) and very deep nesting
    # reached the fingerprint or the database through the free-form fields.
    task, ready, sent = _fuzz_objects(client)
    before = _stored()
    deep = "[" * 40 + "]" * 40
    report = f"/calls/{sent.call_id}/attempts/a1/outcome"
    call = '{"step": 3, "tool": "order.lookup", "idempotency_key": "j", "arguments": {"order_id": %s}}'
    for raw, path, field in [
        (call % "NaN", f"/tasks/{task.id}/calls", "arguments"),
        (call % "-Infinity", f"/tasks/{task.id}/calls", "arguments"),
        (call % '"\\ud800"', f"/tasks/{task.id}/calls", "arguments"),
        (call % deep, f"/tasks/{task.id}/calls", "arguments"),
        (call.replace('"step": 3', '"step": NaN') % '"O-3"', f"/tasks/{task.id}/calls", "step"),
        ('{"summary": "s", "deliverable": {"\\udfff": 1}}', f"/tasks/{task.id}/complete", "deliverable"),
        ('{"http_status": 200, "result": {"status": Infinity}}', report, "result"),
        ('{"attempt_id": "a1", "arguments": {"order_id": "\\ud800"}}', f"/calls/{ready.call_id}/attempts", "arguments"),
        # a single shot the gate denies (an attempt is in flight) stores its facts: it must not get that far
        (
            '{"attempt_id": "a2", "arguments": {"order_id": "\\ud800"}, "outcome": {"http_status": 200}}',
            f"/calls/{sent.call_id}/attempts",
            "arguments",
        ),
    ]:
        _refused(_send(setup, "POST", path, data=raw.encode()), field)
    assert _stored() == before
    assert Attempt.objects.get(call_id=sent.call_id).facts is None


def test_abandoning_a_call_with_a_blank_reason_gives_the_default_one(client):
    # A reason of spaces passed `reason or "abandoned"` and the state machine refused a blank reason.
    _, call = new_call(client)
    assert client.abandon_call(call.call_id, "   ")["state"] == "FAILED_PERMANENT"


def test_an_outcome_whose_error_says_nothing_is_refused(setup, client):
    # {"error": {}} passed "an http_status or an error" and classification found neither.
    _, ready, sent = _fuzz_objects(client)
    before = _stored()
    for facts in ({"error": {}}, {"sent": True, "error": {"kind": None, "code": None}}):
        _refused(_send(setup, "POST", f"/calls/{sent.call_id}/attempts/a1/outcome", facts), "body")
        single_shot = {"attempt_id": "s1", "outcome": facts}
        _refused(_send(setup, "POST", f"/calls/{ready.call_id}/attempts", single_shot), "outcome")
    assert _stored() == before
    assert Call.objects.get(pk=sent.call_id).state == "SENT"
    assert client.report(sent.call_id, "a1", {"error": {"kind": "read_timeout"}}).call_state == "RETRYABLE"


def test_an_agent_may_not_take_an_attempt_id_reserved_for_operator_replays(setup, client):
    """An approved replay's attempt is `action-<request id>`, and its approval admits that attempt id: an agent
    guessing it would spend the approval (and send a second request for the call). The API refuses the prefix with a
    field error, on admission and on an outcome, and stores nothing."""
    _task, ready, sent = _fuzz_objects(client)
    before = _stored()
    for attempt_id in ("action-1", "ACTION-1", "action-"):
        error = _refused(
            _send(setup, "POST", f"/calls/{ready.call_id}/attempts", {"attempt_id": attempt_id}), "attempt_id"
        )
        assert "reserved for replays operators approved" in error["expected"]
    _refused(
        _send(setup, "POST", f"/calls/{sent.call_id}/attempts/action-1/outcome", SENT | {"http_status": 200}),
        "attempt_id",
    )
    assert _stored() == before
    assert client.admit(ready.call_id, "reaction-1").call_state == "SENT"  # the prefix only


@pytest.mark.parametrize("sql", [True, False], ids=["sql", "orm"])
def test_the_task_counters_move_alike_through_the_sql_and_its_orm_twin(client, settings, sql):
    # The single shot moves and reads the task's counters in one UPDATE ... RETURNING (services/attempts.py); its ORM
    # twin (RECOVERY_HOT_PATH_SQL off) in an UPDATE and a SELECT. Both must leave and read the same numbers.
    settings.RECOVERY_HOT_PATH_SQL = sql
    task = client.create_task("acme", f"counters-{sql}", agent="tests", goal="g", budget={"max_rounds": 10})
    _, call = new_call(client, task=task)
    busy = SENT | {"http_status": 503, "tokens_used": 40}
    first = client.single_shot(call.call_id, "a1", busy)
    assert first.call_state == "RETRYABLE"
    assert (first.decision["budget"]["task_rounds"], first.decision["budget"]["tokens_used"]) == (1, 40)
    time.sleep(0.12)  # the backoff (50-100 ms)
    second = client.single_shot(call.call_id, "a2", busy | {"tokens_used": 2}, evidence=("time_elapsed",))
    assert (second.decision["budget"]["task_rounds"], second.decision["budget"]["tokens_used"]) == (2, 42)
    assert second.decision["budget"]["attempt"] == 2
    stored = Task.objects.get(pk=task.id)
    assert (stored.rounds_used, stored.tokens_used, stored.write_retries_used) == (2, 42, 1)

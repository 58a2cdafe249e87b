"""What probing the release found at the API's edges, each case a test (docs/api.md): a body that is not UTF-8 is
refused naming its encoding and stores nothing; a field error echoes the rejected value (redacted, cut); a signed
callback whose fields do not validate is 400 `invalid_callback` and stores nothing. The web server's own refusals:
tests/test_faults_web_server.py."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from recovery.audit.chain import Actor
from recovery.engine import redact
from recovery.models import Attempt, AuditEvent, Call, Receipt, Task
from recovery.registry import load_registry
from recovery.services.callbacks import sign
from recovery.services.tokens import token_create
from tests.test_api import REGISTRY
from tests.test_callbacks import REGISTRY as CALLBACK_REGISTRY

pytestmark = pytest.mark.django_db
TASK = {"tenant": "acme", "external_id": "probe-1", "agent": "tests", "goal": "g"}
SECRET = "faults-callback-secret"
CALLBACKS = "/api/v1/providers/shop/callbacks"


@pytest.fixture
def api():
    load_registry(REGISTRY, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["acme"], actor=Actor.system("tests"))
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def _stored() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Task, Call, Attempt, Receipt, AuditEvent))


def _error(reply, status: int, code: str) -> dict:
    assert reply.status_code == status, reply.content[:500]
    assert reply["Content-Type"].startswith("application/json")
    error = reply.json()["error"]
    assert error["code"] == code, error
    return error


# --- bodies: UTF-8 only ---------------------------------------------------------------------------------------------

TEXT = json.dumps(TASK)


@pytest.mark.parametrize(
    ("body", "content_type", "named"),
    [
        (b"\xef\xbb\xbf" + TEXT.encode(), "application/json", "UTF-8 with a byte order mark"),
        (TEXT.encode("utf-16"), "application/json", "UTF-16-LE"),  # with its BOM
        (TEXT.encode("utf-16-be"), "application/json", "UTF-16-BE"),  # without one
        (TEXT.encode("utf-32-le"), "application/json", "UTF-32-LE"),
        (TEXT.encode(), "application/json; charset=iso-8859-1", "declared as charset=iso-8859-1"),
        (TEXT.replace("g", "\xe9").encode("latin-1"), "application/json", "invalid UTF-8"),
    ],
    ids=["utf8-bom", "utf16-bom", "utf16-no-bom", "utf32", "latin1-charset", "latin1-bytes"],
)
def test_a_body_that_is_not_utf8_is_refused_naming_its_encoding_and_stores_nothing(api, body, content_type, named):
    before = _stored()

    reply = api.post("/api/v1/tasks", data=body, content_type=content_type)

    error = _error(reply, 400, "invalid_encoding")
    assert error["detail"]["encoding"] == named
    assert error["message"].startswith("the body ") and "send it as UTF-8 JSON" in error["message"]
    assert error["field_errors"][0]["field"] == "body" and "UTF-8" in error["field_errors"][0]["expected"]
    assert _stored() == before


def test_utf8_json_is_taken_with_or_without_its_charset(api):
    plain = api.post("/api/v1/tasks", data=TEXT.encode(), content_type="application/json")
    declared = api.post("/api/v1/tasks", data=TEXT.encode(), content_type="application/json; charset=UTF-8")
    assert (plain.status_code, declared.status_code) == (201, 200)


def test_a_signed_callback_that_is_not_utf8_is_refused_and_stores_nothing(shop):
    body = json.dumps({"event_id": "e1", "idempotency_key": "k", "status": "ok"}).encode("utf-16")
    before = _stored()

    reply = shop.post(CALLBACKS, data=body, content_type="application/json", HTTP_RECOVERY_SIGNATURE=sign(SECRET, body))

    error = _error(reply, 400, "invalid_callback")
    assert "UTF-16-LE" in error["field_errors"][0]["expected"]
    assert _stored() == before


# --- received: the rejected value, echoed ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field", "received"),
    [
        ("/api/v1/tasks", {**TASK, "tenant": 1}, "tenant", 1),
        ("/api/v1/tasks", {**TASK, "budget": {"max_rounds": "5"}}, "budget.max_rounds", "5"),
        ("/api/v1/tasks", {**TASK, "goal": True}, "goal", True),
        ("/api/v1/tasks", {**TASK, "agent": ["a", 2]}, "agent", ["a", 2]),
    ],
    ids=["tenant-1", "max_rounds-text", "goal-true", "agent-list"],
)
def test_a_type_error_echoes_the_rejected_value(api, path, body, field, received):
    reply = api.post(path, data=body, content_type="application/json")

    error = _error(reply, 422, "invalid_request")
    by_field = {e["field"]: e for e in error["field_errors"]}
    assert by_field[field]["received"] == received, by_field


def test_a_step_that_is_a_boolean_is_echoed(api):
    task = api.post("/api/v1/tasks", data=TASK, content_type="application/json").json()
    call = {"step": True, "tool": "refund.create", "arguments": {}, "idempotency_key": "k-1"}

    reply = api.post(f"/api/v1/tasks/{task['id']}/calls", data=call, content_type="application/json")

    (error,) = [e for e in _error(reply, 422, "invalid_request")["field_errors"] if e["field"] == "step"]
    assert error["received"] is True


def test_an_echoed_value_is_redacted_and_cut_and_an_object_is_not_echoed(api):
    secret = "sk_live_" + "a1B2c3D4" * 4
    long = "x" * 6000  # over goal's 5000 characters
    body = {**TASK, "tenant": secret, "goal": long, "agent": {"nested": "object"}}
    body["tenant"] = ["tenant", secret]  # a list: its items are echoed, redacted

    reply = api.post("/api/v1/tasks", data=body, content_type="application/json")

    by_field = {e["field"]: e["received"] for e in _error(reply, 422, "invalid_request")["field_errors"]}
    assert secret not in json.dumps(by_field) and by_field["tenant"][0] == "tenant"
    assert by_field["goal"] == "x" * (redact.MAX_ECHO_CHARS - 1) + "…"
    assert by_field["agent"] is None


def test_echo_received_masks_a_sensitive_field_and_drops_what_json_cannot_carry():
    echo_received = redact.echo_received
    assert echo_received("hunter2", "credentials.password") == "[REDACTED]"
    assert echo_received(float("nan")) is None and echo_received("a\x00b") is None and echo_received("\ud800") is None
    assert echo_received([[1]]) is None and echo_received(list(range(21))) is None
    assert echo_received(4111111111111111) == "[REDACTED:card]"


# --- signed callbacks with bad values -------------------------------------------------------------------------------

SHOP = CALLBACK_REGISTRY  # the shop of tests/test_callbacks.py: one tool with a status_map naming "ok"


@pytest.fixture
def shop(monkeypatch):
    monkeypatch.setenv("SHOP_CALLBACK_SECRET", SECRET)
    load_registry(SHOP, actor=Actor.system("tests"))
    return Client()


@pytest.fixture
def unknown_call(shop):
    """A call of the shop's tool, its key "refund-k1", in UNKNOWN: what a callback settles."""
    _, token = token_create(name="runtime", tenants=["acme"], actor=Actor.system("tests"))
    runtime = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    task = runtime.post("/api/v1/tasks", data=TASK, content_type="application/json").json()
    body = {"step": 1, "tool": "refund.create", "arguments": {}, "idempotency_key": "refund-k1"}
    call_id = runtime.post(f"/api/v1/tasks/{task['id']}/calls", data=body, content_type="application/json").json()[
        "call_id"
    ]
    runtime.post(f"/api/v1/calls/{call_id}/attempts", data={"attempt_id": "a1"}, content_type="application/json")
    outcome = {"connection_opened": True, "sent": True, "error": {"kind": "read_timeout"}}
    runtime.post(f"/api/v1/calls/{call_id}/attempts/a1/outcome", data=outcome, content_type="application/json")
    call = Call.objects.get(pk=call_id)
    assert call.state == "UNKNOWN", call.state
    return call


@pytest.mark.parametrize(
    ("fields", "field", "received"),
    [
        ({"effects": "lots"}, "effects", "lots"),
        ({"effects": -1}, "effects", -1),
        ({"effects": True}, "effects", True),
        ({"status": "bogus-status"}, "status", "bogus-status"),
        ({"status": 7}, "status", 7),
        ({"event_id": 12}, "event_id", 12),
        ({"provider_ref": ["r"]}, "provider_ref", ["r"]),
    ],
    ids=["effects-text", "effects-negative", "effects-bool", "status-unmapped", "status-number", "event-id", "ref"],
)
def test_a_signed_callback_with_a_bad_value_is_400_invalid_callback_and_stores_nothing(
    shop, unknown_call, fields, field, received
):
    body = json.dumps({"event_id": "evt-1", "idempotency_key": "refund-k1", "status": "ok", **fields}).encode()
    before = _stored()

    reply = shop.post(CALLBACKS, data=body, content_type="application/json", HTTP_RECOVERY_SIGNATURE=sign(SECRET, body))

    error = _error(reply, 400, "invalid_callback")
    assert [(e["field"], e["received"]) for e in error["field_errors"]] == [(field, received)]
    assert _stored() == before  # no receipt, no audit row
    after = Call.objects.get(pk=unknown_call.pk)
    assert (after.state, after.version) == ("UNKNOWN", unknown_call.version)


def test_a_status_outside_the_map_names_the_statuses_the_tool_maps(shop, unknown_call):
    body = json.dumps({"event_id": "evt-2", "idempotency_key": "refund-k1", "status": "bogus-status"}).encode()

    reply = shop.post(CALLBACKS, data=body, content_type="application/json", HTTP_RECOVERY_SIGNATURE=sign(SECRET, body))

    assert "(ok)" in _error(reply, 400, "invalid_callback")["field_errors"][0]["expected"]


def test_a_valid_signed_callback_still_settles_the_call(shop, unknown_call):
    body = json.dumps({"event_id": "evt-3", "idempotency_key": "refund-k1", "status": "ok", "effects": 1}).encode()

    reply = shop.post(CALLBACKS, data=body, content_type="application/json", HTTP_RECOVERY_SIGNATURE=sign(SECRET, body))

    assert reply.status_code == 200, reply.content
    assert (reply.json()["observed"], reply.json()["call_state"]) == ("committed", "COMMITTED")
    assert Receipt.objects.get(call=unknown_call).effects_observed == 1

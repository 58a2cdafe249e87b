"""Providers' wire formats in the registry (docs/providers.md): how a tool's request is encoded and keyed, where a
reply's error code and request id are, `load_tools --check` on each new key, and what replays, dry runs and the
recovered-tool session send."""

from __future__ import annotations

import copy
import json
from io import StringIO
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
import requests
from django.core.management import call_command
from recovery_client.recovered import DEFAULT_WIRE, _place_key

from recovery.engine.classify import classify
from recovery.engine.types import ClassifyContext, ErrorFacts, Facts, ToolPolicy
from recovery.engine.wire import error_code, form_encode, parse_path, with_reply_code
from recovery.models import Call, Provider, Tool
from recovery.providers.requests import send, tool_request, wire_of
from recovery.registry import load_registry, tool_policy, validate_registry
from recovery.services.outcomes import facts_of

ROOT = Path(__file__).resolve().parent.parent
STRIPE = ROOT / "recovery" / "fixtures" / "stripe.registry.json"


def stripe_registry() -> dict:
    return json.loads(STRIPE.read_text())


def errors_of(data: dict) -> dict[str, str]:
    return {error.path: error.message for error in validate_registry(data)}


def with_request(request: dict, **tool) -> dict:
    data = stripe_registry()
    data["tools"][0]["request"] = request
    data["tools"][0].update(tool)
    return data


# --- the registry file ----------------------------------------------------------------------------------------------


def test_the_shipped_stripe_registry_is_valid_and_loads(db, actor):
    assert validate_registry(stripe_registry()) == []
    out = StringIO()
    call_command("load_tools", str(STRIPE), "--check", stdout=out)
    assert "valid" in out.getvalue()

    load_registry(stripe_registry(), actor=actor)
    stripe = Provider.objects.get(name="stripe")
    assert stripe.request_id_header == "Request-Id"
    assert stripe.error_code_paths == ["error.decline_code", "error.code", "error.type"]
    policy = tool_policy(Tool.objects.select_related("provider").get(name="stripe.refund.create"))
    assert policy.error_code_paths == ("error.decline_code", "error.code", "error.type")


@pytest.mark.parametrize(
    ("request_", "path", "says"),
    [
        (
            {"method": "GET", "path": "/v1/refunds/{payment_intent}", "encoding": "form"},
            "$.tools[0].request.encoding",
            "has no body to encode as form",
        ),
        (
            {"method": "POST", "path": "/v1/refunds", "encoding": "none", "body": {"amount": "{amount}"}},
            "$.tools[0].request.body",
            'encoding "none" sends no body',
        ),
        ({"method": "POST", "path": "/v1/refunds", "encoding": "xml"}, "$.tools[0].request.encoding", "xml"),
        (
            {"method": "POST", "path": "/v1/refunds", "key": {"field": "amount"}},
            "$.tools[0].request.key.field",
            "also an argument in args_schema",
        ),
        (
            {"method": "POST", "path": "/v1/refunds", "body": {"k": "x"}, "key": {"field": "k"}},
            "$.tools[0].request.key.field",
            "the body template also sets 'k'",
        ),
        (
            {"method": "POST", "path": "/v1/refunds", "encoding": "none", "key": {"field": "idempotency_key"}},
            "$.tools[0].request.key.field",
            "sends no body",
        ),
        (
            {"method": "POST", "path": "/v1/refunds", "key": {"header": "Idempotency Key"}},
            "$.tools[0].request.key.header",
            "HTTP header name",
        ),
        (
            {"method": "POST", "path": "/v1/refunds", "key": {"header": "A", "field": "b"}},
            "$.tools[0].request.key",
            "exactly one of header",
        ),
        ({"method": "POST", "path": "/v1/refunds", "key": "header"}, "$.tools[0].request.key", "must be an object"),
        (
            {"method": "GET", "path": "/v1/refunds", "encoding": "none", "query": {"limit": {"a": 1}}},
            "$.tools[0].request.query.limit",
            "a list of them",
        ),
        (
            {"method": "GET", "path": "/v1/refunds", "encoding": "none", "query": {"limit": "{nope}"}},
            "$.tools[0].request.query.limit",
            "{nope} is not an argument",
        ),
    ],
)
def test_load_tools_check_names_each_malformed_request_key(db, request_, path, says):
    found = errors_of(with_request(request_))
    assert path in found, found
    assert says in found[path]


@pytest.mark.parametrize(
    ("paths", "bad"),
    [
        (["error..code"], "$.providers[0].error_code_paths[0]"),
        (["errors[x].code"], "$.providers[0].error_code_paths[0]"),
        (["error.code", "$.error"], "$.providers[0].error_code_paths[1]"),
        ([], "$.providers[0].error_code_paths"),
        ("error.code", "$.providers[0].error_code_paths"),
    ],
)
def test_an_error_path_that_is_not_a_path_is_refused_where_it_is(db, paths, bad):
    data = stripe_registry()
    data["providers"][0]["error_code_paths"] = paths
    assert bad in errors_of(data)


def test_a_request_id_header_is_a_header_name(db):
    data = stripe_registry()
    data["providers"][0]["request_id_header"] = "Request Id"
    assert "HTTP header name" in errors_of(data)["$.providers[0].request_id_header"]


# --- answers: paths and codes ---------------------------------------------------------------------------------------


def test_paths_reach_into_objects_and_lists():
    assert parse_path("errors[0].code") == ("errors", 0, "code")
    assert parse_path("details[0].issue") == ("details", 0, "issue")
    assert parse_path("name") == ("name",)
    assert parse_path("a.[0]") is None
    square = {"errors": [{"category": "PAYMENT_METHOD_ERROR", "code": "CARD_DECLINED", "detail": "..."}]}
    paypal = {"name": "UNPROCESSABLE_ENTITY", "details": [{"issue": "INSTRUMENT_DECLINED"}]}
    stripe = {"error": {"type": "card_error", "code": "card_declined", "decline_code": "insufficient_funds"}}
    assert error_code(square, ("errors[0].code",)) == "CARD_DECLINED"
    assert error_code(paypal, ("details[0].issue", "name")) == "INSTRUMENT_DECLINED"
    assert error_code({"name": "RESOURCE_NOT_FOUND"}, ("details[0].issue", "name")) == "RESOURCE_NOT_FOUND"
    assert error_code(stripe, ("error.decline_code", "error.code")) == "insufficient_funds"
    assert error_code({"error": {"code": "card_declined"}}, ("error.decline_code", "error.code")) == "card_declined"
    assert error_code({"errors": []}, ("errors[0].code",)) is None


def test_the_registrys_paths_win_over_the_code_the_runtime_derived_for_an_error_reply_only():
    stripe = {"error": {"type": "card_error", "code": "card_declined", "decline_code": "insufficient_funds"}}
    reported = Facts(http_status=402, sent=True, result=stripe, error=ErrorFacts(code="card_declined"))
    assert with_reply_code(reported, ("error.decline_code", "error.code")).error.code == "insufficient_funds"
    assert with_reply_code(reported, ()).error.code == "card_declined"  # no paths: as reported
    ok = Facts(http_status=200, sent=True, result={"error": {"code": "x"}})
    assert with_reply_code(ok, ("error.code",)) is ok


def test_a_square_refusal_code_in_errors_is_classified_as_a_refusal():
    tool = ToolPolicy(
        name="square.payment.create",
        side_effect="write",
        refusal_codes=frozenset({"CARD_DECLINED"}),
        error_code_paths=("errors[0].code",),
    )
    body = {"errors": [{"category": "PAYMENT_METHOD_ERROR", "code": "CARD_DECLINED", "detail": "Card declined."}]}
    facts = Facts(http_status=402, connection_opened=True, sent=True, result=body)
    outcome = classify(facts, tool, ClassifyContext(call_id="1", attempt_id="a1", idempotency_key="k", arguments={}))
    assert (outcome.row, outcome.state, outcome.error_code) == ("refusal", "FAILED_PERMANENT", "CARD_DECLINED")


def test_an_idempotency_conflict_in_stripes_error_type_is_a_hard_stop():
    tool = ToolPolicy(
        name="stripe.refund.create",
        side_effect="write",
        idempotency_conflict_codes=frozenset({"idempotency_error"}),
        error_code_paths=("error.decline_code", "error.code", "error.type"),
    )
    body = {"error": {"type": "idempotency_error", "message": "Keys for idempotent requests can only be used ..."}}
    facts = Facts(http_status=400, connection_opened=True, sent=True, result=body)
    outcome = classify(facts, tool, ClassifyContext(call_id="1", attempt_id="a1", idempotency_key="k", arguments={}))
    assert outcome.hard_stop == "idempotency_conflict"


# --- requests: what replays, probes and dry runs send -----------------------------------------------------------------


def provider(**fields) -> Provider:
    values = {
        "name": "p",
        "base_url": "https://api.example.com",
        "auth": {"kind": "none"},
        "request_id_header": "X-Request-Id",
    }
    return Provider(**(values | fields))


def tool(request: dict, *, side_effect: str = "write", **fields) -> Tool:
    return Tool(name="t", provider=fields.pop("provider", provider()), side_effect=side_effect, request=request)


def call(arguments: dict, *, side_effect: str = "write") -> Call:
    return Call(arguments=arguments, idempotency_key="order-8848:refund", side_effect=side_effect)


def test_a_form_request_is_sent_with_stripes_bracketed_nesting_and_shown_as_its_bytes():
    refund = stripe_registry()["tools"][0]
    stripe = provider(base_url="https://api.stripe.com", request_id_header="Request-Id")
    outgoing = tool_request(
        tool(refund["request"], provider=stripe),
        call({"payment_intent": "pi_123", "amount": 1250, "order_id": "O-8848"}),
    )
    assert outgoing.url == "https://api.stripe.com/v1/refunds"
    # The marker the refund's listing lookup matches travels in the body, templated from the key: shown as sent.
    marked = "payment_intent=pi_123&amount=1250&metadata[order_id]=O-8848&metadata[recovery_key]=order-8848%3Arefund"
    assert outgoing.data == marked.encode()
    assert outgoing.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert outgoing.headers["Idempotency-Key"] == "order-8848:refund"
    assert outgoing.request_id_header == "Request-Id"
    shown = outgoing.shown()
    assert shown["body_text"] == marked
    assert shown["headers"]["Idempotency-Key"] == "order-8848:refund"


def test_the_action_page_shows_a_form_body_as_its_bytes():
    from console.views.actions import _shown_request

    stripe = provider(base_url="https://api.stripe.com")
    outgoing = tool_request(
        tool(stripe_registry()["tools"][0]["request"], provider=stripe),
        call({"payment_intent": "pi_1", "amount": 5, "order_id": "O-1"}),
    )
    shown = _shown_request(outgoing.shown())
    marked = "payment_intent=pi_1&amount=5&metadata[order_id]=O-1&metadata[recovery_key]=order-8848%3Arefund"
    assert shown["body_text"] == marked
    json_request = tool_request(tool({"method": "POST", "path": "/x"}), call({"a": 1}))
    assert _shown_request(json_request.shown())["body_text"] == ""


def test_form_encoding_writes_booleans_lists_and_nulls_as_stripe_does():
    body = {"confirm": True, "capture": False, "expand": ["charge", "x y"], "n": 1.5, "empty": None}
    assert form_encode(body) == "confirm=true&capture=false&expand[0]=charge&expand[1]=x%20y&n=1.5&empty="
    assert dict(parse_qsl(form_encode({"a": {"b": {"c": "&="}}}))) == {"a[b][c]": "&="}


def test_a_key_in_a_body_field_goes_into_the_body_and_not_a_header():
    square = {"method": "POST", "path": "/v2/payments", "key": {"field": "idempotency_key"}}
    outgoing = tool_request(tool(square), call({"amount_money": {"amount": 100, "currency": "USD"}}))
    assert json.loads(outgoing.data) == {
        "amount_money": {"amount": 100, "currency": "USD"},
        "idempotency_key": "order-8848:refund",
    }
    assert "Idempotency-Key" not in outgoing.headers


def test_a_key_in_another_header_or_nowhere():
    paypal = {"method": "POST", "path": "/v2/checkout/orders", "key": {"header": "PayPal-Request-Id"}}
    outgoing = tool_request(tool(paypal), call({"intent": "CAPTURE"}))
    assert outgoing.headers["PayPal-Request-Id"] == "order-8848:refund"
    assert "Idempotency-Key" not in outgoing.headers
    github = {"method": "POST", "path": "/repos/o/r/issues", "key": None}
    outgoing = tool_request(tool(github), call({"title": "x"}))
    assert not {"Idempotency-Key", "PayPal-Request-Id"} & set(outgoing.headers)


def test_query_parameters_without_a_body():
    read = {"method": "GET", "path": "/v1/refunds/{refund_id}", "query": {"expand[]": "{expand}", "limit": 3}}
    outgoing = tool_request(
        tool(read, side_effect="read"), call({"refund_id": "re_1", "expand": ["charge", "a b"]}, side_effect="read")
    )
    assert outgoing.url == "https://api.example.com/v1/refunds/re_1?expand[]=charge&expand[]=a+b&limit=3"
    assert outgoing.data is None and outgoing.body is None
    outgoing = tool_request(tool(read, side_effect="read"), call({"refund_id": "re_1"}, side_effect="read"))
    assert outgoing.url == "https://api.example.com/v1/refunds/re_1?limit=3"  # an absent optional argument: no param
    post = {"method": "POST", "path": "/v1/refunds/{refund_id}/cancel", "encoding": "none"}
    assert tool_request(tool(post), call({"refund_id": "re_1"})).data is None


def test_a_json_request_is_sent_as_before():
    outgoing = tool_request(tool({"method": "POST", "path": "/refunds"}), call({"order_id": "O-1"}))
    assert outgoing.data == b'{"order_id": "O-1"}'
    assert outgoing.headers["Idempotency-Key"] == "order-8848:refund"
    assert "body_text" not in outgoing.shown()


def test_the_admission_wire_says_where_the_key_goes():
    assert wire_of(tool({"method": "POST", "path": "/x"})) == DEFAULT_WIRE
    square = tool({"method": "POST", "path": "/x", "key": {"field": "idempotency_key"}}, provider=provider())
    assert wire_of(square) == {
        "key_header": "",
        "key_field": "idempotency_key",
        "key_markers": [],
        "request_id_header": "X-Request-Id",
    }
    marked = {"method": "POST", "path": "/x", "body": {"metadata": {"order": "{order_id}", "rk": "{idempotency_key}"}}}
    assert wire_of(tool(marked))["key_markers"] == ["metadata.rk"]
    stripe = tool({"method": "POST", "path": "/x"}, provider=provider(request_id_header="Request-Id"))
    assert wire_of(stripe)["request_id_header"] == "Request-Id"
    assert wire_of(tool({"method": "GET", "path": "/x"}, side_effect="read"))["key_header"] == ""


# --- the recovered tool's session puts the key where the admission says --------------------------------------------


def prepared(**options) -> requests.PreparedRequest:
    return requests.Request("POST", "https://api.example.com/x", **options).prepare()


def test_the_session_puts_the_key_in_the_header_the_wire_names_replacing_the_sdks():
    request = prepared(data={"amount": 1}, headers={"Idempotency-Key": "sdk-made"})
    _place_key(request, DEFAULT_WIRE, "k-1")
    assert request.headers["Idempotency-Key"] == "k-1"
    request = prepared(json={"a": 1})
    _place_key(request, {"key_header": "PayPal-Request-Id", "key_field": "", "request_id_header": ""}, "k-1")
    assert request.headers["PayPal-Request-Id"] == "k-1" and "Idempotency-Key" not in request.headers


def test_the_session_puts_the_key_in_a_json_or_form_body_field():
    wire = {"key_header": "", "key_field": "idempotency_key", "request_id_header": "X-Request-Id"}
    request = prepared(json={"amount_money": {"amount": 100}, "idempotency_key": "model-made"})
    _place_key(request, wire, "k-1")
    assert json.loads(request.body) == {"amount_money": {"amount": 100}, "idempotency_key": "k-1"}
    assert request.headers["Content-Length"] == str(len(request.body))
    request = prepared(data={"amount": 1, "metadata[a]": "b"})
    _place_key(request, wire, "k-1")
    assert parse_qsl(request.body) == [("amount", "1"), ("metadata[a]", "b"), ("idempotency_key", "k-1")]
    nowhere = {"key_header": "", "key_field": "", "request_id_header": "X-Request-Id"}
    request = prepared(json={"a": 1})
    before = copy.copy(request.body)
    _place_key(request, nowhere, "k-1")
    assert request.body == before and "Idempotency-Key" not in request.headers


def test_the_session_puts_the_key_at_each_marker_path_of_a_form_or_json_body():
    wire = {**DEFAULT_WIRE, "key_markers": ["metadata.recovery_key"]}
    request = prepared(data={"amount": 1, "metadata[order_id]": "O-1", "metadata[recovery_key]": "model-made"})
    _place_key(request, wire, "k-1")
    assert request.headers["Idempotency-Key"] == "k-1"
    sent = parse_qsl(request.body)
    assert sent == [("amount", "1"), ("metadata[order_id]", "O-1"), ("metadata[recovery_key]", "k-1")]
    request = prepared(json={"amount": 1, "metadata": {"order_id": "O-1"}})
    _place_key(request, wire, "k-1")
    assert json.loads(request.body) == {"amount": 1, "metadata": {"order_id": "O-1", "recovery_key": "k-1"}}
    assert request.headers["Content-Length"] == str(len(request.body))


# --- the sandbox speaks them too: form bodies, a key in the body, Square-shaped errors -------------------------------


SQUARE_REFUND = {
    "method": "POST",
    "path": "/refunds",
    "encoding": "form",
    "body": {"order_id": "{order_id}", "amount_cents": "{amount_cents}"},
    "key": {"field": "idempotency_key"},
}


@pytest.fixture
def sandboxed(sandbox, monkeypatch) -> Provider:
    monkeypatch.setenv("SANDBOX_KEY_FOR_WIRE_TESTS", sandbox.api_key)
    return provider(
        base_url=sandbox.url,
        auth={"kind": "bearer", "secret_env": "SANDBOX_KEY_FOR_WIRE_TESTS"},
        error_code_paths=["errors[0].code", "error.code"],
    )


def test_the_sandbox_reads_a_form_body_keyed_in_a_field_and_deduplicates_by_that_key(sandbox, sandboxed):
    refund = tool(SQUARE_REFUND, provider=sandboxed)
    outgoing = tool_request(refund, call({"order_id": "O-8848", "amount_cents": 1250}))
    assert outgoing.data == b"order_id=O-8848&amount_cents=1250&idempotency_key=order-8848%3Arefund"

    first, again = send(outgoing), send(outgoing)

    assert (first["http_status"], first["result"]["amount_cents"], first["result"]["order_id"]) == (200, 1250, "O-8848")
    assert again["result"] == first["result"]  # the same key in the body: the first answer again, no second effect
    assert sandbox.ledger("order-8848:refund")["effects"] == 1
    assert [r["outcome"] for r in sandbox.requests(key="order-8848:refund")] == ["answered", "replayed"]


def test_a_square_shaped_refusal_from_the_sandbox_is_read_by_the_providers_path(sandbox, sandboxed):
    sandbox.fault(route="/refunds", kind="error", status=402, code="CARD_DECLINED", shape="square")
    refund = tool(SQUARE_REFUND, provider=sandboxed)
    facts = send(tool_request(refund, call({"order_id": "O-9", "amount_cents": 100})))

    assert facts["result"]["errors"][0] == {
        "category": "PAYMENT_METHOD_ERROR",
        "code": "CARD_DECLINED",
        "detail": "Injected failure.",
    }
    assert "error" not in facts  # the client's own reading (code, error.code) finds nothing in Square's shape
    policy = ToolPolicy(
        name="refund",
        side_effect="write",
        refusal_codes=frozenset({"CARD_DECLINED"}),
        error_code_paths=tuple(sandboxed.error_code_paths),
    )
    outcome = classify(
        facts_of(facts), policy, ClassifyContext(call_id="1", attempt_id="a1", idempotency_key="k", arguments={})
    )
    assert (outcome.row, outcome.error_code) == ("refusal", "CARD_DECLINED")
    assert sandbox.ledger("order-8848:refund")["effects"] == 0


# --- docs/providers.md ----------------------------------------------------------------------------------------------


def test_every_registry_file_in_the_provider_guide_is_valid(db):
    guide = (ROOT / "docs" / "providers.md").read_text()
    blocks = [part.split("```", 1)[0] for part in guide.split("```json\n")[1:]]
    assert len(blocks) == 5  # Stripe, Square, PayPal, Adyen, GitHub
    for block in blocks:
        data = json.loads(block)
        assert validate_registry(data) == [], data["providers"][0]["name"]

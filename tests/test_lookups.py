"""Status lookups of three kinds (docs/providers.md, docs/reconciliation.md): the registry's rules for `status_query`
kinds `key`, `list` and `replay` (a listing's marker must be sent by the request), and a listing read against the real
sandbox process — paged, matched on the marker, cut at its bound, waited out for its visibility window — with what
settle() makes of its receipt."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
import requests
from django.test import Client

from recovery.audit.chain import Actor
from recovery.models import Attempt, Call, Provider, Tool
from recovery.providers.listing import _cursor, _more, list_status, shown_lookup
from recovery.providers.status import status_url
from recovery.registry import validate_registry
from recovery.services.reconcile import reconcile_call
from recovery.services.tokens import token_create
from tests.sandbox import SANDBOX_API_KEY_FOR_TESTS

STRIPE = Path(__file__).resolve().parent.parent / "recovery" / "fixtures" / "stripe.registry.json"
MARKER = {"metadata.recovery_key": "{idempotency_key}"}


def stripe_registry() -> dict:
    return json.loads(STRIPE.read_text())


def errors_of(data: dict) -> dict[str, str]:
    return {error.path: error.message for error in validate_registry(data)}


# --- the registry ---------------------------------------------------------------------------------------------------


def test_a_list_match_whose_marker_the_request_never_sends_is_refused(db):
    data = stripe_registry()
    data["tools"][0]["request"]["body"]["metadata"] = {"order_id": "{order_id}"}  # the marker left out
    errors = errors_of(data)
    (where,) = [path for path in errors if path.startswith("$.tools[0].status_query.match")]
    assert "never sends {idempotency_key} at metadata.recovery_key" in errors[where]
    data["tools"][0]["request"]["body"]["metadata"]["recovery_key"] = "{order_id}"  # another value is no marker
    assert any(path.startswith("$.tools[0].status_query.match") for path in errors_of(data))


def test_a_marker_may_travel_as_the_keys_own_body_field(db):
    data = stripe_registry()
    tool = data["tools"][0]
    tool["request"] = {**tool["request"], "key": {"field": "idempotency_key"}}
    tool["status_query"]["match"] = {"idempotency_key": "{idempotency_key}"}
    assert errors_of(data) == {}


def test_each_kind_needs_its_own_keys(db):
    data = stripe_registry()
    listing = data["tools"][0]["status_query"]
    del listing["items"], listing["match"]
    listing["query"]["amount"] = "{no_such_argument}"
    errors = errors_of(data)
    assert 'kind "list"' in errors["$.tools[0].status_query.items"]
    assert 'kind "list"' in errors["$.tools[0].status_query.match"]
    assert "neither an argument" in errors["$.tools[0].status_query.query.amount"]

    data = stripe_registry()
    listing = data["tools"][0]["status_query"]
    listing["next"] = {"param": "starting_after", "cursor": "id", "page_cursor": "next_page", "more": "has_more"}
    assert "exactly one of cursor" in errors_of(data)["$.tools[0].status_query.next"]
    listing["next"] = {"param": "starting_after", "cursor": "id"}
    assert "required with cursor" in errors_of(data)["$.tools[0].status_query.next.more"]
    listing["next"] = {"param": "page", "page_cursor": "next_page"}  # Stripe Search's token: no `more` needed
    assert errors_of(data) == {}
    del listing["next"]
    assert 'kind "list"' in errors_of(data)["$.tools[0].status_query.next"]  # one page alone proves no absence

    data = stripe_registry()  # a lookup by key may carry the key in its query string instead of its path
    data["tools"][0]["status_query"] = {
        "method": "GET",
        "path": "/v1/lookup",
        "query": {"key": "{idempotency_key}", "expand": "{amount}"},
        "status_field": "data.status",
        "status_map": {"succeeded": "committed"},
    }
    assert "{amount} is not available" in errors_of(data)["$.tools[0].status_query.query.expand"]
    del data["tools"][0]["status_query"]["query"]["expand"]
    assert errors_of(data) == {}

    by_key = {"method": "GET", "path": "/v1/refunds/{provider_ref}", "visible_after_s": 5}
    data = stripe_registry()
    data["tools"][0]["status_query"] = by_key
    errors = errors_of(data)
    assert "required" in errors["$.tools[0].status_query.status_map"]
    assert 'only for a status_query of kind "list"' in errors["$.tools[0].status_query.visible_after_s"]

    data = stripe_registry()
    data["tools"][0]["status_query"] = {"kind": "replay", "path": "/v1/refunds"}
    data["tools"][0]["reconcile"]["replay_when_status_down"] = False
    errors = errors_of(data)
    assert "replay_when_status_down" in errors["$.tools[0].status_query.kind"]
    assert "re-sends the tool's own request" in errors["$.tools[0].status_query.path"]
    data["tools"][0]["status_query"] = {"kind": "replay"}
    data["tools"][0]["reconcile"]["replay_when_status_down"] = True
    assert errors_of(data) == {}
    del data["tools"][0]["status_query"]["kind"]  # kind "key" by default, which needs its request
    assert "required" in errors_of(data)["$.tools[0].status_query.path"]


def test_a_lookup_by_key_may_send_the_key_in_its_query_string(listed, make_call):
    call = unknown(make_call, listed, "O-8")
    listed.status_query = {"method": "GET", "path": "/refunds/lookup", "query": {"key": "{idempotency_key}", "v": "2"}}
    base = listed.provider.base_url.rstrip("/")
    assert status_url(listed, call) == f"{base}/refunds/lookup?key={call.idempotency_key}&v=2"
    listed.status_query["query"] = {"ref": "{provider_ref}"}
    assert status_url(listed, call) is None  # no reference yet: nothing to ask by


def test_a_page_token_pages_until_the_page_has_none():
    by_token = {"param": "cursor", "page_cursor": "cursor"}  # Square's: the next page's token in the page
    assert _more({"payments": [], "cursor": "c2"}, by_token) and _cursor({"cursor": "c2"}, [], by_token) == "c2"
    assert not _more({"payments": [{"id": "p"}]}, by_token)
    by_item = {"param": "starting_after", "cursor": "id", "more": "has_more"}  # Stripe's: the last item's id
    assert _more({"has_more": True}, by_item) and _cursor({}, [{"id": "re_1"}, {"id": "re_2"}], by_item) == "re_2"
    assert not _more({"has_more": False}, by_item) and not _more({}, {})


# --- a listing against the sandbox ----------------------------------------------------------------------------------


@pytest.fixture
def listed(registry, sandbox, monkeypatch):
    """refund.create of the factories' registry made a listed refund on the sandbox: its marker in the metadata."""
    monkeypatch.setenv("SANDBOX_API_KEY", SANDBOX_API_KEY_FOR_TESTS)
    Provider.objects.filter(pk=registry["provider"].pk).update(
        base_url=sandbox.url, auth={"kind": "bearer", "secret_env": "SANDBOX_API_KEY"}
    )
    tool = Tool.objects.select_related("provider").get(pk=registry["refund"].pk)
    tool.request = {
        "method": "POST",
        "path": "/refunds",
        "body": {
            "order_id": "{order_id}",
            "amount_cents": "{amount_cents}",
            "metadata": {"recovery_key": "{idempotency_key}"},
        },
    }
    tool.status_query = {
        "kind": "list",
        "method": "GET",
        "path": "/refunds/list",
        "query": {"order_id": "{order_id}", "limit": 1},
        "items": "data",
        "match": dict(MARKER),
        "ref_field": "refund_id",
        "next": {"param": "starting_after", "cursor": "refund_id", "more": "has_more"},
        "max_pages": 3,
        "visible_after_s": 0,
    }
    tool.budgets = {"max_business_effects": 1}
    tool.save()
    return tool


def refund(sandbox, order_id: str, marker: str) -> str:
    """A refund made directly on the sandbox (its own key each time), carrying `marker`; its reference."""
    body = {"order_id": order_id, "amount_cents": 100, "metadata": {"recovery_key": marker}}
    headers = {"Authorization": f"Bearer {SANDBOX_API_KEY_FOR_TESTS}", "Idempotency-Key": f"direct-{marker}-{id(body)}"}
    reply = requests.post(f"{sandbox.url}/refunds", json=body, headers=headers, timeout=5)
    reply.raise_for_status()
    return reply.json()["refund_id"]


def unknown(make_call, tool: Tool, order_id: str) -> Call:
    call = make_call("UNKNOWN", tool=tool)
    Call.objects.filter(pk=call.pk).update(arguments={"order_id": order_id, "amount_cents": 100})
    call.arguments, call.tool = {"order_id": order_id, "amount_cents": 100}, tool
    return call


def test_a_listing_pages_until_it_finds_the_marker_and_keeps_the_reference(listed, sandbox, make_call):
    call = unknown(make_call, listed, "O-1")
    refund(sandbox, "O-1", "someone-else")
    refund(sandbox, "O-2", call.idempotency_key)  # another order's refunds are not listed for O-1
    mine = refund(sandbox, "O-1", call.idempotency_key)

    answer = list_status(listed, call)

    assert (answer.observed, answer.effects, answer.provider_ref) == ("committed", 1, mine)
    assert answer.response["pages"] == 2 and answer.response["matched"] == [mine]
    receipt = reconcile_call(call.pk, worker="tests")
    assert (receipt.local_state_after, Call.objects.get(pk=call.pk).provider_ref) == ("COMMITTED", mine)


def test_two_matches_for_one_key_send_the_call_to_a_person_as_a_duplicate(listed, sandbox, make_call):
    call = unknown(make_call, listed, "O-3")
    first, second = refund(sandbox, "O-3", call.idempotency_key), refund(sandbox, "O-3", call.idempotency_key)

    receipt = reconcile_call(call.pk, worker="tests")

    assert (receipt.observed, receipt.effects_observed) == ("committed", 2)
    assert receipt.response["matched"] == [first, second]  # every matched reference kept
    call.refresh_from_db()
    assert (call.state, call.outcome, call.duplicate_effect) == ("HUMAN_REVIEW", "duplicate_effect", True)


def test_a_listing_cut_at_its_page_bound_proves_nothing(listed, sandbox, make_call):
    call = unknown(make_call, listed, "O-4")
    for n in range(4):  # four refunds of the order, none of them the call's: a limit of 1 and 3 pages leaves one unread
        refund(sandbox, "O-4", f"other-{n}")

    answer = list_status(listed, call)

    assert (answer.observed, answer.provider_status, answer.response["pages"]) == ("ambiguous", "listing_cut", 3)
    assert reconcile_call(call.pk, worker="tests").local_state_after == "STILL_UNKNOWN"


def test_not_listed_is_not_committed_only_once_the_visibility_window_has_passed(listed, sandbox, make_call):
    call = unknown(make_call, listed, "O-5")
    waiting = copy.deepcopy(listed.status_query) | {"visible_after_s": 3600}
    Tool.objects.filter(pk=listed.pk).update(status_query=waiting)
    listed.status_query = waiting

    early = reconcile_call(call.pk, worker="tests")
    assert (early.observed, early.provider_status, early.local_state_after) == ("pending", "not_listed_yet", "UNKNOWN")

    listed.status_query = waiting | {"visible_after_s": 0}
    Tool.objects.filter(pk=listed.pk).update(status_query=listed.status_query)
    late = reconcile_call(call.pk, worker="tests")
    assert (late.observed, late.provider_status, late.local_state_after) == ("not_committed", "not_listed", "RETRYABLE")


def test_a_listing_that_fails_is_a_failed_check(listed, sandbox, make_call):
    call = unknown(make_call, listed, "O-6")
    sandbox.fault(route="/refunds/list", kind="status_down", status=503)

    answer = list_status(listed, call)

    assert (answer.observed, answer.http_status, answer.endpoint_failed) == ("failed", 503, True)


def test_a_plan_shows_the_listing_it_would_read_with_the_credential_masked(listed, sandbox, make_call):
    call = unknown(make_call, listed, "O-7")

    shown = shown_lookup(listed, call)

    url, _, params = shown["url"].partition("?")
    assert (shown["method"], url) == ("GET", f"{sandbox.url}/refunds/list")
    assert dict(parse_qsl(params)) == {"order_id": "O-7", "limit": "1"}
    assert shown["headers"]["Authorization"] == "Bearer [REDACTED]"
    Tool.objects.filter(pk=listed.pk).update(status_query={"kind": "replay"})
    listed.status_query = {"kind": "replay"}
    assert shown_lookup(listed, call) is None  # a replay lookup sends the tool's own request, shown as the replay


def test_a_page_in_a_shape_the_registry_does_not_describe_is_unreadable_not_an_outage(listed, sandbox, make_call):
    call = unknown(make_call, listed, "O-9")
    listed.status_query = listed.status_query | {"items": "records"}  # the sandbox's pages hold `data`

    answer = list_status(listed, call)

    assert (answer.observed, answer.http_status, answer.endpoint_failed) == ("ambiguous", 200, False)
    assert "no list of items at 'records'" in answer.error


def test_a_match_on_a_value_the_call_lacks_matches_nothing(listed, sandbox, make_call):
    call = unknown(make_call, listed, "O-10")
    refund(sandbox, "O-10", "")  # an item whose marker is empty, as one without the field reads
    listed.status_query = listed.status_query | {"match": {"metadata.recovery_key": "{provider_ref}"}}  # none yet

    answer = list_status(listed, call)

    assert answer.observed == "ambiguous" and "needs {provider_ref}" in answer.error


# --- a runtime that sends no marker ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("agent", "admitted"), [("0.2.0", False), ("0.3.0", True), (None, True)])
def test_a_client_that_puts_no_marker_is_refused_a_listed_tool_before_anything_is_admitted(
    listed, make_call, registry, agent, admitted
):
    """A 0.2.0 client sends no metadata.recovery_key: the listing would never find its refund and would call it not
    committed after the window. It gets 426 and nothing is stored; a client that places markers, and any other
    runtime (which reads `key_markers` itself), is admitted."""
    _, token = token_create(name="runtime", tenants=[registry["tenant"].name], actor=Actor.system("tests"))
    call = make_call("READY", tool=listed)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if agent:
        headers["HTTP_USER_AGENT"] = f"recovery-console-client/{agent} python-requests/2.32.3"
    body = {"attempt_id": "a1", "tool": listed.name, "arguments": call.arguments}
    answer = Client().post(f"/api/v1/calls/{call.pk}/attempts", body, content_type="application/json", **headers)
    if admitted:
        assert answer.status_code == 201, answer.content
        assert answer.json()["wire"]["key_markers"] == ["metadata.recovery_key"]
    else:
        assert answer.status_code == 426, answer.content
        error = answer.json()["error"]
        assert error["code"] == "client_too_old" and "metadata.recovery_key" in error["message"]
        assert not Attempt.objects.filter(call=call).exists()
        assert Call.objects.get(pk=call.pk).state == "READY"
    plain = make_call("READY", tool=registry["lookup"])  # a tool without a marker: the same old client is admitted
    body = {"attempt_id": "a1", "tool": plain.tool.name, "arguments": plain.arguments}
    answer = Client().post(f"/api/v1/calls/{plain.pk}/attempts", body, content_type="application/json", **headers)
    assert answer.status_code == 201, answer.content

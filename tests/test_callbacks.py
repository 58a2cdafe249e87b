"""The provider callback endpoint under hostile input: arbitrary bodies, signed and unsigned, never a 5xx; a bad
signature stores nothing; a valid one with a malformed body gets a field-level 400."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery.audit.chain import Actor
from recovery.models import Receipt
from recovery.registry import load_registry
from recovery.services.callbacks import sign, signature_valid

pytestmark = pytest.mark.django_db
SECRET = "callback-test-secret"
URL = "/api/v1/providers/shop/callbacks"
REGISTRY = {
    "tenants": [{"name": "acme", "tools": "*"}],
    "providers": [{"name": "shop", "base_url": "http://127.0.0.1:9", "callback_secret_env": "SHOP_CALLBACK_SECRET"}],
    "tools": [
        {
            "name": "refund.create",
            "provider": "shop",
            "side_effect": "write",
            "request": {"method": "POST", "path": "/refunds"},
            "args_schema": {"type": "object"},
            "status_query": {"method": "GET", "path": "/s/{idempotency_key}", "status_map": {"ok": "committed"}},
        }
    ],
}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
BODIES = st.one_of(
    st.binary(max_size=200),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"event_id": st.one_of(st.text(max_size=210), st.integers()), "status": st.one_of(st.text(), st.none())},
        optional={"idempotency_key": st.text(max_size=300), "provider_ref": st.text(), "effects": JSON},
    ).map(lambda v: json.dumps(v).encode()),
)


@pytest.fixture
def shop(monkeypatch):
    monkeypatch.setenv("SHOP_CALLBACK_SECRET", SECRET)
    load_registry(REGISTRY, actor=Actor.system("tests"))
    return Client()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=BODIES, signed=st.booleans())
def test_it_never_fails_with_a_server_error_and_refuses_unsigned_bodies_without_storing(shop, body, signed):
    headers = {"HTTP_RECOVERY_SIGNATURE": sign(SECRET, body)} if signed else {}
    before = Receipt.objects.count()
    reply = shop.post(URL, data=body, content_type="application/json", **headers)
    assert reply.status_code < 500
    if not signed:
        assert reply.status_code == 401 and Receipt.objects.count() == before
    elif reply.status_code == 400:
        assert reply.json()["error"]["field_errors"], reply.json()


def test_a_signed_callback_with_a_missing_field_names_the_field(shop):
    body = json.dumps({"idempotency_key": "k", "status": "ok"}).encode()
    reply = shop.post(URL, data=body, content_type="application/json", HTTP_RECOVERY_SIGNATURE=sign(SECRET, body))
    assert reply.status_code == 400
    assert reply.json()["error"]["field_errors"][0]["field"] == "event_id"


def test_an_unknown_provider_answers_like_a_bad_signature(shop):
    body = b'{"event_id": "e"}'
    reply = Client().post(
        "/api/v1/providers/nobody/callbacks",
        data=body,
        content_type="application/json",
        HTTP_RECOVERY_SIGNATURE=sign(SECRET, body),
    )
    assert reply.status_code == 401


def test_the_signature_covers_the_time_and_every_byte_of_the_body():
    body = b'{"event_id": "e1", "status": "ok"}'
    header = sign(SECRET, body, now=1_000_000)
    assert signature_valid(SECRET, header, body, now=1_000_000 + 299)
    assert not signature_valid(SECRET, header, body, now=1_000_000 + 301)
    assert not signature_valid(SECRET, header, body + b" ", now=1_000_000)
    assert not signature_valid("other", header, body, now=1_000_000)
    assert not signature_valid(SECRET, header.replace("t=1000000", "t=1000001"), body, now=1_000_000)
    assert not signature_valid(SECRET, "garbage", body, now=1_000_000)


def test_a_signed_callback_with_text_no_database_stores_is_a_400_not_a_500(shop):
    for bad in ({"event_id": "e\x00", "status": "ok", "idempotency_key": "k"}, {"event_id": "e", "status": "\ud800"}):
        body = json.dumps(bad).encode()
        reply = shop.post(URL, data=body, content_type="application/json", HTTP_RECOVERY_SIGNATURE=sign(SECRET, body))
        assert reply.status_code == 400, reply.content
    assert Receipt.objects.count() == 0


@pytest.mark.parametrize("depth", [33, 900, 1000, 100_000])
def test_a_signed_callback_nested_too_deep_is_a_400_never_a_500(shop, depth):
    # Nested 1,000 levels deep, json.loads raised RecursionError: a 500 (an HTML page), the callback lost.
    body = '{"event_id": "deep", "status": "ok", "idempotency_key": "k", "x": ' + "[" * depth + "]" * depth + "}"
    raw = body.encode()
    response = shop.post(URL, raw, content_type="application/json", HTTP_RECOVERY_SIGNATURE=sign(SECRET, raw))
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid_callback" and "nest deeper than 32 levels" in error["message"]
    assert error["field_errors"][0]["field"] == "body"
    assert not Receipt.objects.exists()

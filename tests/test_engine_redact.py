"""Redaction for diagnostics (docs/design/classification.md, docs/design/quality-targets.md): secrets are masked before
anything is stored."""

from __future__ import annotations

import pytest

from recovery.engine.redact import MASK, is_sensitive_key, luhn_valid, redact, redact_data

GITHUB_PAT = "ghp_" + "A1b2C3d4E5" * 4


@pytest.mark.parametrize(
    ("text", "secret", "marker"),
    [
        ("Authorization: Bearer xyz", "xyz", "[REDACTED:authorization]"),
        ("authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA==", "[REDACTED:authorization]"),
        ('{"Authorization": "Bearer abc.def"}', "abc.def", "[REDACTED:authorization]"),
        ("{'authorization': 'Token t0ps3cret'}", "t0ps3cret", "[REDACTED:authorization]"),
        ('{\\"Authorization\\": \\"Bearer escaped123\\"}', "escaped123", "[REDACTED:authorization]"),
        ("Proxy-Authorization: Basic cHJveHk6cHc=", "cHJveHk6cHc=", "[REDACTED:authorization]"),
        ("retrying with bearer eyJhbGciOiJIUzI1NiJ9abc", "eyJhbGciOiJIUzI1NiJ9abc", "[REDACTED:bearer]"),
        ("Cookie: session=s3ss10n; theme=dark", "s3ss10n", "[REDACTED:cookie]"),
        ("key sk_live_51HxYzAbCdEfGh used", "sk_live_51HxYzAbCdEfGh", "[REDACTED:api_key]"),
        ("key sk_test_4eC39HqLyjWDarjtT1zdp7dc", "sk_test_4eC39HqLyjWDarjtT1zdp7dc", "[REDACTED:api_key]"),
        ("restricted rk_live_abcd1234EFGH", "rk_live_abcd1234EFGH", "[REDACTED:api_key]"),
        ("aws AKIAIOSFODNN7EXAMPLE in env", "AKIAIOSFODNN7EXAMPLE", "[REDACTED:aws_key]"),
        (f"token {GITHUB_PAT} here", GITHUB_PAT, "[REDACTED:github_token]"),
        ("oauth gho_abcdefghijklmnopqrstuvwxyz0123", "gho_abcdefghijklmnopqrstuvwxyz0123", "[REDACTED:github_token]"),
        ("pat github_pat_11ABCDEFG0123456789_abcdefghij", "github_pat_11ABCDEFG0123456789", "[REDACTED:github_token]"),
        ("slack xoxb-123456789012-abcdefghijkl", "xoxb-123456789012", "[REDACTED:slack_token]"),
        ("slack xoxp-1234-5678-abcdefgh", "xoxp-1234-5678", "[REDACTED:slack_token]"),
        ("api_key=9f86d081884c7d659a2feaa0c55ad015", "9f86d081884c7d659a2feaa0c55ad015", "[REDACTED:secret]"),
        ("token: deadbeefdeadbeefdeadbeef", "deadbeefdeadbeefdeadbeef", "[REDACTED:secret]"),
        ('"client_secret": "aB3dE5gH7jK9mN1pQ3sT5v"', "aB3dE5gH7jK9mN1pQ3sT5v", "[REDACTED:secret]"),
        ("login failed for password=hunter2&user=bob", "hunter2", "[REDACTED:secret]"),
        ("X-Api-Key: short", "short", "[REDACTED:secret]"),
        ("dsn postgres://app:pa55word@db:5432/x", "pa55word", "[REDACTED:password]"),
        ("card 4242 4242 4242 4242 declined", "4242 4242 4242 4242", "[REDACTED:card]"),
        ("card 4242-4242-4242-4242 declined", "4242-4242-4242-4242", "[REDACTED:card]"),
        ("card 4242424242424242.", "4242424242424242", "[REDACTED:card]"),
        ("amex 3782 822463 10005", "3782 822463 10005", "[REDACTED:card]"),
        ("short visa 4222222222222", "4222222222222", "[REDACTED:card]"),
    ],
)
def test_it_masks_each_secret_shape(text, secret, marker):
    out = redact(text)
    assert secret not in out
    assert marker in out


def test_it_keeps_the_authorization_scheme_and_the_rest_of_the_headers():
    out = redact('{"Authorization": "Bearer abc", "Accept": "application/json"}')
    assert out == '{"Authorization": "Bearer [REDACTED:authorization]", "Accept": "application/json"}'


def test_it_masks_a_card_fully_not_keeping_the_last_four():
    assert redact("card 4000 0566 5566 5556") == "card [REDACTED:card]"


def test_it_keeps_a_sixteen_digit_number_that_fails_luhn():
    assert not luhn_valid("8848000012345678")
    assert redact("order 8848000012345678 and 8848-0000-1234-5678") == "order 8848000012345678 and 8848-0000-1234-5678"


def test_it_finds_a_card_inside_a_longer_run_of_digit_groups():
    assert redact("ref 1234 4242 4242 4242 4242") == "ref 1234 [REDACTED:card]"


@pytest.mark.parametrize(
    "text",
    [
        "2026-08-20T18:50:00Z amount 800.0",
        "idempotency_key=9f86d081884c7d659a2feaa0c55ad015",
        "key=refund-order-8848-v3",
        "tokens_used=123456 max_tokens: 800",
        "the bearer of bad news",
        "status 503 after 2 s; Retry-After: 2",
        "",
    ],
)
def test_it_leaves_text_without_secrets_alone(text):
    assert redact(text) == text


def test_it_applies_extra_patterns():
    out = redact("ticket ACME-12345678 for O-1", ("ACME-[0-9]{8}",))
    assert out == "ticket [REDACTED:pattern] for O-1"


def test_it_refuses_an_invalid_extra_pattern():
    with pytest.raises(ValueError, match="invalid redaction pattern"):
        redact("text", ("([unclosed",))


@pytest.mark.parametrize("key", ["Authorization", "X-Api-Key", "password", "db_password", "Set-Cookie", "CVC", "token"])
def test_it_knows_sensitive_keys(key):
    assert is_sensitive_key(key)


@pytest.mark.parametrize("key", ["tokens_used", "idempotency_key", "amount_cents", "status"])
def test_it_does_not_treat_ordinary_keys_as_sensitive(key):
    assert not is_sensitive_key(key)


def test_it_redacts_nested_data():
    data = {
        "headers": {"Authorization": "Bearer x", "X-Api-Key": "k", "Cookie": None, "Accept": "json"},
        "card": {"number": "4242424242424242", "cvc": "123", "card_number": 4242424242424242},
        "items": [{"note": "paid with 4000 0566 5566 5556"}, 4242424242424242, 8848000012345678, True],
        "error": "upstream said: Authorization: Bearer leaked",
        "tokens_used": 5,
        "tuple": ("sk_live_51HxYzAbCdEfGh",),
    }
    assert redact_data(data) == {
        "headers": {"Authorization": MASK, "X-Api-Key": MASK, "Cookie": None, "Accept": "json"},
        "card": {"number": "[REDACTED:card]", "cvc": MASK, "card_number": MASK},
        "items": [{"note": "paid with [REDACTED:card]"}, "[REDACTED:card]", 8848000012345678, True],
        "error": "upstream said: Authorization: Bearer [REDACTED:authorization]",
        "tokens_used": 5,
        "tuple": ("[REDACTED:api_key]",),
    }


def test_it_masks_a_sensitive_key_whatever_its_value_type():
    assert redact_data({"password": {"old": "a", "new": "b"}, "token": ["t1"], "secret": 42}) == {
        "password": MASK,
        "token": MASK,
        "secret": MASK,
    }


def test_it_passes_extra_patterns_down_the_tree():
    assert redact_data({"a": ["ACME-12345678"]}, ("ACME-[0-9]{8}",)) == {"a": ["[REDACTED:pattern]"]}


def test_it_does_not_change_its_input():
    data = {"password": "p", "list": ["Bearer abcdefghij"]}
    redact_data(data)
    assert data == {"password": "p", "list": ["Bearer abcdefghij"]}

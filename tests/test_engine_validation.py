"""Argument and result validation (docs/design/classification.md rows 4, 10, 11): JSON Schema turned into field errors a
model can act on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from recovery.engine.messages import public_message
from recovery.engine.types import (
    INVALID_ARGUMENTS,
    READ,
    WRITE,
    ErrorFacts,
    Facts,
    FieldError,
    Invariant,
    ToolPolicy,
)
from recovery.engine.validation import describe, provider_ref, validate_args, validate_result

SEED_SCHEMA = {
    "type": "object",
    "properties": {
        "amount_cents": {
            "type": "integer",
            "minimum": 1,
            "x-unit": "cents",
            "x-suggestion": "Use an integer expressed in cents.",
        }
    },
    "required": ["amount_cents"],
}

ORDER_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "order_id": {"type": "string", "pattern": "^O-\\d+$"},
        "mode": {"enum": ["a", "b"]},
        "limit": {"type": "integer", "maximum": 100},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku"],
            },
        },
    },
    "required": ["order_id"],
}

NOW = datetime(2026, 8, 20, 18, 50, tzinfo=UTC)


def test_it_reports_the_seed_example_verbatim():
    tool = ToolPolicy(name="refund.create", side_effect=WRITE, args_schema=SEED_SCHEMA)

    errors = validate_args(SEED_SCHEMA, {"amount_cents": "800.0"})

    assert errors == (
        FieldError(
            field="amount_cents",
            expected="positive integer",
            received="800.0",
            suggestion="Use an integer expressed in cents.",
        ),
    )
    assert public_message(INVALID_ARGUMENTS, tool=tool, field_errors=errors) == (
        "amount_cents must be a positive integer in cents."
    )


def test_it_suggests_an_integer_example_when_the_schema_has_no_suggestion():
    schema = {"type": "object", "properties": {"amount_cents": {"type": "integer", "minimum": 1}}}
    (error,) = validate_args(schema, {"amount_cents": "800.0"})
    assert error.suggestion == "Send an integer without quotes or decimals, e.g. 800."


def test_it_reports_a_missing_field_as_present_with_no_received_value():
    (error,) = validate_args(SEED_SCHEMA, {})
    assert error == FieldError(
        field="amount_cents", expected="present", received=None, suggestion="Use an integer expressed in cents."
    )


def test_it_reports_each_problem_sorted_by_field_with_nested_paths():
    args = {"order_id": "X1", "mode": "c", "limit": 101, "items": [{"sku": "S1"}, {"qty": "2"}], "color": "red"}

    errors = validate_args(ORDER_SCHEMA, args)

    assert [(e.field, e.expected, e.received) for e in errors] == [
        ("color", "no such field", "red"),
        ("items.1.qty", "positive integer", "2"),
        ("items.1.sku", "present", None),
        ("limit", "integer, at most 100", 101),
        ("mode", "one of: a, b", "c"),
        ("order_id", "string matching ^O-\\d+$", "X1"),
    ]
    by_field = {e.field: e for e in errors}
    assert by_field["color"].suggestion == "Remove color; accepted fields: items, limit, mode, order_id."
    assert by_field["items.1.qty"].suggestion == "Send an integer without quotes or decimals, e.g. 2."
    assert by_field["mode"].suggestion == "Use one of: a, b."


def test_it_accepts_valid_arguments():
    assert validate_args(ORDER_SCHEMA, {"order_id": "O-12", "items": [{"sku": "S", "qty": 3}]}) == ()


def test_it_accepts_anything_with_an_empty_schema():
    assert validate_args({}, {"anything": ["goes", 1]}) == ()


@pytest.mark.parametrize("schema", [{"type": "nope"}, {"minimum": "one"}, {"$ref": "https://example.com/s.json"}])
def test_it_refuses_an_invalid_schema(schema):
    with pytest.raises(ValueError):
        validate_args(schema, {"a": 1})


def test_it_uses_x_expected_when_the_schema_gives_it():
    schema = {"properties": {"currency": {"type": "string", "pattern": "^[A-Z]{3}$", "x-expected": "ISO 4217 code"}}}
    (error,) = validate_args(schema, {"currency": "euro"})
    assert error.expected == "ISO 4217 code"


def test_it_keeps_the_path_of_a_forbidden_property():
    schema = {"type": "object", "properties": {"admin": False}}
    (error,) = validate_args(schema, {"admin": True})
    assert (error.field, error.expected, error.received) == ("admin", "no such field", True)


def test_it_checks_date_time_formats():
    schema = {"properties": {"at": {"type": "string", "format": "date-time"}}}
    assert validate_args(schema, {"at": "2026-08-20T18:50:00Z"}) == ()
    (error,) = validate_args(schema, {"at": "tomorrow"})
    assert error.expected == "date-time string"


def test_it_names_the_root_when_the_arguments_are_not_an_object():
    (error,) = validate_args({"type": "object"}, [1, 2])
    assert (error.field, error.expected, error.suggestion) == ("arguments", "object", "Send a JSON object.")


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "integer", "minimum": 1}, "positive integer"),
        ({"type": "integer"}, "integer"),
        ({"type": "integer", "minimum": 0}, "non-negative integer"),
        ({"type": "integer", "minimum": 1, "maximum": 100}, "positive integer, at most 100"),
        ({"maximum": 100}, "at most 100"),
        ({"type": "number", "exclusiveMinimum": 0}, "positive number"),
        ({"type": "string", "pattern": "^O-\\d+$"}, "string matching ^O-\\d+$"),
        ({"enum": ["a", "b"]}, "one of: a, b"),
        ({"const": True}, "exactly true"),
        ({"type": ["string", "null"]}, "string or null"),
        ({"type": "string", "minLength": 1}, "non-empty string"),
        ({"type": "array", "items": {"type": "string"}, "maxItems": 1}, "array of string, at most 1 item"),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "integer or string"),
        ({}, "valid value"),
    ],
)
def test_it_describes_a_schema_in_a_few_words(schema, expected):
    assert describe(schema) == expected


# --- results ---------------------------------------------------------------------------------------------------------


def _lookup(**overrides) -> ToolPolicy:
    return ToolPolicy(name="orders.lookup", side_effect=READ, **overrides)


def test_it_prefixes_result_schema_errors_with_result():
    tool = _lookup(result_schema={"type": "object", "properties": {"total": {"type": "integer"}}, "required": ["id"]})

    errors = validate_result(tool, {"total": "12"}, arguments={}, now=NOW)

    assert [(e.field, e.expected, e.received) for e in errors] == [
        ("result.id", "present", None),
        ("result.total", "integer", "12"),
    ]


def test_it_requires_the_required_result_fields_present_and_not_null():
    tool = _lookup(required_result_fields=("id", "refund.status", "items.0.sku"))
    result = {"id": None, "refund": {"status": "succeeded"}, "items": []}

    errors = validate_result(tool, result, arguments={}, now=NOW)

    assert [e.field for e in errors] == ["result.id", "result.items.0.sku"]
    assert (
        validate_result(tool, {"id": 1, "refund": {"status": "x"}, "items": [{"sku": "S"}]}, arguments={}, now=NOW)
        == ()
    )


@pytest.mark.parametrize(
    ("stamp", "fresh"),
    [
        ((NOW - timedelta(seconds=30)).isoformat(), True),
        ("2026-08-20T18:49:30Z", True),
        ("2026-08-20T18:49:30", True),  # naive: read as UTC
        ((NOW - timedelta(seconds=61)).isoformat(), False),
        ("yesterday", False),
        ("2026-08-20", False),  # a date is not a time
        (None, False),
    ],
)
def test_it_checks_freshness(stamp, fresh):
    tool = _lookup(result_time_field="as_of", max_result_age_s=60)
    errors = validate_result(tool, {"as_of": stamp}, arguments={}, now=NOW)
    assert (errors == ()) is fresh
    if not fresh:
        assert errors[0].field == "result.as_of"


def test_it_reports_a_missing_time_field_as_stale():
    tool = _lookup(result_time_field="as_of", max_result_age_s=60)
    (error,) = validate_result(tool, {}, arguments={}, now=NOW)
    assert (error.field, error.received) == ("result.as_of", None)


@pytest.mark.parametrize(
    "overrides", [{"result_time_field": "as_of"}, {"max_result_age_s": 60}, {}], ids=["no-max-age", "no-field", "none"]
)
def test_it_skips_freshness_unless_both_field_and_age_are_set(overrides):
    assert validate_result(_lookup(**overrides), {"as_of": "2000-01-01T00:00:00Z"}, arguments={}, now=NOW) == ()


def test_it_checks_only_the_format_of_the_time_without_a_clock():
    tool = _lookup(result_time_field="as_of", max_result_age_s=60)
    assert validate_result(tool, {"as_of": "2000-01-01T00:00:00Z"}, arguments={}, now=None) == ()
    assert len(validate_result(tool, {"as_of": "soon"}, arguments={}, now=None)) == 1


def test_it_checks_an_invariant_against_an_argument():
    tool = _lookup(invariants=(Invariant(result="refund.amount_cents", equals_arg="amount_cents"),))
    args = {"amount_cents": 800}

    assert validate_result(tool, {"refund": {"amount_cents": 800.0}}, arguments=args, now=NOW) == ()
    (error,) = validate_result(tool, {"refund": {"amount_cents": 900}}, arguments=args, now=NOW)
    assert (error.field, error.expected, error.received) == (
        "result.refund.amount_cents",
        "equal to argument amount_cents",
        900,
    )
    # a type change is a business change: "800" is not 800
    assert len(validate_result(tool, {"refund": {"amount_cents": "800"}}, arguments=args, now=NOW)) == 1
    assert len(validate_result(tool, {"refund": {}}, arguments=args, now=NOW)) == 1


def test_it_skips_an_equality_invariant_when_the_argument_is_absent():
    tool = _lookup(invariants=(Invariant(result="currency", equals_arg="currency"),))
    assert validate_result(tool, {"currency": "EUR"}, arguments={}, now=NOW) == ()


def test_it_checks_one_of_and_minimum_invariants():
    tool = _lookup(
        invariants=(
            Invariant(result="status", one_of=("succeeded", "pending")),
            Invariant(result="count", minimum=1),
        )
    )
    assert validate_result(tool, {"status": "pending", "count": 3}, arguments={}, now=NOW) == ()

    errors = validate_result(tool, {"status": "failed", "count": 0}, arguments={}, now=NOW)

    assert [(e.field, e.expected) for e in errors] == [
        ("result.count", "at least 1"),
        ("result.status", "one of: succeeded, pending"),
    ]
    assert len(validate_result(tool, {"status": "pending", "count": True}, arguments={}, now=NOW)) == 1


# --- provider reference ----------------------------------------------------------------------------------------------


def _refund(ref_field: str = "refund_id") -> ToolPolicy:
    return ToolPolicy(name="refund.create", side_effect=WRITE, provider_ref_field=ref_field)


def test_it_prefers_the_provider_request_id():
    facts = Facts(http_status=200, provider_request_id="req_1", result={"refund_id": "re_9"})
    assert provider_ref(_refund(), facts) == "req_1"


@pytest.mark.parametrize(
    ("result", "ref"),
    [
        ({"refund_id": "re_9"}, "re_9"),
        ({"refund_id": 881}, "881"),
        ({"refund_id": ""}, ""),
        ({"refund_id": "  "}, ""),
        ({"refund_id": None}, ""),
        ({"refund_id": True}, ""),
        ({"refund_id": {"id": "x"}}, ""),
        ({}, ""),
        ("not an object", ""),
    ],
)
def test_it_reads_the_reference_from_the_registered_result_field(result, ref):
    assert provider_ref(_refund(), Facts(http_status=200, result=result)) == ref


def test_it_reads_a_nested_reference_field_and_none_without_a_field():
    facts = Facts(http_status=200, result={"refund": {"id": "re_7"}})
    assert provider_ref(_refund("refund.id"), facts) == "re_7"
    assert provider_ref(_refund(""), facts) == ""


def test_it_never_takes_a_reference_from_error_text():
    facts = Facts(http_status=500, error=ErrorFacts(message="provider_request_id=req_evil"))
    assert provider_ref(_refund(), facts) == ""

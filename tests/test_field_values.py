"""recovery/statemachine/field_values.py: the hot paths' values and instances without the ORM's per-value detours
must be exactly what the ORM's own way gives — the same value of the same type for every field, the same instance
for every row — on the backend the suite runs on."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from recovery.models import Attempt, AuditEvent, Call, GateDecision, Receipt
from recovery.models.calls import ReceiptSource
from recovery.statemachine.field_values import from_row, prepared
from recovery.statemachine.hot_path import _columns

pytestmark = pytest.mark.django_db


def _orm(instance, fields, *, pre_save=True) -> list:
    values = [field.pre_save(instance, True) if pre_save else getattr(instance, field.attname) for field in fields]
    return [field.get_db_prep_save(value, connection) for field, value in zip(fields, values, strict=True)]


def _typed(values: list, fields) -> list:
    """Each value with its type, a JSON adapter by what it wraps: True and 1 are equal in Python, not to a driver.
    A field stamped at save (auto_now) by its type alone: each way stamps its own now."""
    return [
        (type(value), None if getattr(field, "auto_now", False) else getattr(value, "obj", value))
        for value, field in zip(values, fields, strict=True)
    ]


def _rows(make_call):
    call = make_call("UNKNOWN")
    now = timezone.now()
    yield call
    yield Attempt(
        call=call,
        attempt_id="a1",
        number="2",  # not an int: the field's own conversion, whatever the shortcut
        tool=call.tool,
        arguments={"order": 1, "nested": [1, None, "x"]},
        fingerprint="f",
        evidence=[],
        policy_bypassed=True,
        breaker_probe=False,
        admitted_at=now,
        http_status=200,
        sent=None,
        tokens_used=0,
        response={"admitted": True},
    )
    # An int for a boolean and for a text field: each field's own conversion (True, "12"), whatever the shortcut.
    yield GateDecision(call=call, candidate_attempt_id=12, candidate={}, allowed=1, reason="x", checks=[])
    yield Receipt(
        call=call,
        provider=call.tool.provider,
        source=ReceiptSource.POLL,  # a str enum, not a str
        observed="pending",
        local_state_before="UNKNOWN",
        local_state_after="UNKNOWN",
        checked_at=now - timedelta(seconds=5),
    )


def test_values_go_as_the_orm_prepares_them(make_call):
    for instance in _rows(make_call):
        fields = tuple(type(instance)._meta.concrete_fields)
        assert _typed(prepared(instance, fields, connection), fields) == _typed(_orm(instance, fields), fields)
    event = AuditEvent(seq=1, chain="t:1", chain_seq=1, prev_hash="", hash="h", action="x", created_at=timezone.now())
    fields = tuple(AuditEvent._meta.concrete_fields)
    ours, orm = prepared(event, fields, connection, pre_save=False), _orm(event, fields, pre_save=False)
    assert _typed(ours, fields) == _typed(orm, fields)


def test_a_row_becomes_the_instance_the_orm_makes(make_call):
    call = make_call("UNKNOWN")
    with connection.cursor() as cursor:
        # raw SQL: the row as the hot paths read it (recovery/statemachine/hot_path.py, _load)
        cursor.execute(f"SELECT {_columns(Call, 'c')} FROM {Call._meta.db_table} c WHERE c.id = %s", [call.pk])
        row = cursor.fetchone()
    attnames = [field.attname for field in Call._meta.concrete_fields]
    made, orm = from_row(Call, "default", attnames, list(row)), Call.from_db("default", attnames, list(row))
    assert {k: v for k, v in vars(made).items() if k != "_state"} == {
        k: v for k, v in vars(orm).items() if k != "_state"
    }
    assert (made._state.adding, made._state.db) == (orm._state.adding, orm._state.db) == (False, "default")
    assert made.tool == call.tool and made.task_id == call.task_id  # relations load as from any ORM row

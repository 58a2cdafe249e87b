"""recovery.rows: the hot path's statements write and read exactly what the ORM writes and reads, on both backends."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.db.models.signals import pre_save
from django.test.utils import CaptureQueriesContext

from recovery import rows
from recovery.models import Attempt, Call, Step, Task
from recovery.selectors.tasks_calls import call_in_tenants
from recovery.transitions import TransitionConflict, transition_call

pytestmark = pytest.mark.django_db

WHEN = datetime(2026, 11, 30, 8, 15, 30, 123456, tzinfo=UTC)


def _attempt(call: Call, **fields) -> Attempt:
    return Attempt(
        call=call,
        attempt_id="a-1",
        number=1,
        tool=call.tool,
        arguments={"order_id": "o-1", "nested": {"list": [1, 2.5, None, "é"]}},
        fingerprint="f" * 64,
        evidence=["receipt_committed"],
        admitted_at=WHEN,
        **fields,
    )


def test_it_inserts_a_row_the_orm_reads_back_unchanged(make_call):
    call = make_call()
    attempt = rows.insert(_attempt(call, facts={"http_status": 200}, http_status=200))
    assert attempt.pk is not None and not attempt._state.adding
    stored = Attempt.objects.get(pk=attempt.pk)
    assert stored.arguments == {"order_id": "o-1", "nested": {"list": [1, 2.5, None, "é"]}}
    assert stored.evidence == ["receipt_committed"]
    assert stored.facts == {"http_status": 200}
    assert stored.admitted_at == WHEN
    assert stored.created_at is not None  # the field's default, applied as the ORM applies it
    assert (stored.call_id, stored.tool_id, stored.http_status, stored.sent) == (call.pk, call.tool_id, 200, None)


def test_it_reads_rows_as_the_orm_does_json_decoded_and_timestamps_aware(make_call):
    call = make_call()
    attempt = rows.insert(_attempt(call))
    sql = f"SELECT {rows.select_list(Attempt, 'a')} FROM {Attempt._meta.db_table} a WHERE a.id = %s"
    (loaded,) = rows.fetch(Attempt, sql, [attempt.pk])
    orm = Attempt.objects.get(pk=attempt.pk)
    for field in Attempt._meta.concrete_fields:
        assert getattr(loaded, field.attname) == getattr(orm, field.attname), field.name
    assert loaded.admitted_at.tzinfo is not None
    assert isinstance(loaded.arguments, dict)


def test_it_updates_only_rows_matching_every_condition_and_says_how_many(make_call):
    call = make_call()
    missed = rows.update(Call, {"id": call.pk, "version": call.version + 5}, {"provider_ref": "re_1"})
    assert missed == 0
    assert Call.objects.get(pk=call.pk).provider_ref == ""
    hit = rows.update(Call, {"id": call.pk, "version": call.version}, {"provider_ref": "re_1"})
    assert hit == 1
    assert Call.objects.get(pk=call.pk).provider_ref == "re_1"


def test_save_fields_writes_the_named_columns_and_leaves_the_others(make_call):
    call = make_call()
    attempt = rows.insert(_attempt(call))
    Attempt.objects.filter(pk=attempt.pk).update(error_code="written-elsewhere")
    attempt.facts, attempt.http_status, attempt.error_code = {"sent": True}, 503, "stale-in-memory"
    rows.save_fields(attempt, ["facts", "http_status"])
    stored = Attempt.objects.get(pk=attempt.pk)
    assert (stored.facts, stored.http_status, stored.error_code) == ({"sent": True}, 503, "written-elsewhere")


def test_a_save_signal_listener_still_hears_every_write(make_call):
    call = make_call()
    heard = []

    def listener(sender, instance, **kwargs):
        heard.append(kwargs.get("update_fields"))

    pre_save.connect(listener, sender=Attempt)
    try:
        attempt = rows.insert(_attempt(call))
        rows.save_fields(attempt, ["http_status"])
    finally:
        pre_save.disconnect(listener, sender=Attempt)
    assert heard == [None, frozenset({"http_status"})]


def test_the_call_reader_loads_the_call_and_its_relations_in_one_statement(make_call):
    call = make_call()
    with CaptureQueriesContext(connection) as queries:
        loaded = call_in_tenants(call.pk, {call.tenant_id})
        names = (loaded.tool.name, loaded.tool.provider.name, loaded.task.tenant.name, loaded.step.index)
    assert len(queries) == 1
    task = Task.objects.select_related("tenant").get(pk=call.task_id)
    step = Step.objects.get(pk=call.step_id)
    assert names == (call.tool.name, call.tool.provider.name, task.tenant.name, step.index)
    assert loaded.arguments == call.arguments and loaded.created_at == Call.objects.get(pk=call.pk).created_at


def test_the_call_reader_answers_nothing_outside_the_tenants_or_the_id_range(make_call):
    call = make_call()
    assert call_in_tenants(call.pk, {call.tenant_id + 1000}) is None
    assert call_in_tenants(call.pk, set()) is None
    assert call_in_tenants(2**63, {call.tenant_id}) is None


def test_a_lost_transition_race_leaves_the_callers_transaction_usable(make_call, actor):
    """transition_call runs without a savepoint: a refused UPDATE changed nothing, so the caller's transaction goes
    on and commits what else it did."""
    call = make_call()
    stale = Call.objects.get(pk=call.pk)
    transition_call(call, "SENT", actor=actor, reason="first")
    with transaction.atomic():
        rows.update(Call, {"id": call.pk}, {"provider_ref": "kept"})
        with pytest.raises(TransitionConflict):
            transition_call(stale, "SENT", actor=actor, reason="second, from an old read")
    stored = Call.objects.get(pk=call.pk)
    assert (stored.state, stored.version, stored.provider_ref) == ("SENT", call.version, "kept")

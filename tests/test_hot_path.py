"""recovery/statemachine/hot_path.py is SQL written once from the models, for the single-shot attempt and
reconciliation; each of its functions must read and write exactly what its ORM twin (RECOVERY_HOT_PATH_SQL off) does, on
the backend the suite runs on (SQLite by default, PostgreSQL in CI)."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import Attempt, AuditEvent, Breaker, Call, GateDecision, Receipt, Step, Task, Tenant
from recovery.registry import tool_policy
from recovery.selectors.context import gate_context
from recovery.services import attempts
from recovery.services.tokens import token_create
from recovery.statemachine import hot_path, hot_reads
from recovery.statemachine.transitions import TransitionConflict, transition_call


def _both(settings, read):
    """`read()` through the SQL, then through its ORM twin."""
    settings.RECOVERY_HOT_PATH_SQL = True
    sql = read()
    settings.RECOVERY_HOT_PATH_SQL = False
    orm = read()
    settings.RECOVERY_HOT_PATH_SQL = True
    return sql, orm


def _fields(instance) -> dict:
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}


ANNOTATIONS = hot_path._ANNOTATIONS


@pytest.fixture
def calls(registry, make_call, task):
    """Calls of every kind the admission read tells apart: a plain one; one with an attempt, receipts and a
    dependency with a call; one whose task has unsettled calls and whose tool has alternates and a breaker row."""
    alone = Task.objects.create(tenant=registry["tenant"], external_id="alone", agent="demo", goal="g")
    plain = make_call("READY", on_task=alone)
    busy = make_call("UNKNOWN", on_task=task)
    now = timezone.now()
    Attempt.objects.create(call=busy, attempt_id="a1", number=1, tool=busy.tool, arguments={}, fingerprint="f")
    for minutes in (5, 1):
        Receipt.objects.create(
            call=busy,
            provider=busy.tool.provider,
            source="poll",
            observed="pending" if minutes == 1 else "ambiguous",
            local_state_before="UNKNOWN",
            local_state_after="UNKNOWN",
            checked_at=now - timedelta(minutes=minutes),
        )
    later = Step.objects.create(task=task, index=5)
    later.depends_on.add(busy.step)
    dependent = make_call("READY", on_task=task)
    Call.objects.filter(pk=dependent.pk).update(step=later)
    lookup = registry["lookup"]
    lookup.alternates.add(registry["refund"])
    Breaker.objects.create(tool=lookup, state="open", opened_at=now)
    switched = make_call("RETRYABLE", tool=lookup, on_task=task)
    return {"plain": plain, "busy": busy, "dependent": dependent, "switched": switched, "tenant": registry["tenant"]}


def test_the_admission_read_is_the_orms_reading(calls, settings):
    tenants = {calls["tenant"].pk}
    expected = {
        "plain": (None, None, False, 1, False),  # stored, receipt, dependency calls, unsettled in task, alternates
        "busy": ("a1", "pending", False, 1, False),
        "dependent": (None, None, True, 1, False),
        "switched": (None, None, False, 1, True),
    }
    for name, call in [(n, c) for n, c in calls.items() if n != "tenant"]:
        attempt = "a1" if name == "busy" else "a9"
        (sql, sql_read), (orm, orm_read) = _both(
            settings, lambda c=call, a=attempt: hot_path.call_for_attempt(c.pk, tenants, attempt_id=a)
        )
        assert _fields(sql) == _fields(orm), name
        for related in ("tool", "task"):
            assert _fields(getattr(sql, related)) == _fields(getattr(orm, related)), (name, related)
        assert _fields(sql.tool.provider) == _fields(orm.tool.provider)
        sql_breaker, orm_breaker = sql_read.breaker_row, orm_read.breaker_row
        assert (sql_breaker and _fields(sql_breaker)) == (orm_breaker and _fields(orm_breaker)), name
        assert (sql_breaker is not None) == (name == "switched"), name
        assert {n: getattr(sql_read, n) for n in ANNOTATIONS} == {n: getattr(orm_read, n) for n in ANNOTATIONS}, name
        stored = Attempt.objects.get(attempt_id="a1").pk if name == "busy" else None
        assert (sql_read.stored_attempt_pk, sql_read.latest_receipt_observed) == (stored, expected[name][1])
        assert (sql_read.has_dependency_calls, sql_read.tool_has_alternates) == (expected[name][2], expected[name][4])
        assert sql_read.unsettled_in_task == (1 if name != "plain" else 0)
        with CaptureQueriesContext(connection) as read:
            assert (sql.tool.name, sql.tool.provider.name, sql.task.external_id) == (
                orm.tool.name,
                orm.tool.provider.name,
                orm.task.external_id,
            )
        assert len(read) == 0  # loaded with the call, as select_related loads them
    other = {calls["tenant"].pk + 1000}
    assert _both(settings, lambda: hot_path.call_for_attempt(calls["plain"].pk, other, attempt_id="a1")) == (None, None)
    assert _both(settings, lambda: hot_path.call_for_attempt(2**62, tenants, attempt_id="a1")) == (None, None)


def test_admission_reads_the_same_whether_it_is_handed_the_admission_read_or_not(calls, settings):
    """Explicit state: what the admission read brought along (AdmissionRead) only saves statements; a call loaded
    any other way (read None) is admitted on the same facts, so nothing depends on how the row was loaded."""
    now = timezone.now()
    tenants = {calls["tenant"].pk}
    for name in ("plain", "busy", "dependent", "switched"):
        for attempt_id in ("a1", "a9"):
            for sql in (True, False):
                settings.RECOVERY_HOT_PATH_SQL = sql
                loaded, read = hot_path.call_for_attempt(calls[name].pk, tenants, attempt_id=attempt_id)
                plain = Call.objects.select_related("tool__provider", "task").get(pk=calls[name].pk)
                contexts = [
                    gate_context(
                        call,
                        tool=tool_policy(call.tool),
                        candidate_tool=None,
                        executing_tool=call.tool,
                        task=call.task,
                        now=now,
                        approval=False,
                        read=given,
                    )
                    for call, given in ((loaded, read), (plain, None))
                ]
                assert contexts[0] == contexts[1], (name, attempt_id, sql)
                stored = [
                    attempts._stored_attempt(loaded, attempt_id, read=read),
                    attempts._stored_attempt(plain, attempt_id),
                ]
                assert stored[0] == stored[1], (name, attempt_id, sql)
    settings.RECOVERY_HOT_PATH_SQL = True


def test_a_state_update_writes_what_the_orm_writes(calls, settings):
    now = timezone.now()
    written = []
    for sql in (True, False):
        settings.RECOVERY_HOT_PATH_SQL = sql
        call = Call.objects.get(pk=calls["plain"].pk if sql else calls["dependent"].pk)
        stale = hot_path.update_call_state(
            call, "SENT", {"state": "SENT", "state_changed_at": now, "updated_at": now}, RuntimeError
        )  # not in that state: nothing changes
        moved = hot_path.update_call_state(
            call,
            "READY",
            {"state": "SENT", "state_changed_at": now, "updated_at": now, "attempts_count": 1},
            RuntimeError,
        )
        again = hot_path.update_call_state(  # the old version
            call, "READY", {"state": "SENT", "updated_at": now}, RuntimeError
        )
        after = Call.objects.get(pk=call.pk)
        written.append((stale, moved, again, after.state, after.version, after.attempts_count, after.state_changed_at))
    assert written[0] == written[1] == (0, 1, 0, "SENT", 1, 1, now)


def test_token_links_are_the_orms_reading(registry, settings):
    other = registry["tenant"].__class__.objects.create(name="globex", sandbox=True, all_tools=True)
    token, raw = token_create(name="runtime", tenants=["acme", "globex"], actor=Actor.system("t"))
    (sql, none), (orm, _) = _both(settings, lambda: hot_path.token_links(raw[:12]))
    assert [(_fields(t), _fields(n)) for t, n in sql] == [(_fields(t), _fields(n)) for t, n in orm]
    assert [n.name for _, n in sql] == ["acme", "globex"] and {t.pk for t, _ in sql} == {token.pk}
    assert other.pk in {n.pk for _, n in sql} and none is None
    assert _both(settings, lambda: hot_path.token_links("rc_unknown00")) == (([], None), ([], None))
    # The task a path names, read with the token: found only among the token's tenants, its tenant with it.
    mine = Task.objects.create(tenant=other, external_id="mine", agent="a", goal="g")
    alien = Tenant.objects.create(name="initech", sandbox=True, all_tools=True)
    theirs = Task.objects.create(tenant=alien, external_id="theirs", agent="a", goal="g")
    (_, sql), (_, orm) = _both(settings, lambda: hot_path.token_links(raw[:12], mine.pk))
    assert _fields(sql) == _fields(orm) == _fields(mine) and _fields(sql.tenant) == _fields(other)
    for absent in (theirs.pk, 2**62):
        assert _both(settings, lambda a=absent: hot_path.token_links(raw[:12], a)[1]) == (None, None)


def test_an_insert_writes_the_row_the_orm_writes(calls, settings):
    call = calls["plain"]
    rows = []
    for sql in (True, False):
        settings.RECOVERY_HOT_PATH_SQL = sql
        gate = hot_path.insert(
            GateDecision(
                call=call,
                candidate_attempt_id=f"a-{sql}",
                candidate={"tool": call.tool.name, "fingerprint": "f", "evidence": []},
                allowed=True,
                reason="first_attempt",
                checks=[{"name": "state", "passed": True, "detail": "READY"}],
                required_next={},
            )
        )
        assert gate.pk is not None and not gate._state.adding
        stored = GateDecision.objects.get(pk=gate.pk)
        rows.append({k: v for k, v in _fields(stored).items() if k not in ("id", "candidate_attempt_id", "created_at")})
        assert stored.created_at is not None  # auto_now_add, as the ORM fills it
    assert rows[0] == rows[1]


def test_the_task_counters_move_and_read_alike(task, settings):
    sql, orm = _both(settings, lambda: hot_path.count_on_task(task.pk, rounds=1, write_retries=1, tokens=5))
    assert (sql.rounds_used, sql.write_retries_used, sql.tokens_used) == (1, 1, 5)
    assert (orm.rounds_used, orm.write_retries_used, orm.tokens_used) == (2, 2, 10)
    assert Task.objects.filter(pk=task.pk).values_list("rounds_used", "tokens_used").get() == (2, 10)


def test_the_protected_calls_reads_are_the_orms_reading(calls, settings):
    """recovery/statemachine/hot_reads.py: the report's attempt, the registration's tool (a tenant with every tool,
    and one with a list) and the reports an admission hands back, as their ORM twins read them."""
    tenants = {calls["tenant"].pk}
    busy, switched = calls["busy"], calls["switched"]
    Attempt.objects.create(call=switched, attempt_id="a2", number=1, tool=switched.tool, arguments={}, fingerprint="f")
    for call, attempt_id in ((busy, "a1"), (switched, "a2")):
        sql, orm = _both(settings, lambda c=call, a=attempt_id: hot_reads.attempt_for_report(c.pk, a, tenants))
        assert _fields(sql) == _fields(orm) and sql.tool_has_alternates == orm.tool_has_alternates
        for related in ("tool", "call"):
            assert _fields(getattr(sql, related)) == _fields(getattr(orm, related)), related
        with CaptureQueriesContext(connection) as read:
            assert sql.tool.provider.name == orm.tool.provider.name
        assert len(read) == 0
    assert _both(settings, lambda: hot_reads.attempt_for_report(busy.pk, "a9", tenants)) == (None, None)
    assert _both(settings, lambda: hot_reads.attempt_for_report(busy.pk, "a1", {0})) == (None, None)

    listed = Tenant.objects.create(name="initech", sandbox=True, all_tools=False)
    listed.tools.add(calls["switched"].tool)
    for tenant, name in [
        (calls["tenant"], "order.lookup"),
        (listed, "order.lookup"),
        (calls["tenant"], "refund.create"),
    ]:
        task = Task(tenant=tenant, pk=busy.task_id)
        (sql, keyed), (orm, none) = _both(
            settings, lambda t=task, n=name: hot_reads.allowed_tool_and_key(t, n, busy.idempotency_key, "f")
        )
        assert none is None and keyed == hot_reads.key_and_intent(task, sql, busy.idempotency_key, "f")
        assert (_fields(sql), _fields(sql.provider), sql.has_alternates) == (
            _fields(orm),
            _fields(orm.provider),
            orm.has_alternates,
        )
    assert _both(settings, lambda: hot_reads.allowed_tool_and_key(Task(tenant=listed), "refund.create", "k", "f")) == (
        (None, None),
        (None, None),
    )

    now = timezone.now()
    Attempt.objects.filter(call=busy).update(admitted_at=now - timedelta(seconds=5))
    Attempt.objects.filter(call=switched).update(
        admitted_at=now - timedelta(seconds=9), reported_at=now, http_status=200
    )
    task_id = busy.task_id
    sql, orm = _both(settings, lambda: hot_reads.reported_2xx_since_last_admission(task_id))
    assert sql == orm == [(switched.pk, "a2", None, None)]
    Attempt.objects.filter(call=busy).update(admitted_at=now + timedelta(seconds=1))  # a later admission: none since
    assert _both(settings, lambda: hot_reads.reported_2xx_since_last_admission(task_id)) == ([], [])


def test_the_reports_locked_call_and_the_registrations_task_are_the_orms_reading(calls, settings):
    from django.db import transaction

    for call in (calls["busy"], calls["switched"]):
        with transaction.atomic():
            sql, orm = _both(settings, lambda c=call: hot_reads.locked_call(c.pk))
        assert [_fields(x) for x in (sql, sql.tool, sql.tool.provider, sql.task)] == [
            _fields(x) for x in (orm, orm.tool, orm.tool.provider, orm.task)
        ]
    with transaction.atomic(), pytest.raises(Call.DoesNotExist):
        hot_reads.locked_call(2**62)
    task, tenants = calls["busy"].task, {calls["tenant"].pk}
    sql, orm = _both(settings, lambda: hot_reads.task_in_tenants(task.pk, tenants))
    assert (_fields(sql), _fields(sql.tenant)) == (_fields(orm), _fields(orm.tenant))
    assert _both(settings, lambda: hot_reads.task_in_tenants(task.pk, {0})) == (None, None)
    assert _both(settings, lambda: hot_reads.task_in_tenants(2**62, tenants)) == (None, None)


def test_a_registrations_key_and_intent_read_is_the_orms_reading(calls, settings):
    busy, task = calls["busy"], calls["busy"].task
    twin = Call.objects.create(
        tenant=task.tenant,
        task=task,
        step=busy.step,
        tool=busy.tool,
        idempotency_key="other-key",
        arguments=busy.arguments,
        fingerprint=busy.fingerprint,
        side_effect=busy.side_effect,
        risk=busy.risk,
        state="READY",
    )
    cases = [
        (busy.tool, busy.idempotency_key, busy.fingerprint),  # the key found, and two calls of the same intent
        (busy.tool, "unused-key", busy.fingerprint),  # no key, the same intent
        (busy.tool, busy.idempotency_key, "another-print"),  # the key, no intent
        (calls["switched"].tool, busy.idempotency_key, "another-print"),  # the key under another tool: nothing
    ]
    for tool, key, print_ in cases:
        (sql, sql_same), (orm, orm_same) = _both(
            settings, lambda t=tool, k=key, p=print_: hot_reads.key_and_intent(task, t, k, p)
        )
        assert (sql and _fields(sql)) == (orm and _fields(orm)), key
        assert [_fields(c) for c in sql_same] == [_fields(c) for c in orm_same], key
    (found, same), _ = _both(
        settings, lambda: hot_reads.key_and_intent(task, busy.tool, busy.idempotency_key, busy.fingerprint)
    )
    assert (found.pk, [c.pk for c in same]) == (busy.pk, [busy.pk, twin.pk])


def _first_read_of(call, tenants):
    """The call as its registration holds it (read whole, its tool's alternates known as hot_reads.allowed_tool_and_key
    says), the AdmissionRead call_for_attempt gives, and first_admission_read's for the same call."""
    loaded, expected = hot_path.call_for_attempt(call.pk, tenants, attempt_id="a9")
    loaded.tool.has_alternates = expected.tool_has_alternates
    return loaded, expected, hot_path.first_admission_read(loaded)


def test_a_first_admissions_read_says_what_the_admission_read_says_of_a_call_with_no_attempt(calls):
    """hot_path.first_admission_read, for a call the same transaction registered: what call_for_attempt's read says
    of it, the task's 2xx reports since its last admission, and two keys no row has (PostgreSQL; None elsewhere,
    where the admission reads the call whole)."""
    tenants, now = {calls["tenant"].pk}, timezone.now()
    busy = calls["busy"]
    Attempt.objects.filter(call=busy).update(admitted_at=now - timedelta(seconds=5))
    answered = Attempt.objects.create(
        call=calls["switched"], attempt_id="a2", number=1, tool=calls["switched"].tool, arguments={}, fingerprint="f"
    )
    Attempt.objects.filter(pk=answered.pk).update(
        admitted_at=now - timedelta(seconds=9), reported_at=now, http_status=201
    )
    keys: tuple[set, set] = (set(), set())  # the attempts', the gate answers'
    for name in ("plain", "dependent", "switched"):
        loaded, expected, first = _first_read_of(calls[name], tenants)
        if connection.vendor != "postgresql":
            assert first is None
            continue
        assert {n: getattr(first, n) for n in ANNOTATIONS} == {n: getattr(expected, n) for n in ANNOTATIONS}, name
        assert (first.breaker_row and _fields(first.breaker_row)) == (
            expected.breaker_row and _fields(expected.breaker_row)
        ), name
        assert first.reported == hot_reads.reported_2xx_since_last_admission(loaded.task_id), name
        keys[0].add(first.reserved_ids[0])
        keys[1].add(first.reserved_ids[1])
        context = [
            gate_context(
                loaded,
                tool=tool_policy(loaded.tool),
                candidate_tool=None,
                executing_tool=loaded.tool,
                task=loaded.task,
                now=now,
                approval=False,
                read=read,
            )
            for read in (first, None)
        ]
        assert context[0] == context[1], name
    if connection.vendor == "postgresql":
        assert first.reported == [(answered.call_id, "a2", None, None)]  # the dependent's and switched's task
        assert len(keys[0]) == len(keys[1]) == 3 and not Attempt.objects.filter(pk__in=keys[0]).exists()
        assert not GateDecision.objects.filter(pk__in=keys[1]).exists()


@pytest.mark.postgres
def test_a_call_inserted_with_its_step_is_the_orms_row_and_reads_what_its_first_admission_reads(calls):
    """hot_path.insert_with_step: the step made or found, the call as the ORM writes it, whether the step is new, and
    the read first_admission_read makes after the insert (the reserved keys aside, which each statement draws)."""
    busy = calls["busy"]

    def new(key: str) -> Call:
        return Call(
            tenant=busy.tenant, task=busy.task, tool=busy.tool, idempotency_key=key, arguments={"n": key},
            fingerprint=f"f-{key}", side_effect=busy.tool.side_effect, risk=busy.tool.risk, outcome_timeout_s=30,
        )  # fmt: skip

    for index, key, made in ((5, "in-later", False), (9, "in-new", True)):  # step 5 waits on busy's step
        call, was_made, read = hot_path.insert_with_step(new(key), index, read=True)
        assert was_made is made and call.step.index == index and call.step.task_id == busy.task_id
        assert _fields(call) == _fields(Call.objects.get(pk=call.pk))
        after = hot_path.first_admission_read(call)
        assert replace(read, reserved_ids=None) == replace(after, reserved_ids=None), key
        assert read.has_dependency_calls is (index == 5) and read.unsettled_in_task == 1
    assert Step.objects.filter(task=busy.task, index=9).count() == 1
    assert hot_path.insert_with_step(new("in-new"), 9, read=True) == (None, False, None)  # its key is taken


def test_a_move_inside_a_pipelined_block_that_meets_a_moved_call_raises_its_conflict_and_records_nothing(calls):
    """hot_path.pipelined(): a call's move is answered at the block's end, and a move that did not hold (someone
    moved the call first) raises the transition's conflict there, the caller's transaction undone with the move's
    audit event."""
    stale = calls["plain"]
    events = AuditEvent.objects.filter(call_id=stale.pk, action="call.transition")
    first = transition_call(Call.objects.get(pk=stale.pk), "SENT", actor=Actor.system("t"), reason="another request")
    with pytest.raises(TransitionConflict), transaction.atomic(), hot_path.pipelined():
        transition_call(stale, "SENT", actor=Actor.system("t"), reason="attempt 1 admitted (first_attempt)")
    after = Call.objects.get(pk=stale.pk)
    assert (after.state, after.version) == ("SENT", first.version) and events.count() == 1


def test_a_calls_insert_answers_a_taken_key_with_no_row_and_a_pair_goes_in_as_the_orm_writes_it(calls, settings):
    from django.db import IntegrityError, transaction

    plain = calls["plain"]
    again = Call.objects.get(pk=plain.pk)
    again.pk, again._state.adding = None, True
    if hot_path.skips_conflicts(Call):
        with CaptureQueriesContext(connection) as ran:
            assert hot_path.insert_new(again) is None
        assert len(ran) == 1  # no savepoint around it
    else:
        with pytest.raises(IntegrityError), transaction.atomic():
            hot_path.insert_new(again)
    again.pk, again.idempotency_key = None, "key-new"
    assert hot_path.insert_new(again).pk == Call.objects.get(idempotency_key="key-new").pk

    rows = []
    top = max(Attempt.objects.order_by("-pk").values_list("pk", flat=True).first() or 0, 0)
    for sql in (True, False):
        settings.RECOVERY_HOT_PATH_SQL = sql
        attempt = Attempt(
            pk=top + 100 + sql, call=plain, attempt_id=f"a-{sql}", number=2 - sql, tool=plain.tool, arguments={"n": 1},
            fingerprint="f", response={"admitted": True},
        )  # fmt: skip
        gate = GateDecision(
            pk=top + 200 + sql, call=plain, attempt=attempt, candidate_attempt_id=f"a-{sql}", candidate={"tool": "t"},
            allowed=True, reason="first_attempt", checks=[], required_next={},
        )  # fmt: skip
        hot_path.insert_together(attempt, gate)
        assert not attempt._state.adding and not gate._state.adding
        stored = Attempt.objects.get(pk=attempt.pk), GateDecision.objects.get(pk=gate.pk)
        assert stored[1].attempt_id == attempt.pk
        skip = ("id", "attempt_id", "number", "candidate_attempt_id", "created_at")
        rows.append([{k: v for k, v in _fields(row).items() if k not in skip} for row in stored])
    settings.RECOVERY_HOT_PATH_SQL = True
    assert rows[0] == rows[1]


def test_a_reports_locked_call_read_alone_keeps_the_tool_and_task_read_with_its_attempt(calls):
    from django.db import transaction

    busy = calls["busy"]
    attempt = hot_reads.attempt_for_report(busy.pk, "a1", {calls["tenant"].pk})
    with transaction.atomic():
        whole = hot_reads.locked_call(busy.pk)
        alone = hot_reads.locked_call(busy.pk, tool=attempt.tool, task=attempt.call.task)
    assert _fields(alone) == _fields(whole)
    assert alone.tool is attempt.tool and alone.task is attempt.call.task
    assert (_fields(alone.tool), _fields(alone.task)) == (_fields(whole.tool), _fields(whole.task))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_registration_that_admits_its_first_attempt_costs_nine_statements(registry, task, client):
    """The protected call's one round trip before the send (docs/benchmarks.md, the protected benchmark): the token
    with the task its path names, the tool with what its key and intent have, the step and the call with what the
    first admission reads (one statement), the task's counters, the call moved, the attempt with its gate answer,
    and the audit events appended at the commit (three). Counted on the task's second call: its first makes the
    task's audit head and marks the token used."""
    _, raw = token_create(name="runtime", tenants=["acme"], actor=Actor.system("t"))

    def register(step: int):
        body = {"step": step, "tool": "refund.create", "arguments": {"order": step}, "idempotency_key": f"k-{step}"}
        return client.post(
            f"/api/v1/tasks/{task.pk}/calls",
            {**body, "admit": {"attempt_id": "a1"}},
            content_type="application/json",
            headers={"authorization": f"Bearer {raw}"},
        )

    register(1)
    with CaptureQueriesContext(connection) as ran, round_trips() as trips:
        answer = register(2)
    assert answer.status_code == 201, answer.content
    assert answer.json()["admission"]["attempt_id"] == "a1" and answer.json()["state"] == "SENT"
    stored = Attempt.objects.get(call_id=answer.json()["call_id"])
    assert stored.response == answer.json()["admission"]
    assert GateDecision.objects.get(attempt=stored).pk == answer.json()["admission"]["gate"]["id"]
    statements = [q["sql"] for q in ran if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == 9, "\n".join(statements)
    # With BEGIN and COMMIT, waited for one by one, they were 11 round trips. The attempt with its gate answer, the
    # task's counters and the call's move leave together (hot_path.pipelined: their answers in 1), and so do the
    # audit events' INSERT and the heads' UPDATE (1).
    assert trips == [8], "\n".join(statements)


@contextmanager
def round_trips() -> Iterator[list[int]]:
    """The round trips this thread's connection makes to PostgreSQL inside the block (appended at its end): from
    libpq's protocol trace, each run of messages the client sent that the server's answer then follows."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    counted: list[int] = []
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            yield counted
        finally:
            pgconn.untrace()
        trace.seek(0)
        sides = [line.split("\t")[1] for line in trace.read().splitlines() if line.count("\t") >= 2]
    counted.append(sum(1 for sent, answer in itertools.pairwise(sides) if (sent, answer) == ("F", "B")))

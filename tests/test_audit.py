"""The audit trail of docs/design/audit.md: hash-chained per task, a gap-free global sequence, append-only in the
database (except under the recorded maintenance switch), and every kind of tampering shows up in verify_audit."""

from __future__ import annotations

import io
import itertools
from contextlib import contextmanager

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from recovery.audit.chain import (
    GLOBAL,
    Actor,
    append_event,
    appends_at_commit,
    audit_maintenance,
    audit_purge_chains,
    event_hash,
    verify_all,
    verify_chain,
)
from recovery.models import ApiToken, AuditChainHead, AuditEvent, Task
from recovery.statemachine.transitions import transition_call

ROBOT = Actor.job("tests")
HASHED_FIELDS = [
    *("seq", "chain", "chain_seq", "prev_hash", "task_id", "call_id", "actor_kind", "actor_label", "actor_user_id"),
    *("actor_token_id", "action", "from_state", "to_state", "reason", "evidence", "created_at"),
]


def append(task: Task | None, count: int = 1, **fields) -> list[AuditEvent]:
    """`count` events on the task's chain (the system chain for None), committed together in one transaction."""
    with transaction.atomic():
        return [
            append_event(action="test.event", actor=ROBOT, task_id=task.pk if task else None, reason=f"r{i}", **fields)
            for i in range(count)
        ]


def chain_of(task: Task) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=f"task:{task.pk}").order_by("chain_seq"))


def all_seqs() -> list[int]:
    return list(AuditEvent.objects.order_by("seq").values_list("seq", flat=True))


def raw(sql: str, params: list | None = None) -> None:
    """Run one statement in its own savepoint, so a refused one leaves the test's transaction usable."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


@contextmanager
def guards_disabled():
    """Tamper the way someone with raw database access would: the append-only guard off at the database level,
    not through the recorded maintenance switch. Everything done inside (the tampering, the disabled guard) is
    undone when the block ends, so the test's own rollback and constraint checks see an untouched database."""
    with transaction.atomic():  # a savepoint inside the test's transaction
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET LOCAL session_replication_role = replica")  # no triggers, no FK checks
            else:
                for trigger in (  # SQLite DDL is transactional: the savepoint's rollback restores them
                    "recovery_auditevent_no_update",
                    "recovery_auditevent_no_delete",
                    "recovery_auditchainhead_forward_only",
                    "recovery_auditchainhead_no_delete",
                ):
                    cursor.execute(f"DROP TRIGGER {trigger}")
        yield
        transaction.set_rollback(True)


@pytest.fixture
def other_task(registry):
    return Task.objects.create(tenant=registry["tenant"], external_id="other-task", agent="demo", goal="g")


@pytest.fixture
def trail(task, other_task):
    """Two interleaved task chains: A1 B1 A2 A3 B2 A4 (global seq 1..6), one transaction each; verified good."""
    a, b = task, other_task
    events = {}
    for name, owner in [("A1", a), ("B1", b), ("A2", a), ("A3", a), ("B2", b), ("A4", a)]:
        (events[name],) = append(owner)
    assert [events[n].seq for n in ("A1", "B1", "A2", "A3", "B2", "A4")] == [1, 2, 3, 4, 5, 6]
    assert verify_all().ok
    return events


# --- appending -----------------------------------------------------------------------------------------------------


def test_it_numbers_each_chain_and_the_global_sequence_without_gaps(task, other_task):
    append(task, 2)
    append(other_task)
    append(None)  # the system chain
    append(task)
    append(other_task, 2)

    assert all_seqs() == list(range(1, 8))
    for owner, length in [(task, 3), (other_task, 3)]:
        events = chain_of(owner)
        assert [e.chain_seq for e in events] == list(range(1, length + 1))
        assert (events[0].prev_id, events[0].prev_hash) == (None, "")
        for before, after in itertools.pairwise(events):
            assert (after.prev_id, after.prev_hash) == (before.pk, before.hash)
            assert after.seq > before.seq
        head = AuditChainHead.objects.get(key=f"task:{owner.pk}")
        assert (head.length, head.head_event_id, head.head_hash) == (length, events[-1].pk, events[-1].hash)
        report = verify_chain(f"task:{owner.pk}")
        assert (report.ok, report.events, report.chains) == (True, length, 1)

    hashes = list(AuditEvent.objects.values_list("hash", flat=True))
    assert len(set(hashes)) == 7 and all(len(h) == 64 for h in hashes)
    assert AuditChainHead.objects.get(key=GLOBAL).length == 7
    report = verify_all()
    assert (report.ok, report.problem, report.events, report.chains) == (True, None, 7, 3)


def test_it_gives_a_rolled_back_event_number_to_the_next_one(task):
    append(task)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        append_event(action="test.event", actor=ROBOT, task_id=task.pk, reason="undone with its change")
        1 / 0  # noqa: B018  (the change the event recorded fails)
    append(task)

    assert all_seqs() == [1, 2]
    assert [e.chain_seq for e in chain_of(task)] == [1, 2]
    assert not AuditEvent.objects.filter(reason="undone with its change").exists()
    assert verify_all().ok


def test_appends_at_commit_appends_the_queued_events_in_order_when_its_block_ends(task, other_task):
    append(task)
    with transaction.atomic(), appends_at_commit():
        assert append_event(action="test.event", actor=ROBOT, task_id=task.pk, reason="first") is None
        append_event(action="test.event", actor=ROBOT, task_id=other_task.pk, reason="second")
        with appends_at_commit():  # nested: the outer block appends
            append_event(action="test.event", actor=ROBOT, task_id=task.pk, reason="third")
        assert AuditEvent.objects.count() == 1  # nothing appended yet, no head locked
    events = list(AuditEvent.objects.order_by("seq"))
    assert [(e.seq, e.reason) for e in events] == [(1, "r0"), (2, "first"), (3, "second"), (4, "third")]
    assert [e.chain_seq for e in chain_of(task)] == [1, 2, 3]
    assert events[1].created_at <= events[2].created_at <= events[3].created_at
    assert verify_all().ok


def test_appends_at_commit_appends_nothing_when_its_block_fails(task):
    with pytest.raises(ZeroDivisionError), transaction.atomic(), appends_at_commit():
        append_event(action="test.event", actor=ROBOT, task_id=task.pk, reason="undone with its change")
        1 / 0  # noqa: B018
    append(task)
    assert all_seqs() == [1]
    assert verify_all().ok


def test_appends_at_commit_fails_loudly_when_an_error_that_undid_queued_events_is_caught_inside(task):
    """The rule the block protects: an event is appended only with its change. A savepoint rolled back inside the
    block undoes the change its events recorded; catching that error and going on would append them anyway."""
    append(task)
    with pytest.raises(RuntimeError, match=r"rolled back"), transaction.atomic(), appends_at_commit():
        append_event(action="test.event", actor=ROBOT, task_id=task.pk, reason="kept change")
        try:
            with transaction.atomic():
                Task.objects.filter(pk=task.pk).update(goal="undone")
                append_event(action="test.event", actor=ROBOT, task_id=task.pk, reason="undone change")
                raise ValueError("the change fails")
        except ValueError:
            pass  # caught inside the block: the mistake the block refuses
    assert all_seqs() == [1]  # the whole transaction rolled back, its events with it
    assert Task.objects.get(pk=task.pk).goal != "undone"
    assert verify_all().ok


def test_appends_at_commit_keeps_events_of_savepoints_that_stood_or_held_none(task):
    with transaction.atomic(), appends_at_commit():
        with transaction.atomic():  # released: its change and its event stand
            append_event(action="test.event", actor=ROBOT, task_id=task.pk, reason="in a savepoint kept")
        with pytest.raises(IntegrityError), transaction.atomic():  # rolled back, holding no event: fine
            Task.objects.create(tenant=task.tenant, external_id=task.external_id, agent="a", goal="g")
        append_event(action="test.event", actor=ROBOT, task_id=task.pk, reason="after")
    assert [e.reason for e in chain_of(task)] == ["in a savepoint kept", "after"]
    assert verify_all().ok


@pytest.mark.django_db(transaction=True)
def test_it_refuses_to_append_or_open_maintenance_outside_a_transaction(task):
    assert not connection.in_atomic_block
    with pytest.raises(RuntimeError, match=r"transaction\.atomic"):
        append_event(action="test.event", actor=ROBOT, task_id=task.pk, reason="no transaction")
    with pytest.raises(RuntimeError, match=r"transaction\.atomic"), audit_maintenance(reason="cleanup", actor=ROBOT):
        pass
    assert not AuditEvent.objects.exists()


def test_it_records_who_moved_a_call_from_where_to_where_and_why(make_call, task):
    user = get_user_model().objects.create_user("rita")
    call = make_call("READY")
    evidence = {
        "amount": 800.0,
        "fee": 0.1 + 0.2,
        "tiny": 1.5e-7,
        "provider": {"status": "settled", "ref": "re_123", "lines": [{"cents": 800.0, "rate": 0.25}, [1.0, -2.5]]},
        "note": "€ 800.0",
    }

    transition_call(call, "SENT", actor=Actor.for_user(user), reason="admitted by the gate", evidence=evidence)
    transition_call(call, "UNKNOWN", actor=Actor.job("sweeper"), reason="no outcome within 30 s")

    first, second = AuditEvent.objects.filter(call=call).order_by("seq")
    assert (first.actor_kind, first.actor_label, first.actor_user_id) == ("user", "user:rita", user.pk)
    assert (first.action, first.from_state, first.to_state) == ("call.transition", "READY", "SENT")
    assert (first.reason, first.task_id, first.chain) == ("admitted by the gate", task.pk, f"task:{task.pk}")
    assert first.evidence == {  # as read back from the database: 800.0 and 800 are the same amount
        "amount": 800,
        "fee": 0.30000000000000004,
        "tiny": 1.5e-7,
        "provider": {"status": "settled", "ref": "re_123", "lines": [{"cents": 800, "rate": 0.25}, [1, -2.5]]},
        "note": "€ 800.0",
    }
    assert type(first.evidence["amount"]) is int  # stored (and exported) as written into the hash: 800, not 800.0
    assert (second.actor_label, second.from_state, second.to_state) == ("job:sweeper", "SENT", "UNKNOWN")
    assert (second.prev_id, second.chain_seq) == (first.pk, 2)
    assert verify_chain(f"task:{task.pk}").ok
    assert verify_all().ok


def test_it_records_an_agent_tokens_transition(make_call, task):
    token = ApiToken.objects.create(name="runtime-1", prefix="rc_abc", digest="0" * 64)
    call = make_call("READY")
    transition_call(call, "SENT", actor=Actor.for_token(token), reason="admitted", evidence={"attempt": "a-1"})
    event = AuditEvent.objects.get(call=call)
    assert (event.actor_kind, event.actor_label, event.actor_token_id) == ("token", "token:runtime-1", token.pk)
    assert verify_all().ok


# --- append-only in the database -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE recovery_auditevent SET reason = 'nothing happened' WHERE chain = %s",
        "UPDATE recovery_auditevent SET to_state = 'NOT_COMMITTED' WHERE chain = %s",
        "DELETE FROM recovery_auditevent WHERE chain = %s",
        "DELETE FROM recovery_auditevent WHERE chain = %s AND chain_seq = 2",
    ],
    ids=["update-reason", "update-state", "delete-chain", "delete-tail"],
)
def test_it_refuses_raw_sql_that_rewrites_or_removes_events(task, sql):
    append(task, 2)
    before = list(AuditEvent.objects.order_by("seq").values())

    with pytest.raises(IntegrityError):
        raw(sql, [f"task:{task.pk}"])

    assert list(AuditEvent.objects.order_by("seq").values()) == before
    assert verify_all().ok


def test_it_refuses_an_orm_update_of_events(task):
    append(task, 2)
    with pytest.raises(IntegrityError), transaction.atomic():
        AuditEvent.objects.filter(chain=f"task:{task.pk}").update(reason="rewritten")
    assert not AuditEvent.objects.filter(reason="rewritten").exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_refuses_truncate_on_postgresql(task):
    # Committed rows, as in production: inside the test's transaction PostgreSQL would refuse to truncate rows it
    # has just inserted for a reason of its own ("pending trigger events" of the deferred foreign keys).
    append(task, 3)
    with pytest.raises(IntegrityError, match="append-only"):
        raw("TRUNCATE recovery_auditevent CASCADE")
    assert AuditEvent.objects.count() == 3
    assert verify_all().ok


# --- the maintenance switch ----------------------------------------------------------------------------------------


def test_it_allows_a_delete_under_the_maintenance_switch_and_records_its_use(task, other_task):
    append(task, 2)
    append(other_task)
    chain = f"task:{task.pk}"

    with transaction.atomic(), audit_maintenance(reason="retention: task older than 7 years", actor=ROBOT):
        # Retention removes a whole chain with its head, so no remaining row points at a removed one.
        raw("DELETE FROM recovery_auditchainhead WHERE key = %s", [chain])
        raw("DELETE FROM recovery_auditevent WHERE chain = %s", [chain])
        assert not AuditEvent.objects.filter(chain=chain).exists()

    assert not AuditEvent.objects.filter(chain=chain).exists()
    record = AuditEvent.objects.get(action="audit.maintenance")
    assert (record.reason, record.actor_label, record.chain) == (
        "retention: task older than 7 years",
        "job:tests",
        "system",
    )
    assert record.seq == AuditChainHead.objects.get(key=GLOBAL).length  # chained and numbered like any event
    assert verify_chain("system").ok
    assert verify_chain(f"task:{other_task.pk}").ok

    # After the block the guard refuses again, in the same transaction too.
    with pytest.raises(IntegrityError):
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [record.pk])
    with pytest.raises(IntegrityError):
        raw("UPDATE recovery_auditevent SET reason = '' WHERE id = %s", [record.pk])
    assert AuditEvent.objects.get(pk=record.pk).reason == "retention: task older than 7 years"


def test_it_turns_the_switch_off_when_the_maintenance_block_fails(task):
    (event,) = append(task)
    with transaction.atomic():
        with pytest.raises(ZeroDivisionError), audit_maintenance(reason="cleanup", actor=ROBOT):
            1 / 0  # noqa: B018
        with pytest.raises(IntegrityError):
            raw("DELETE FROM recovery_auditevent WHERE id = %s", [event.pk])
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_it_lets_a_database_error_inside_the_maintenance_block_reach_the_caller(task):
    (event,) = append(task)
    duplicate_head = "INSERT INTO recovery_auditchainhead (key, length, head_hash, updated_at) VALUES (%s, 0, '', %s)"
    with (
        pytest.raises(IntegrityError),
        transaction.atomic(),
        audit_maintenance(reason="retention", actor=ROBOT),
        connection.cursor() as cursor,
    ):
        cursor.execute("DELETE FROM recovery_auditevent WHERE id = %s", [event.pk])
        cursor.execute(duplicate_head, [GLOBAL, timezone.now()])  # the job's next statement fails
    assert AuditEvent.objects.filter(pk=event.pk).exists()


@pytest.mark.parametrize("reason", ["", "   "])
def test_it_refuses_maintenance_without_a_reason(task, reason):
    (event,) = append(task)
    with transaction.atomic():
        with pytest.raises(ValueError, match="reason"), audit_maintenance(reason=reason, actor=ROBOT):
            raw("DELETE FROM recovery_auditevent WHERE id = %s", [event.pk])
        with pytest.raises(IntegrityError):
            raw("DELETE FROM recovery_auditevent WHERE id = %s", [event.pk])
    assert AuditEvent.objects.filter(pk=event.pk).exists()
    assert not AuditEvent.objects.filter(action="audit.maintenance").exists()


@pytest.mark.django_db(transaction=True)
def test_it_keeps_an_event_another_one_links_to_even_under_the_maintenance_switch(task):
    first, _, _ = append(task, 3)
    with pytest.raises(IntegrityError), transaction.atomic(), audit_maintenance(reason="punch a hole", actor=ROBOT):
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [first.pk])  # the foreign key refuses at commit
    assert AuditEvent.objects.filter(pk=first.pk).exists()
    assert not AuditEvent.objects.filter(action="audit.maintenance").exists()  # rolled back with the delete
    assert verify_all().ok


def test_it_verifies_after_retention_purged_whole_chains(task, other_task):
    append(task, 2)
    append(other_task)
    removed = audit_purge_chains(chains=[f"task:{task.pk}"], reason="retention: closed > 7 years", actor=ROBOT)
    assert removed == 2
    assert not AuditEvent.objects.filter(chain=f"task:{task.pk}").exists()
    record = AuditEvent.objects.get(action="audit.maintenance")
    assert record.evidence["purged_chains"] == [f"task:{task.pk}"]
    report = verify_all()
    assert report.ok, report.problem


def test_a_purge_record_does_not_excuse_other_missing_events(task, other_task):
    append(task, 2)
    (kept,) = append(other_task)
    audit_purge_chains(chains=[f"task:{task.pk}"], reason="retention", actor=ROBOT)
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [kept.pk])
        assert not verify_all().ok


def test_it_never_purges_the_system_chain(task):
    with pytest.raises(ValueError, match="never purged"):
        audit_purge_chains(chains=["system"], reason="retention", actor=ROBOT)


def test_chain_heads_only_move_forward(task):
    append(task, 2)
    chain = f"task:{task.pk}"
    with pytest.raises(IntegrityError):
        raw("UPDATE recovery_auditchainhead SET length = 1 WHERE key = %s", [chain])
    with pytest.raises(IntegrityError):
        raw("UPDATE recovery_auditchainhead SET length = length + 5 WHERE key = %s", [chain])
    with pytest.raises(IntegrityError):
        raw("DELETE FROM recovery_auditchainhead WHERE key = %s", [chain])
    assert AuditChainHead.objects.get(key=chain).length == 2
    assert verify_all().ok


# --- tampering with the guards off -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("reason", "nothing happened"),
        ("evidence", '{"amount": 99999}'),
        ("to_state", "NOT_COMMITTED"),
        ("actor_label", "user:someone-else"),
    ],
)
def test_it_detects_an_edited_event(trail, task, column, value):
    middle = trail["A2"]
    with guards_disabled():
        raw(f"UPDATE recovery_auditevent SET {column} = %s WHERE id = %s", [value, middle.pk])
        assert getattr(AuditEvent.objects.get(pk=middle.pk), column) != getattr(middle, column)
        report, chain_report = verify_all(), verify_chain(f"task:{task.pk}")
    assert not report.ok
    assert "edited" in report.problem
    assert f"chain task:{task.pk} event #2 (seq 3)" in report.problem
    assert "edited" in chain_report.problem
    # Outside the block the tampering is undone and the guard is back.
    assert verify_all().ok
    with pytest.raises(IntegrityError):
        raw(f"UPDATE recovery_auditevent SET {column} = %s WHERE id = %s", [value, middle.pk])


def test_it_detects_an_edited_event_whose_hash_was_recomputed(trail, task):
    middle = trail["A2"]
    forged = event_hash(**{field: getattr(middle, field) for field in HASHED_FIELDS} | {"reason": "nothing happened"})
    with guards_disabled():
        raw("UPDATE recovery_auditevent SET reason = 'nothing happened', hash = %s WHERE id = %s", [forged, middle.pk])
        report = verify_all()
    # Its hash matches its new content, but not the HMAC made with the audit key (kept outside the database); the
    # next event's link to the old hash is broken too, further on.
    assert report.problem == (
        f"chain task:{task.pk} event #2 (seq 3) does not match its HMAC (key 'dev'): rewritten by someone without "
        "the audit key"
    )


def test_it_detects_a_removed_tail(trail, task):
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [trail["A4"].pk])  # also the last global event
        report, chain_report = verify_all(), verify_chain(f"task:{task.pk}")
    assert "global sequence ends at #5 but the head says #6: the tail was removed" in report.problem
    assert f"chain task:{task.pk} ends at #3 but its head says #4: the tail was removed" in chain_report.problem


def test_it_detects_a_removed_tail_of_a_chain_in_the_middle_of_the_global_sequence(trail, other_task):
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [trail["B2"].pk])
        report, chain_report = verify_all(), verify_chain(f"task:{other_task.pk}")
    assert "global sequence gap: event #5 is missing" in report.problem
    assert f"chain task:{other_task.pk} ends at #1 but its head says #2: the tail was removed" in chain_report.problem


def test_it_detects_a_removed_tail_even_when_the_global_counter_was_rewound(trail, task):
    """With the guards off at the database level, a tamperer can rewind the global head too."""
    b2 = trail["B2"]
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [trail["A4"].pk])
        raw(
            "UPDATE recovery_auditchainhead SET length = 5, head_hash = %s, head_event_id = %s WHERE key = %s",
            [b2.hash, b2.pk, GLOBAL],
        )
        report = verify_all()
    assert report.problem == f"chain task:{task.pk} ends at #3 but its head says #4: the tail was removed"


def test_it_detects_a_removed_middle_event(trail, task):
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [trail["A2"].pk])
        report, chain_report = verify_all(), verify_chain(f"task:{task.pk}")
    assert report.problem == "global sequence gap: event #3 is missing (next present is #4)"
    assert chain_report.problem == f"chain task:{task.pk}: event #2 is missing (next present is #3)"


def test_it_detects_a_removed_middle_event_when_the_rest_was_renumbered(trail, task):
    """Closing the gaps (and rewinding the global counter) still leaves a broken hash link."""
    chain = f"task:{task.pk}"
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [trail["A2"].pk])
        # Two steps through negative numbers, so no row collides with another on the unique columns.
        raw("UPDATE recovery_auditevent SET seq = -seq WHERE seq > 3")
        raw("UPDATE recovery_auditevent SET seq = -seq - 1 WHERE seq < 0")
        raw("UPDATE recovery_auditevent SET chain_seq = -chain_seq WHERE chain = %s AND chain_seq > 2", [chain])
        raw("UPDATE recovery_auditevent SET chain_seq = -chain_seq - 1 WHERE chain = %s AND chain_seq < 0", [chain])
        raw("UPDATE recovery_auditchainhead SET length = length - 1 WHERE key IN (%s, %s)", [GLOBAL, chain])
        assert all_seqs() == [1, 2, 3, 4, 5]
        assert [e.chain_seq for e in chain_of(task)] == [1, 2, 3]
        report = verify_all()
    assert report.problem == f"chain {chain} event #2 (seq 3) does not link to the event before it"


def test_it_detects_a_removed_chain_whose_head_was_kept(trail, other_task):
    chain = f"task:{other_task.pk}"
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE chain = %s", [chain])
        report, chain_report = verify_all(), verify_chain(chain)
    assert report.problem == "global sequence gap: event #2 is missing (next present is #3)"
    assert chain_report.problem == f"chain {chain} has a head but no events: they were removed"


def test_it_detects_a_removed_chain_at_the_end_even_when_the_global_counter_was_rewound(trail, registry):
    late = Task.objects.create(tenant=registry["tenant"], external_id="late-task", agent="demo", goal="g")
    append(late, 3)  # global seq 7..9
    a4 = trail["A4"]
    chain = f"task:{late.pk}"
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE chain = %s", [chain])
        raw(
            "UPDATE recovery_auditchainhead SET length = 6, head_hash = %s, head_event_id = %s WHERE key = %s",
            [a4.hash, a4.pk, GLOBAL],
        )
        report = verify_all()
    assert report.problem == f"chain {chain} has a head but no events: they were removed"


# --- the verify_audit command --------------------------------------------------------------------------------------


def test_verify_audit_reports_a_good_trail(trail):
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    assert "audit trail OK: 6 events in 2 chains verified" in out.getvalue()


def test_verify_audit_fails_on_a_broken_trail(trail, task, other_task):
    with guards_disabled():
        raw("UPDATE recovery_auditevent SET reason = 'nothing happened' WHERE id = %s", [trail["A3"].pk])
        with pytest.raises(CommandError, match=r"audit trail BROKEN: .*its content was edited"):
            call_command("verify_audit", stdout=io.StringIO())
        with pytest.raises(CommandError, match="BROKEN"):
            call_command("verify_audit", "--chain", f"task:{task.pk}", stdout=io.StringIO())
        out = io.StringIO()
        call_command("verify_audit", "--chain", f"task:{other_task.pk}", stdout=out)  # the untouched chain
    assert "audit trail OK: 2 events in 1 chains verified" in out.getvalue()

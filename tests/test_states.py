"""The state table of docs/design/state-machine.md, enforced twice: by transitions.py and by the database trigger
generated from it."""

from __future__ import annotations

import re

import pytest
from django.db import IntegrityError, connection, transaction

from recovery.engine.states import ALLOWED_PAIRS, EDGES, CallState
from recovery.models import AuditEvent, Call
from recovery.statemachine import dbguards
from recovery.statemachine.transitions import IllegalTransition, transition_call

S = CallState
ALL_PAIRS = [(src, dst) for src in S for dst in S if src != dst]

# docs/design/state-machine.md transcribed independently of recovery/engine/states.py, so a typo in one shows up against
# the other.
SPEC_EDGES = {
    "READY": {"SENT", "FAILED_PERMANENT"},
    "SENT": {"COMMITTED", "RETRYABLE", "UNKNOWN", "ACCEPTED", "FAILED_PERMANENT", "HUMAN_REVIEW"},
    "RETRYABLE": {"SENT", "FAILED_PERMANENT", "HUMAN_REVIEW"},
    "ACCEPTED": {"COMMITTED", "FAILED_PERMANENT", "UNKNOWN", "HUMAN_REVIEW"},
    "UNKNOWN": {"COMMITTED", "NOT_COMMITTED", "STILL_UNKNOWN", "HUMAN_REVIEW", "SENT"},
    "STILL_UNKNOWN": {"COMMITTED", "NOT_COMMITTED", "HUMAN_REVIEW", "SENT"},
    "NOT_COMMITTED": {"RETRYABLE", "FAILED_PERMANENT"},
    "HUMAN_REVIEW": {"COMMITTED", "NOT_COMMITTED", "FAILED_PERMANENT", "RETRYABLE", "SENT"},
    "COMMITTED": {"COMPENSATING", "HUMAN_REVIEW"},
    "COMPENSATING": {"COMPENSATED", "PARTIAL_COMPENSATED", "COMPENSATION_FAILED"},
    "PARTIAL_COMPENSATED": {"COMPENSATING", "HUMAN_REVIEW"},
    "COMPENSATION_FAILED": {"COMPENSATING", "HUMAN_REVIEW"},
    "FAILED_PERMANENT": set(),
    "COMPENSATED": set(),
}
# "any other state -> HUMAN_REVIEW when a write's execution is reported that admission would have refused"
for _src, _targets in SPEC_EDGES.items():
    if _src != "HUMAN_REVIEW":
        _targets.add("HUMAN_REVIEW")


def test_it_matches_the_spec_table():
    assert {str(src): {str(dst) for dst in targets} for src, targets in EDGES.items()} == SPEC_EDGES
    assert set(EDGES) == set(S)


def test_committed_is_never_sent_again():
    assert S.SENT not in EDGES[S.COMMITTED]
    assert not any(dst == S.SENT for src, dst in ALLOWED_PAIRS if src in {"COMMITTED", "COMPENSATED"})


@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_transition_function_follows_the_table(make_call, actor, src, dst):
    call = make_call(src)
    allowed = (str(src), str(dst)) in ALLOWED_PAIRS
    if allowed:
        transition_call(call, dst, actor=actor, reason="table test")
        call.refresh_from_db()
        assert (call.state, call.version) == (dst, 1)
        assert AuditEvent.objects.filter(call=call, from_state=src, to_state=dst).count() == 1
    else:
        with pytest.raises(IllegalTransition):
            transition_call(call, dst, actor=actor, reason="table test")
        call.refresh_from_db()
        assert (call.state, call.version) == (src, 0)
        assert not AuditEvent.objects.filter(call=call).exists()


def _raw_update(call_id: int, state: str, version: int) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE recovery_call SET state = %s, version = %s WHERE id = %s", [state, version, call_id])


@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_database_trigger_follows_the_table(make_call, src, dst):
    call = make_call(src)
    if (str(src), str(dst)) in ALLOWED_PAIRS:
        _raw_update(call.pk, dst, 1)
        assert Call.objects.get(pk=call.pk).state == dst
    else:
        with pytest.raises(IntegrityError):
            _raw_update(call.pk, dst, 1)
        assert Call.objects.get(pk=call.pk).state == src


def test_raw_sql_along_a_forbidden_edge_fails(make_call):
    call = make_call("COMMITTED")
    with pytest.raises(IntegrityError):
        _raw_update(call.pk, "SENT", 1)  # the blind replay of a committed refund
    assert Call.objects.get(pk=call.pk).state == "COMMITTED"


@pytest.mark.parametrize("version", [0, 2, 7])
def test_a_state_change_must_bump_the_version_by_one(make_call, version):
    call = make_call("READY")
    with pytest.raises(IntegrityError):
        _raw_update(call.pk, "SENT", version)
    assert Call.objects.get(pk=call.pk).version == 0


def test_the_version_changes_only_with_the_state(make_call):
    call = make_call("UNKNOWN")
    with pytest.raises(IntegrityError):
        _raw_update(call.pk, "UNKNOWN", 1)
    # Other columns (counters, receipts, leases) change freely without touching the version.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE recovery_call SET checks_made = checks_made + 1 WHERE id = %s", [call.pk])
    call.refresh_from_db()
    assert (call.checks_made, call.version) == (1, 0)


def test_installed_trigger_matches_the_state_table(db):
    """Fails when states.py changed without a migration that re-installs the trigger."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'recovery_call_state_guard'")
        else:
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'recovery_call_state_edge'")
        source = cursor.fetchone()[0]
    installed = set(re.findall(r"'([A-Z_]+)>([A-Z_]+)'", source))
    assert installed == set(ALLOWED_PAIRS)
    assert dbguards.ALLOWED_PAIRS == ALLOWED_PAIRS

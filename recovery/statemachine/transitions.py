"""The one function that moves a call between states (docs/design/state-machine.md), and its twin for compensation
entries (docs/compensation.md): a conditional UPDATE with its audit event in one transaction; a lost race raises
TransitionConflict, an edge not in the table IllegalTransition.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.db.models.expressions import Combinable
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.compensation_states import EntryState
from recovery.engine.compensation_states import is_allowed as entry_edge_allowed
from recovery.engine.states import CallState, is_allowed
from recovery.models import Call, CompensationEntry
from recovery.statemachine.hot_path import update_call_state
from recovery.statemachine.notices import NEEDS_PERSON, notice_call_moved
from recovery.statemachine.watch import announce

_FORBIDDEN_CHANGES = {"id", "state", "version", "state_changed_at", "task", "task_id", "tenant", "tenant_id"}


class IllegalTransition(Exception):
    """The state table has no such edge."""


class TransitionConflict(Exception):
    """The call was changed by someone else since it was read: re-read it and decide again."""


def transition_call(
    call: Call,
    to: CallState | str,
    *,
    actor: Actor,
    reason: str,
    evidence: dict | None = None,
    changes: dict[str, Any] | None = None,
    action: AuditAction = AuditAction.CALL_TRANSITION,
) -> Call:
    """Move `call` from the state and version it was read with to `to`; update `call` in place and return it.

    `changes` are other columns written by the same UPDATE (e.g. next_check_at, provider_ref), so a state and the
    facts that justify it can never be seen apart: plain values (the facts as they were decided), not expressions.
    """
    src, dst = CallState(call.state), CallState(to)
    if not is_allowed(src, dst):
        raise IllegalTransition(f"call {call.pk}: {src} -> {dst} is not an edge of the state table")
    if not reason.strip():
        raise ValueError("a transition needs a reason")
    changes = dict(changes or {})
    if bad := sorted(_FORBIDDEN_CHANGES & set(changes)):
        raise ValueError(f"transition_call() cannot change {', '.join(bad)} through `changes`")
    if expressions := sorted(name for name, value in changes.items() if isinstance(value, Combinable)):
        raise ValueError(f"transition_call() writes plain values: {', '.join(expressions)} is an expression")
    if changes.get("outcome") and (evidence is None or isinstance(evidence, dict)):
        # The outcome a move sets (retry_exhausted, poll_budget_exhausted, duplicate_effect...) is part of its story,
        # and what the metrics fold counts budget exhaustion and human takeovers by (recovery.engine.metrics).
        evidence = {**(evidence or {}), "outcome": changes["outcome"]}
    now = timezone.now()

    # No savepoint: a refused UPDATE changes nothing, so there is nothing to roll back to, and the conflict is
    # raised after the block, which leaves a caller's transaction usable. Two statements fewer per transition.
    conflict = partial(_conflict, call.pk, src, call.version)
    # Inside hot_path.pipelined(), the UPDATE's answer is read at the block's end, which raises the conflict then.
    with transaction.atomic(savepoint=False):
        updated = _update(call, src, dst, now, changes, conflict)
        if updated == 1:
            append_event(
                action=action,
                actor=actor,
                task_id=call.task_id,
                call_id=call.pk,
                from_state=src,
                to_state=dst,
                reason=reason,
                evidence=evidence,
            )
            if src in NEEDS_PERSON or dst in NEEDS_PERSON:  # who must hear of it (recovery.statemachine.notices)
                notice_call_moved(call, src, dst, outcome=changes.get("outcome", call.outcome))
    if updated != 1:
        raise conflict()
    announce(
        call.pk
    )  # long polls waiting on this call answer once the change is committed (recovery.statemachine.watch)
    call.state, call.version, call.state_changed_at, call.updated_at = dst, call.version + 1, now, now
    for name, value in changes.items():
        setattr(call, name, value)
    return call


def _conflict(call_id: int, src: CallState, version: int) -> TransitionConflict:
    return TransitionConflict(f"call {call_id} is no longer {src} at version {version}: someone else changed it first")


def _update(call: Call, src: CallState, dst: CallState, now, changes: dict[str, Any], conflict) -> int:
    """The conditional UPDATE on (id, state, version), the version bumped by one; the number of rows it changed (1,
    or 0 on a conflict). Every attempt moves its call twice: the statement is the hot path's
    (recovery.statemachine.hot_path)."""
    values = {"state": dst, "state_changed_at": now, "updated_at": now, **changes}
    return update_call_state(call, src, values, conflict)


_ENTRY_FORBIDDEN_CHANGES = {"id", "state", "version", "state_changed_at", "call", "call_id", "number"}


def transition_entry(
    entry: CompensationEntry,
    to: EntryState | str,
    *,
    actor: Actor,
    reason: str,
    evidence: dict | None = None,
    changes: dict[str, Any] | None = None,
) -> CompensationEntry:
    """Move a compensation ledger entry as transition_call moves a call: an edge of recovery.engine.compensation_states,
    a conditional UPDATE on (id, state, version) with the version bumped, and the audit event on the original call's
    task chain in the same transaction; TransitionConflict when someone else moved it first."""
    src, dst = EntryState(entry.state), EntryState(to)
    if not entry_edge_allowed(src, dst):
        raise IllegalTransition(f"compensation {entry.pk}: {src} -> {dst} is not an edge of the entry state table")
    if not reason.strip():
        raise ValueError("a transition needs a reason")
    changes = dict(changes or {})
    if bad := sorted(_ENTRY_FORBIDDEN_CHANGES & set(changes)):
        raise ValueError(f"transition_entry() cannot change {', '.join(bad)} through `changes`")
    if expressions := sorted(name for name, value in changes.items() if isinstance(value, Combinable)):
        raise ValueError(f"transition_entry() writes plain values: {', '.join(expressions)} is an expression")
    now = timezone.now()
    with transaction.atomic(savepoint=False):
        updated = CompensationEntry.objects.filter(pk=entry.pk, state=src, version=entry.version).update(
            state=dst, version=entry.version + 1, state_changed_at=now, updated_at=now, **changes
        )
        if updated == 1:
            append_event(
                action=AuditAction.COMPENSATION_TRANSITION,
                actor=actor,
                task_id=entry.call.task_id,  # loaded once if the caller had not
                call_id=entry.call_id,
                from_state=src,
                to_state=dst,
                reason=reason,
                evidence={"compensation": entry.pk, "entry": entry.number, **(evidence or {})},
            )
    if updated != 1:
        raise TransitionConflict(
            f"compensation {entry.pk} is no longer {src} at version {entry.version}: someone else changed it first"
        )
    entry.state, entry.version, entry.state_changed_at, entry.updated_at = dst, entry.version + 1, now, now
    for name, value in changes.items():
        setattr(entry, name, value)
    return entry

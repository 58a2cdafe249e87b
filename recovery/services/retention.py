"""Retention of settled history (docs/deploy.md, "Data growth and retention"): what a settled call no longer needs,
removed after RECOVERY_RETENTION_DAYS. Never the call, its attempts' facts, its decision cards, the audit trail or
the rollups; each batch is one transaction recorded as a `retention.pruned` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.states import CallState
from recovery.models import Attempt, Call, Diagnostic, GateDecision, Receipt, TaskStatus

S = CallState
SETTLED = (S.COMMITTED, S.NOT_COMMITTED, S.FAILED_PERMANENT, S.COMPENSATED)
BATCH = 500


@dataclass(kw_only=True)
class Pruned:
    calls: int = 0
    receipts: int = 0
    gate_decisions: int = 0
    diagnostics: int = 0
    attempt_bodies: int = 0


def retention_prune(*, now: datetime, days: int, actor: Actor, batch: int = BATCH) -> Pruned:
    """Prune every call settled more than `days` ago in a closed task, `batch` calls per transaction, oldest id
    first; what was removed in all. `days` 0 removes nothing (retention off)."""
    pruned = Pruned()
    if days <= 0:
        return pruned
    cutoff = now - timedelta(days=days)
    due = (
        Call.objects.filter(state__in=SETTLED, state_changed_at__lt=cutoff, history_pruned_at__isnull=True)
        .exclude(task__status=TaskStatus.OPEN)
        .order_by("id")
        .values_list("id", flat=True)
    )
    last = 0
    while True:
        ids = list(due.filter(id__gt=last)[:batch])
        if not ids:
            return pruned
        _prune(ids, now=now, cutoff=cutoff, days=days, actor=actor, pruned=pruned)
        last = ids[-1]


def _prune(ids: list[int], *, now: datetime, cutoff: datetime, days: int, actor: Actor, pruned: Pruned) -> None:
    with transaction.atomic():
        # Only the calls still due when locked: one that moved on (a compensation started) since it was listed is
        # left whole for a later run.
        locked = list(
            Call.objects.select_for_update()
            .filter(id__in=ids, state__in=SETTLED, state_changed_at__lt=cutoff, history_pruned_at__isnull=True)
            .order_by("id")
            .values_list("id", flat=True)
        )
        if not locked:
            return
        receipts, _ = Receipt.objects.filter(call_id__in=locked).delete()
        gates, _ = GateDecision.objects.filter(call_id__in=locked).delete()
        attempts = Attempt.objects.filter(call_id__in=locked)
        bodies = attempts.exclude(response__isnull=True, outcome_response__isnull=True, diagnostic__isnull=True).update(
            response=None, outcome_response=None, diagnostic=None
        )
        diagnostics, _ = Diagnostic.objects.filter(call_id__in=locked).delete()
        Call.objects.filter(id__in=locked).update(history_pruned_at=now)
        append_event(
            action=AuditAction.RETENTION_PRUNED,
            actor=actor,
            reason=f"retention: the settled history of {len(locked)} calls settled more than {days} days ago",
            evidence={
                "calls": len(locked),
                "first_call": locked[0],
                "last_call": locked[-1],
                "receipts": receipts,
                "gate_decisions": gates,
                "diagnostics": diagnostics,
                "attempt_bodies": bodies,
                "settled_before": cutoff.isoformat(),
            },
        )
    pruned.calls += len(locked)
    pruned.receipts += receipts
    pruned.gate_decisions += gates
    pruned.diagnostics += diagnostics
    pruned.attempt_bodies += bodies

"""The sweeper (docs/reconciliation.md, docs/design/state-machine.md): a SENT call with no outcome after its tool's
outcome timeout becomes UNKNOWN (a write) or RETRYABLE (a read; FAILED_PERMANENT with none left), each in its own
short transaction through recovery.statemachine.transitions, so an outcome reported at the same moment wins cleanly.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from recovery.audit.chain import Actor, appends_at_commit
from recovery.engine.states import CallState
from recovery.engine.types import OUTCOME_UNKNOWN, TRANSIENT
from recovery.models import Call
from recovery.registry.policy import reconcile_policy
from recovery.services.outcomes import check_at_once
from recovery.statemachine.transitions import transition_call

S = CallState
ACTOR = Actor.job("sweeper")


def sweep_sent(*, limit: int = 500, now: datetime | None = None) -> int:
    """Move every SENT call past its outcome timeout (at most `limit`, oldest first); how many moved."""
    now = now or timezone.now()
    shortest = Call.objects.filter(state=S.SENT).aggregate(m=Min("outcome_timeout_s"))["m"]
    if shortest is None:
        return 0
    candidates = (
        Call.objects.filter(state=S.SENT, sent_at__lte=now - timedelta(seconds=shortest))
        .order_by("sent_at")
        .values_list("pk", "sent_at", "outcome_timeout_s")[: limit * 4]
    )
    moved = 0
    for pk, sent_at, timeout_s in candidates:
        if moved >= limit:
            break
        if sent_at + timedelta(seconds=timeout_s) <= now and _sweep_one(pk, now):
            moved += 1
    return moved


def _sweep_one(pk: int, now: datetime) -> bool:
    with transaction.atomic(), appends_at_commit():
        call = Call.objects.select_for_update(of=("self",)).select_related("tool").filter(pk=pk).first()
        if call is None or call.state != S.SENT or call.sent_at + timedelta(seconds=call.outcome_timeout_s) > now:
            return False  # an outcome (or another sweeper) got there first
        reason = f"no outcome {call.outcome_timeout_s} s after the attempt was sent"
        # "class": how the metrics count an attempt with no outcome (a write's effect is unknown; a read had none)
        failure_class = OUTCOME_UNKNOWN if call.side_effect == "write" else TRANSIENT
        evidence = {
            "sent_at": call.sent_at.isoformat(),
            "outcome_timeout_s": call.outcome_timeout_s,
            "class": failure_class,
        }
        if call.side_effect == "write":
            first = reconcile_policy(call.tool).first_check_s
            changes = {"next_check_at": now + timedelta(seconds=first)}
            transition_to(call, S.UNKNOWN, reason=f"{reason}: it may have executed", evidence=evidence, changes=changes)
            check_at_once(call, first)
        elif call.has_attempts_left():
            transition_to(call, S.RETRYABLE, reason=f"{reason}: a read has no effect", evidence=evidence)
        else:
            changes = {"outcome": "retry_exhausted"}
            transition_to(
                call, S.FAILED_PERMANENT, reason=f"{reason}; no attempt left", evidence=evidence, changes=changes
            )
    return True


def transition_to(call: Call, target: str, *, reason: str, evidence: dict, changes: dict | None = None) -> None:
    transition_call(call, target, actor=ACTOR, reason=reason, evidence=evidence, changes=changes)

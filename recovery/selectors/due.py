"""Due times on the database side (docs/notifications.md#due-times): the conditions and the due-time expression built
from `recovery.engine.due.due_limits`, so the due sort, the escalation sweep and the metrics read RECOVERY_SLA_S and
RECOVERY_CLAIM_DUE_S per queue and risk exactly as a row and the call page do (`due_times`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Case, DateTimeField, F, Q, Value, When

from recovery.engine.due import DueLimit, due_limits, due_seconds


def limits() -> list[DueLimit]:
    return due_limits(sla=settings.RECOVERY_SLA_S, claim=settings.RECOVERY_CLAIM_DUE_S)


def late_q(now: datetime, *, claim: bool) -> Q:
    """Items waiting for a person past their claim's (`claim`) or their resolution's due time at `now`."""
    late = Q(pk__in=[])
    for limit in limits():
        seconds = limit.claim_s if claim else limit.resolve_s
        late |= Q(state__in=limit.states, risk=limit.risk, state_changed_at__lt=now - timedelta(seconds=seconds))
    return late


def resolve_by() -> Case:
    """An item's resolution due time, computed by the database: its queue's and risk's; in a state no due queue
    holds (an UNKNOWN item still being polled), its risk's; of a risk the table does not name, the strictest."""
    found, sla = limits(), settings.RECOVERY_SLA_S
    risks = sorted({limit.risk for limit in found})
    return Case(
        *[When(state__in=limit.states, risk=limit.risk, then=_after(limit.resolve_s)) for limit in found],
        *[When(risk=risk, then=_after(due_seconds(sla, "", risk))) for risk in risks],
        default=_after(due_seconds(sla, "", "")),
        output_field=DateTimeField(),
    )


def _after(seconds: int):
    return F("state_changed_at") + Value(timedelta(seconds=seconds))

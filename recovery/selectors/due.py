"""Due times on the database side (docs/notifications.md#due-times): the overdue conditions and the due sort's parts
built from `recovery.engine.due`, so the due sort, the escalation sweep and the metrics read RECOVERY_SLA_S and
RECOVERY_CLAIM_DUE_S per queue and risk exactly as a row and the call page do (`due_times`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from recovery.engine.due import QUEUE_OF_STATE, DueLimit, due_limits, due_seconds


def limits() -> list[DueLimit]:
    return due_limits(sla=settings.RECOVERY_SLA_S, claim=settings.RECOVERY_CLAIM_DUE_S)


def late_q(now: datetime, *, claim: bool) -> Q:
    """Items waiting for a person past their claim's (`claim`) or their resolution's due time at `now`."""
    late = Q(pk__in=[])
    for limit in limits():
        seconds = limit.claim_s if claim else limit.resolve_s
        late |= Q(state__in=limit.states, risk=limit.risk, state_changed_at__lt=now - timedelta(seconds=seconds))
    return late


def due_parts(states: tuple[str, ...]) -> list[tuple[str, str, int]]:
    """A queue's calls in parts within which the resolution due time is the entry time plus one number of seconds:
    each (state, risk) with those seconds. A part reads in entry order by index (call_queue_idx, the risk filtered),
    and a page of each, merged, is the queue's page by due time."""
    sla = settings.RECOVERY_SLA_S
    risks = [key for key in sla if "." not in key]  # every risk a call can have (the settings require each)
    return [(state, risk, due_seconds(sla, QUEUE_OF_STATE.get(state, ""), risk)) for state in states for risk in risks]

"""The verdicts an admission hands back (docs/api.md#reporting-off-the-clock): a report that may have been deferred
— a 2xx other than 202 on an attempt admitted with `may_defer` — whose verdict is not COMMITTED, reported since the
task's last admission, comes back on the task's next admission with its decision card. Read from what the attempts
already store (their admission and outcome answers): nothing more is recorded.
"""

from __future__ import annotations

from django.db.models import Max, Subquery

from recovery.engine.states import CallState
from recovery.models import Attempt


def earlier_verdicts(task_id: int) -> list[dict]:
    """For an admission about to be recorded in the task: the disagreeing verdicts reported since its last one."""
    last_admission = (
        Attempt.objects.filter(call__task_id=task_id)
        .order_by()
        .values("call__task_id")
        .annotate(latest=Max("admitted_at"))
        .values("latest")[:1]
    )
    reported = (
        Attempt.objects.filter(call__task_id=task_id, reported_at__gt=Subquery(last_admission))
        .filter(http_status__gte=200, http_status__lt=300, response__report__may_defer=True)
        .exclude(http_status=202)
        .exclude(outcome_response__call_state=CallState.COMMITTED.value)
        .order_by("reported_at", "pk")
        .values_list("call_id", "attempt_id", "outcome_response")
    )
    return [
        {
            "call_id": call_id,
            "attempt_id": attempt_id,
            "call_state": (answer or {}).get("call_state", ""),
            "decision": (answer or {}).get("decision"),
        }
        for call_id, attempt_id, answer in reported
        if answer  # written with reported_at in one UPDATE: a row without it is no report
    ]

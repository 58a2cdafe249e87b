"""The verdicts an admission hands back (docs/api.md#reporting-off-the-clock): a report that may have been deferred
— a 2xx other than 202 on an attempt admitted with `may_defer` — whose verdict is not COMMITTED, reported since the
task's last admission, comes back on the task's next admission with its decision card. Read from what the attempts
already store (their admission and outcome answers): nothing more is recorded.
"""

from __future__ import annotations

from recovery.engine.states import CallState
from recovery.statemachine.hot_reads import reported_2xx_since_last_admission


def earlier_verdicts(task_id: int, reported: list[tuple] | None = None) -> list[dict]:
    """For an admission about to be recorded in the task: the disagreeing verdicts reported since its last one.
    `reported`: the task's 2xx reports since then, when the admission's read brought them (AdmissionRead.reported)."""
    earlier = []
    if reported is None:
        reported = reported_2xx_since_last_admission(task_id)
    for call_id, attempt_id, admission, answer in reported:
        deferrable = ((admission or {}).get("report") or {}).get("may_defer") is True
        if deferrable and answer and answer.get("call_state") != CallState.COMMITTED:
            earlier.append(
                {
                    "call_id": call_id,
                    "attempt_id": attempt_id,
                    "call_state": answer["call_state"],
                    "decision": answer.get("decision"),
                }
            )
    return earlier

"""Due times (docs/notifications.md#due-times): one concept with RECOVERY_SLA_S. An item that waits for a person is
due to be claimed RECOVERY_CLAIM_DUE_S after it entered its state and resolved RECOVERY_SLA_S after, per queue and call
risk: a table's "<queue>.<risk>" value over its "<risk>" one. `due_seconds` is the one place that reads a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from recovery.engine.states import CallState as S

# The queues whose items wait for a person, by their slug in the console, and the states that put an item there.
DUE_QUEUES: dict[str, tuple[str, ...]] = {
    "unknown": (S.STILL_UNKNOWN,),
    "human-review": (S.HUMAN_REVIEW,),
    "compensation-problems": (S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED),
}
QUEUE_OF_STATE = {state: queue for queue, states in DUE_QUEUES.items() for state in states}


@dataclass(frozen=True)
class Due:
    claim_by: datetime
    resolve_by: datetime

    def overdue(self, now: datetime, *, claimed: bool) -> bool:
        """Past the due time that applies: the claim's while nobody holds it, the resolution's always."""
        return now > self.resolve_by or (not claimed and now > self.claim_by)

    def next_due(self, *, claimed: bool) -> datetime:
        return self.resolve_by if claimed else min(self.claim_by, self.resolve_by)


@dataclass(frozen=True)
class DueLimit:
    """The due times of one queue and risk, in seconds after an item entered its state (for the database side)."""

    queue: str
    states: tuple[str, ...]
    risk: str
    claim_s: int
    resolve_s: int


def due_seconds(table: dict[str, int], queue: str, risk: str) -> int:
    """The table's seconds for an item of `risk` in `queue`: "<queue>.<risk>", else "<risk>", else (a risk the table
    does not know) the strictest risk's."""
    if f"{queue}.{risk}" in table:
        return table[f"{queue}.{risk}"]
    if risk in table:
        return table[risk]
    return min(seconds for key, seconds in table.items() if "." not in key)


def _limits(queue: str, risk: str, sla: dict[str, int], claim: dict[str, int]) -> tuple[int, int]:
    resolve_s = due_seconds(sla, queue, risk)
    return min(due_seconds(claim, queue, risk), resolve_s), resolve_s


def due_times(entered_at: datetime, risk: str, *, state: str, sla: dict[str, int], claim: dict[str, int]) -> Due:
    """When an item of `risk` that entered `state` (its queue) at `entered_at` is due to be claimed and resolved; the
    claim is never due after the resolution."""
    claim_s, resolve_s = _limits(QUEUE_OF_STATE.get(state, ""), risk, sla, claim)
    return Due(entered_at + timedelta(seconds=claim_s), entered_at + timedelta(seconds=resolve_s))


def due_limits(*, sla: dict[str, int], claim: dict[str, int]) -> list[DueLimit]:
    """Every queue and risk the tables name, with their due times: what a query filters or sorts by, the same
    answer as `due_times` gives one item."""
    risks = sorted({key.rpartition(".")[2] for key in (*sla, *claim)})
    return [
        DueLimit(queue, states, risk, *_limits(queue, risk, sla, claim))
        for queue, states in DUE_QUEUES.items()
        for risk in risks
    ]

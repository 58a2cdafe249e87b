"""Due times (docs/notifications.md#due-times): one concept with RECOVERY_SLA_S. An item that waits for a person is
due to be claimed RECOVERY_CLAIM_DUE_S after it entered its state and resolved RECOVERY_SLA_S after, per call risk.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Due:
    claim_by: datetime
    resolve_by: datetime

    def overdue(self, now: datetime, *, claimed: bool) -> bool:
        """Past the due time that applies: the claim's while nobody holds it, the resolution's always."""
        return now > self.resolve_by or (not claimed and now > self.claim_by)

    def next_due(self, *, claimed: bool) -> datetime:
        return self.resolve_by if claimed else min(self.claim_by, self.resolve_by)


def due_times(entered_at: datetime, risk: str, *, sla: dict[str, int], claim: dict[str, int]) -> Due:
    """When an item of `risk` that entered its queue at `entered_at` is due to be claimed and to be resolved; an
    unknown risk takes the strictest."""
    resolve_s = sla.get(risk, min(sla.values()))
    claim_s = min(claim.get(risk, min(claim.values())), resolve_s)
    return Due(entered_at + timedelta(seconds=claim_s), entered_at + timedelta(seconds=resolve_s))

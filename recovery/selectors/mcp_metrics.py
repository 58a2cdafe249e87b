"""The MCP gateway's hold figures (docs/metrics.md, docs/mcp-gateway.md): holds and approval wait times, read from
the holds themselves — a hold is a gate decision, the denial of a gateway call's admission with `approval_required`,
and its end is the decision of the call's action request. Reads go through the holds' partial index
(`gate_hold_created_idx`), so they cost what the window's holds are, whatever the history of calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Min

from recovery.models import ActionRequest, GateDecision

APPROVAL_REQUIRED = "approval_required"


@dataclass(frozen=True)
class Hold:
    call_id: int
    server: str
    held_at: datetime  # the call's first approval_required denial
    decided_at: datetime | None  # the first decision of an action request on the call after it; None: still waiting

    @property
    def wait_s(self) -> float | None:
        return None if self.decided_at is None else max((self.decided_at - self.held_at).total_seconds(), 0.0)


def holds(
    *,
    since: datetime | None = None,
    tenant_ids: tuple[int, ...] | None = None,
    tool_id: int | None = None,
) -> list[Hold]:
    """The gateway calls held since `since` (every one when None), each once, with when it was decided: two
    statements."""
    found = GateDecision.objects.filter(
        allowed=False, dry_run=False, reason=APPROVAL_REQUIRED, call__mcp_origin__isnull=False
    )
    if since is not None:
        found = found.filter(created_at__gte=since)
    if tenant_ids is not None:
        found = found.filter(call__tenant_id__in=tenant_ids)
    if tool_id is not None:
        found = found.filter(call__tool_id=tool_id)
    rows = list(
        found.values("call_id", "call__mcp_origin__server").annotate(held=Min("created_at")).order_by("call_id")
    )
    decisions: dict[int, list[datetime]] = {}
    decided = ActionRequest.objects.filter(call_id__in=[row["call_id"] for row in rows], decided_at__isnull=False)
    for call_id, at in decided.values_list("call_id", "decided_at").order_by("decided_at"):
        decisions.setdefault(call_id, []).append(at)
    return [
        Hold(
            call_id=row["call_id"],
            server=row["call__mcp_origin__server"],
            held_at=row["held"],
            decided_at=next((at for at in decisions.get(row["call_id"], []) if at >= row["held"]), None),
        )
        for row in rows
    ]


def exact_quantile(q: float, values: list[float]) -> float | None:
    """The q-quantile of `values` by linear interpolation between the closest ranks; None for no value."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)

"""How each tool's circuit breaker reads now (docs/breakers.md): its Breaker row through recovery.engine.breaker's
view_of_row. recovery.services.breakers writes the rows; what only shows or admits reads them here. A forced_open
breaker's view names who forced it open and why: one more SELECT, only while it is forced open."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from recovery.engine import breaker as rules
from recovery.engine.types import FORCED_OPEN, BreakerPolicy, BreakerView
from recovery.models import Breaker, BreakerOperation, BreakerOperationKind, BreakerOperationStatus, Tool
from recovery.registry.policy import breaker_policy

_STATE_FIELDS = ("state", "opened_at", "probes_reserved", "probe_lease_until")


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def view_of_state(row: tuple | None, policy: BreakerPolicy, now: datetime) -> BreakerView:
    """The effective state from (state, opened_at, probes_reserved, probe_lease_until); no row reads closed."""
    if row is None:
        return rules.view_of_row(rules.BreakerRow(), policy, now.timestamp())
    state, opened_at, probes_reserved, lease_until = row[:4]
    stored = rules.BreakerRow(state, _epoch(opened_at), probes_reserved, _epoch(lease_until))
    return rules.view_of_row(stored, policy, now.timestamp())


def forced_open_by(tool_id: int) -> tuple[str, str] | None:
    """(who, why) of the tool's latest applied force open; None when there is none (e.g. set in the admin)."""
    return (
        BreakerOperation.objects.filter(
            tool_id=tool_id, operation=BreakerOperationKind.FORCE_OPEN, status=BreakerOperationStatus.APPLIED
        )
        .order_by("-id")
        .values_list("requested_by__username", "reason")
        .first()
    )


def _with_operator(tool: Tool, view: BreakerView) -> BreakerView:
    if view.state != FORCED_OPEN:
        return view
    found = forced_open_by(tool.pk)
    return replace(view, forced_by=found[0], forced_reason=found[1]) if found else view


def breaker_view(tool: Tool, *, now: datetime, policy: BreakerPolicy | None = None) -> BreakerView:
    """The breaker as admission sees it at `now`: open past its cooldown reads half_open. One SELECT (two while it
    is forced open)."""
    row = Breaker.objects.filter(tool_id=tool.pk).values_list(*_STATE_FIELDS).first()
    return _with_operator(tool, view_of_state(row, policy or breaker_policy(tool), now))


def breaker_view_of(tool: Tool, row: Breaker | None, *, now: datetime) -> BreakerView:
    """breaker_view() of a Breaker row read already (with its tool: `select_related("tool__breaker_row")`); None
    for a tool whose breaker never opened."""
    state = None if row is None else tuple(getattr(row, name) for name in _STATE_FIELDS)
    return _with_operator(tool, view_of_state(state, breaker_policy(tool), now))

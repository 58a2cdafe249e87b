"""What every page states about a call, from one reading of its own columns (docs/console.md, "The call page").
The call page, its refresh, the task page, a queue row and an action's preview all draw from `shown_facts`; a status
endpoint's breaker is read by `status_breaker_state`, a tool's by recovery.selectors.breakers.breaker_view; a tool's
retry path by `retry_path_of`, in one vocabulary: safe, unsafe or unprobed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from recovery.engine.states import CallState as S

# A call in one of these states is settled: an outcome it carries (status checks used up, retries used up) is how it
# got to a person before it settled, not what it is now.
SETTLED_STATES = frozenset({S.COMMITTED, S.NOT_COMMITTED, S.COMPENSATED})
# States in which the call's effect exists, or existed before it was undone: at least one, counted or not.
EFFECT_MADE = frozenset({S.COMMITTED, S.COMPENSATING, S.COMPENSATED, S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED})


@dataclass(frozen=True, kw_only=True)
class ShownFacts:
    call_id: int
    state: str
    outcome: str
    receipt_status: str
    receipt_at: datetime | None
    effects: int | None  # as the provider counted them for the key; None: it never said

    @property
    def outcome_earlier(self) -> bool:
        """The outcome is history: how the call reached a person before it settled."""
        return bool(self.outcome) and self.state in SETTLED_STATES

    @property
    def effect_made(self) -> bool:
        return self.state in EFFECT_MADE

    @property
    def effects_text(self) -> str:
        """The effects in words: the provider's count, else what the state proves, else that nobody counted."""
        if self.effects is not None:
            return f"{self.effects} effect{'' if self.effects == 1 else 's'} observed"
        if self.effect_made:
            return f"at least 1 effect ({self.state}; the provider reported no count)"
        return "no effect count reported"

    @property
    def effects_at_least(self) -> int:
        """The fewest effects the evidence proves: the count, else 1 once the call committed, else 0."""
        if self.effects is not None:
            return self.effects
        return 1 if self.effect_made else 0

    @property
    def values(self) -> dict[str, str]:
        """Each fact as a page's `data-value` states it: what the comparison across pages reads."""
        receipt = f"{self.receipt_status}@{self.receipt_at.isoformat()}" if self.receipt_at else "none"
        effects = str(self.effects) if self.effects is not None else (">=1" if self.effect_made else "unknown")
        return {
            "state": self.state,
            "outcome": f"{'earlier:' if self.outcome_earlier else ''}{self.outcome}",
            "last_receipt": receipt,
            "effects": effects,
        }


def shown_facts(call) -> ShownFacts:
    """The facts of a Call (or anything with its columns as attributes)."""
    return ShownFacts(
        call_id=call.pk,
        state=str(call.state),
        outcome=call.outcome or "",
        receipt_status=call.last_receipt_status or "",
        receipt_at=call.last_receipt_at,
        effects=call.effects_observed,
    )


def row_facts(row: Mapping) -> ShownFacts:
    """The same for a queue row (a dict of the call's columns)."""
    return ShownFacts(
        call_id=row["id"],
        state=str(row["state"]),
        outcome=row.get("outcome") or "",
        receipt_status=row.get("last_receipt_status") or "",
        receipt_at=row.get("last_receipt_at"),
        effects=row.get("effects_observed"),
    )


def status_breaker_state(stored: str, opened_at: datetime | None, cooldown_s: float, now: datetime) -> str:
    """A status endpoint's breaker as every page states it: stored open, once its cooldown is over, reads half_open
    (the next status query is its probe)."""
    if stored == "open" and opened_at is not None and now >= opened_at + timedelta(seconds=cooldown_s):
        return "half_open"
    return stored


RETRY_PATHS = ("safe", "unsafe", "unprobed")


def retry_path_of(side_effect: str, stored: str) -> str:
    """A tool's retry path as every page states it (docs/replay.md): a read's is safe (repeating it changes nothing);
    a write's is what its latest deciding probe or an approved action left, unprobed until one did. A registry entry
    that declares the tool replay-safe proves nothing by itself: its path stays unprobed."""
    if side_effect != "write":
        return "safe"
    return stored if stored in RETRY_PATHS else "unprobed"


def not_closed_value(breakers: Iterable[tuple[str, str]]) -> str:
    """The breakers that are not closed, as every page that lists them states it: "tool:<name>" and
    "status:<provider>", sorted, comma-separated ("none" when every breaker is closed)."""
    return ",".join(sorted(f"{kind}:{name}" for kind, name in breakers)) or "none"

"""What a drill run leaves: one row per key, one per check, and the drill's result (stored as DrillRun.results)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(kw_only=True)
class KeyRow:
    key: str
    call_id: int | None
    expected_end: str
    observed_end: str
    expected_effects: int
    observed_effects: int
    passed: bool
    entry: int | None = None  # the compensation entry's number when the key is an entry's own (docs/compensation.md)
    step: str = ""  # the step's role, for a drill whose steps end differently (a saga's order, payment, shipment)


@dataclass(kw_only=True)
class CheckRow:
    name: str
    expected: str
    observed: str
    passed: bool


@dataclass(kw_only=True)
class DrillResult:
    slug: str
    name: str
    injected: str
    expected: str  # one line for the result table
    observed: str
    passed: bool
    seconds: float
    keys: list[KeyRow] = field(default_factory=list)
    checks: list[CheckRow] = field(default_factory=list)
    error: str = ""
    skipped: str = ""  # why the drill did not run (a service it needs is missing); never counts as passed

    def as_json(self) -> dict:
        return asdict(self)

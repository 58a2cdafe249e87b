"""What a scenario is, what it ends with, and `Play`: one run of one scenario, with its agent and its helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recovery_client.runtime import CallResult

from recovery.devtools.scenarios.checks import Check

if TYPE_CHECKING:
    from recovery.devtools.drills.stage import Stage

Log = Callable[[str], None]


@dataclass(kw_only=True)
class ScenarioResult:
    name: str
    title: str
    pinned_end: str
    end: str = ""  # what it ended as, in a line
    checks: list[Check] = field(default_factory=list)
    error: str = ""  # what stopped it early, if anything did
    task_id: int | None = None
    calls: dict[str, int] = field(default_factory=dict)  # role → call id (e.g. "payment" → 42)
    keys: dict[str, str] = field(default_factory=dict)  # role → idempotency key
    routes: dict[str, str] = field(default_factory=dict)  # role → a read's sandbox route (e.g. /orders/O-1201)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.checks) and all(check.passed for check in self.checks)

    @property
    def score(self) -> str:
        return f"{sum(check.passed for check in self.checks)}/{len(self.checks)}"


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    title: str
    pinned_end: str
    play: Callable[[Play], None]
    exclusive: bool = False  # touches a shared breaker: runs alone, after the others


def scenario(*, name: str, title: str, pinned_end: str) -> Callable[[Callable[[Play], None]], Scenario]:
    """`@scenario(name=..., title=..., pinned_end=...)` over the function that plays it: the two make the Scenario."""
    return lambda play: Scenario(name=name, title=title, pinned_end=pinned_end, play=play)


def exclusive_scenario(*, name: str, title: str, pinned_end: str) -> Callable[[Callable[[Play], None]], Scenario]:
    """The same, for a scenario that touches a shared breaker: it runs alone, after the others."""
    return lambda play: Scenario(name=name, title=title, pinned_end=pinned_end, play=play, exclusive=True)


class Play:
    """One run of one scenario: its agent, its result, and helpers to check what happened."""

    def __init__(self, scenario: Scenario, stage: Stage, log: Log, number: int) -> None:
        self.scenario, self.stage, self.log, self.number = scenario, stage, log, number
        self.client = stage.client()
        self.sandbox = stage.sandbox
        self.agent = stage.agent(log=log)
        self.result = ScenarioResult(name=scenario.name, title=scenario.title, pinned_end=scenario.pinned_end)

    # Names unique to this run and scenario.

    def key(self, role: str) -> str:
        key = self.stage.key(f"{self.scenario.name}-{role}")
        self.result.keys[role] = key
        return key

    def digits(self, n: int) -> str:
        """Digits unique to this run, scenario and `n`, for ids the tools' schemas want as O-/C-/U-<digits>."""
        return f"{int(self.stage.run_id, 16) % 10**9:09d}{self.number:02d}{n}"

    def order_route(self, role: str, n: int) -> tuple[str, str]:
        order_id = f"O-{self.digits(n)}"
        route = f"/orders/{order_id}"
        self.result.routes[role] = route
        return order_id, route

    def tool(self, name: str) -> str:
        return self.stage.tool(name)

    # What the agent does.

    def start(self, goal: str, **options: Any) -> int:
        task = self.agent.start_task(self.stage.key(f"demo-{self.scenario.name}"), goal=goal, **options)
        self.result.task_id = task.id
        return task.id

    def run_call(self, role: str, task_id: int, **kwargs: Any) -> CallResult:
        result = self.agent.run_call(task_id, **kwargs)
        self.result.calls[role] = result.call_id
        return result

    def fault(self, **spec: Any) -> None:
        fault = self.sandbox.fault(**spec)
        params = ", ".join(f"{k}={v}" for k, v in spec.items() if k not in ("kind", "route", "key", "times"))
        what = f"{spec['kind']}({params})" if params else spec["kind"]
        scope = f"key {spec['key']}" if spec.get("key") else f"route {spec['route']}"
        times = f", {spec['times']} time(s)" if spec.get("times") else ""
        self.log(f"  sandbox fault #{fault['id']}: {what} on {scope}{times}")

    def submit(self, task_id: int, summary: str) -> str:
        return self.agent.submit(task_id, summary).outcome or ""

    # What it checks.

    def check(self, name: str, expected: Any, observed: Any) -> bool:
        """Record and log whether `observed` is what was `expected`: a value it must equal, or a Comparison
        (recovery/devtools/scenarios/checks.py)."""
        check = Check(name=name, expected=expected, observed=observed)
        self.result.checks.append(check)
        self.log(f"  {check.line}")
        return check.passed

    def call(self, call_id: int | None) -> dict:
        return self.client.get_call(call_id) if call_id is not None else {}

    def effects(self, key: str) -> int:
        return self.sandbox.ledger(key)["effects"]

    def writes(self, key: str) -> list[dict]:
        """The write requests the sandbox received with this idempotency key (status queries are GETs)."""
        return [r for r in self.sandbox.requests(key=key) if r["method"] != "GET"]

    def reads(self, route: str) -> list[dict]:
        return [r for r in self.sandbox.requests(path_prefix=route) if r["path"] == route]

"""What a drill runs in: `Run`, its stage, its table row, the calls it makes and the checks it reports; waiting."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from itertools import count
from typing import Any

from django.utils import timezone
from recovery_client.runtime import CallResult

from recovery.devtools.agent import Agent
from recovery.devtools.drills import checks
from recovery.devtools.drills.evidence import at
from recovery.devtools.drills.results import CheckRow
from recovery.devtools.drills.stage import Stage
from recovery.devtools.drills.table import BACKLOG_DEFAULT, ROUNDS_DEFAULT, Drill

Log = Callable[[str], None]

PATIENCE_S = 60.0  # how long the drill agent waits for reconciliation before it calls a call unsettled


class Run:
    """One drill in progress: the calls it made (each one a key row) and the checks it reported. `backlog` and
    `rounds` size the two drills that take a size."""

    def __init__(
        self, stage: Stage, drill: Drill, log: Log, *, backlog: int = BACKLOG_DEFAULT, rounds: int = ROUNDS_DEFAULT
    ) -> None:
        self.stage, self.drill, self.log = stage, drill, log
        self.backlog, self.rounds = backlog, rounds
        self.calls: list[tuple[str, int | None]] = []
        self.roles: dict[int, str] = {}  # call id → its step's role, for a drill whose steps end differently
        self.checks: list[CheckRow] = []
        self.started = timezone.now()
        self.steps = count(1)
        self.tag = uuid.uuid4().hex[:6]  # this drill run's: the same drill may run again on the same stage
        self.lock = threading.Lock()  # for the drills that make calls on threads of their own
        self.effects: dict[str, int] | None = None  # by key, counted by a drill whose effects are not the sandbox's

    @property
    def sandbox(self):
        return self.stage.sandbox

    def agent(self, **options) -> Agent:
        options.setdefault("log", self.log)
        options.setdefault("patience_s", PATIENCE_S)
        return self.stage.agent(**options)

    def call(self, result: CallResult, *, step: str = "") -> CallResult:
        """Record the call as a key row (`step`: its role in the table's `steps`, for a saga drill)."""
        with self.lock:
            self.calls.append((result.key, result.call_id))
            if step and result.call_id is not None:
                self.roles[result.call_id] = step
        return result

    def check(self, name: str, *, expected: Any, observed: Any) -> None:
        """One of the table's checks: it holds when `observed` matches `expected`
        (recovery/devtools/drills/checks.py)."""
        self.checks.append(checks.check(name, expected=expected, observed=observed))

    def key(self, name: str) -> str:
        """An idempotency key or task id unique to this drill run (it ends in the stage's run id)."""
        return self.stage.key(f"{name}-{self.tag}")

    def order_id(self, n: int) -> str:
        """An order id (O-<digits>) unique to this drill run."""
        return f"O-{int(self.tag, 16):08d}{n:04d}"

    def refund_args(self, label: str, n: int) -> tuple[str, dict]:
        """A refund's idempotency key and arguments, unique to this drill run."""
        return self.key(f"refund-{label}"), {"order_id": self.order_id(n), "amount_cents": 1250 + n}

    def refund(
        self,
        agent: Agent,
        key: str,
        arguments: dict,
        *,
        task: str,
        goal: str,
        tool: str = "refund.create",
        step: str = "",
    ) -> tuple[int, CallResult]:
        """One refund in a task of its own (`task` names it), recorded as a key row (`step`: its role, for a drill
        whose calls end differently): the task's id and the call. `tool`: one of the stage's refund tools."""
        task_id = agent.start_task(self.key(task), goal=goal).id
        result = agent.run_call(task_id, step=1, tool=self.stage.tool(tool), key=key, arguments=arguments)
        return task_id, self.call(result, step=step)

    def posts_since(self, path: str) -> list[dict]:
        """The sandbox's logged POSTs under `path` since this drill began."""
        return [entry for entry in self.sandbox.requests(path_prefix=path, method="POST") if at(entry) >= self.started]


def missing_service(stage: Stage, drill: Drill) -> str:
    """Why `drill` cannot run on `stage` ("" when it can)."""
    if drill.needs == "redis" and stage.workers is None:
        return "needs REDIS_URL: RQ worker processes to kill -9 (the in-process runner's jobs run inside this process)"
    if drill.needs == "mcp":
        from recovery.devtools.mcp_stage import missing_servers

        return missing_servers() or ""
    return ""


def wait(condition: Callable[[], bool], timeout_s: float, every_s: float = 0.1) -> bool:
    """Whether `condition` came true within `timeout_s` (asked every `every_s`)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


def sleep_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - timezone.now()).total_seconds()))

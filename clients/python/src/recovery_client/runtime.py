"""The runtime loop: every attempt admitted first, sent by the runtime's own code, reported, and the answer obeyed.

    runtime = Runtime(RecoveryClient(api_url, token), tenant="demo")
    task = runtime.start_task("refund-8848", goal="refund order 8848")
    ref = runtime.client.add_call(task.id, step=1, tool="refund.create", idempotency_key="refund-8848-v1",
                                  arguments={"order_id": "O-8848", "amount_cents": 1250})
    result = runtime.drive_call(task.id, ref.call_id, state=ref.state, tool="refund.create", key="refund-8848-v1",
                                send=send_the_refund)      # attempt number -> (facts, value)
    runtime.submit(task.id, "refunded order 8848")

`drive_call` is the whole recovery loop of docs/design/decisions.md and docs/design/gate.md from the runtime's side.
It never retries on its own judgement: each new attempt is admitted by the console, carries the evidence the console
asked for (`time_elapsed` after the delay it named, `state_verified` after a receipt proved nothing happened), and a
denial's `required_next.action` says what to do instead — wait, wait for reconciliation, degrade, ask a person, or
stop. What the request saw is reported as facts taken from `requests` itself (recovery_client.facts_from_response /
facts_from_exception). recovery_client.recovered wraps tool functions in it; any runtime whose requests are built
its own way hands them to it as `send`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recovery_client import (
    Admission,
    CallRef,
    DecisionCard,
    Failure,
    NotAdmitted,
    RecoveryClient,
    RequiredNext,
    Task,
)
from recovery_client.deferred import DeferredReports, passes

__all__ = [
    "BLOCKED",
    "COMMITTED",
    "DEGRADED",
    "FAILED",
    "HUMAN_REVIEW",
    "LONG_POLL_MS",
    "RETRY_LATER",
    "SETTLING",
    "UNSETTLED",
    "AttemptRecord",
    "CallResult",
    "Runtime",
    "Send",
]

# Where a call can still move without anyone acting: the agent waits these out (reconciliation settles them).
SETTLING = frozenset({"SENT", "UNKNOWN", "STILL_UNKNOWN", "ACCEPTED", "NOT_COMMITTED"})

# How long one long poll (GET /calls/{id}?version=&wait_ms=) waits for a settling call to change, at most: the
# console answers as soon as the call moves, so this bounds only how long a request stays open.
LONG_POLL_MS = 10_000

# What drive_call ends with, as CallResult.outcome.
COMMITTED = "committed"  # the provider has the effect (or the read's answer), proven
DEGRADED = "degraded"  # the tool's breaker is open: the agent took the fallback path
HUMAN_REVIEW = "human_review"  # left for a reviewer (an approval, an unsettled unknown, a duplicate)
FAILED = "failed"  # the console said stop (attempts spent, a final failure, a refused intent)
UNSETTLED = "unsettled"  # still settling when the agent's patience ran out; reconciliation goes on without it
BLOCKED = "blocked"  # a dependency failed or the agent must replan: nothing was sent
RETRY_LATER = "retry_later"  # the console said wait longer than the agent's max_wait_s: nothing is in flight

# One admitted attempt's request, sent by the caller's code: given the attempt's number, send it and answer the outcome
# facts (recovery_client.facts_from_response / facts_from_exception) and the value to hand back if the call commits.
Send = Callable[[int], tuple[dict[str, Any], Any]]


@dataclass(frozen=True, kw_only=True)
class AttemptRecord:
    """One round of the loop, as the agent saw it (for its log and for a scenario's checks)."""

    attempt_id: str
    admitted: bool
    denied: str = ""  # the gate's reason when not admitted
    required_next: RequiredNext | dict[str, Any] = field(default_factory=dict)
    sent_at: float | None = None  # time.time() when the agent sent the request
    facts: dict[str, Any] = field(default_factory=dict)
    call_state: str = ""
    route: str = ""
    breaker_state: str = ""  # the tool's breaker as the console answered (an outcome's report, a breaker denial)
    public_message: str = ""  # what the console says a model may read about this round (docs/design/classification.md)
    value: Any = None  # what the send handed back (the provider's result, or a wrapped tool function's value)


@dataclass(kw_only=True)
class CallResult:
    tool: str
    key: str
    call_id: int | None
    outcome: str
    state: str
    result: Any = None
    detail: str = ""
    attempts: list[AttemptRecord] = field(default_factory=list)

    @property
    def sent(self) -> list[AttemptRecord]:
        return [a for a in self.attempts if a.sent_at is not None]


# How the loop ends a call on a `required_next` that is not a wait: (its ending, the detail it logs).
_ENDINGS: dict[str, tuple[str, str]] = {
    "degrade": (DEGRADED, "breaker open: fallback path"),
    "request_approval": (HUMAN_REVIEW, "needs a reviewer's approval"),
    "replan": (BLOCKED, "replan"),
    "repair_args": (BLOCKED, "repair_args"),
    "refresh_credentials": (BLOCKED, "refresh_credentials"),
}
# How a call reconciliation settled ends: (its ending, the detail it logs).
_SETTLED_ENDINGS: dict[str, tuple[str, str]] = {
    "COMMITTED": (COMMITTED, "settled by a receipt"),
    "HUMAN_REVIEW": (HUMAN_REVIEW, ""),
    "FAILED_PERMANENT": (FAILED, ""),
}


class Runtime:
    """The runtime loop for one tenant. `log` gets one line per step; `sleep` is how it waits (tests may pass a
    recording one). `before_send(tool, key, attempt_number)` runs just before each request leaves (drills use it to
    take the provider down for one attempt). `max_wait_s` (None: no limit) bounds a `retry_after` wait: a longer one
    ends the call RETRY_LATER instead of sleeping through it."""

    def __init__(
        self,
        client: RecoveryClient,
        *,
        tenant: str,
        name: str = "agent-runtime",
        log: Callable[[str], None] = lambda line: None,
        sleep: Callable[[float], None] = time.sleep,
        patience_s: float = 120.0,
        max_rounds: int = 12,
        before_send: Callable[[str, str, int], None] | None = None,
        max_wait_s: float | None = None,
        defer_reports: bool = False,
    ) -> None:
        self.client, self.tenant, self.name = client, tenant, name
        self.log, self.sleep = log, sleep
        self.patience_s, self.max_rounds = patience_s, max_rounds
        self.before_send = before_send
        self.max_wait_s = max_wait_s
        self.calls: dict[int, list[int]] = {}  # task id → the calls this runtime added to it
        # With defer_reports, a 2xx its admission's terms let wait is reported off the caller's clock
        # (recovery_client.deferred); the task's reports are in before its next admission and its end.
        self.defer_reports = defer_reports
        self.reports = DeferredReports(client, log)

    # Tasks.

    def start_task(
        self, external_id: str, *, goal: str, deadline: str | None = None, budget: dict[str, Any] | None = None
    ) -> Task:
        """Open (or find again) the task; `deadline` (ISO 8601 with an offset) goes into its budget
        (docs/design/budgets.md)."""
        budget = dict(budget or {})
        if deadline is not None:
            budget["deadline"] = deadline
        task = self.client.create_task(self.tenant, external_id, agent=self.name, goal=goal, budget=budget or None)
        self.log(f"task {task.id} ({external_id}): {goal}" + (f", deadline {deadline}" if deadline else ""))
        return task

    def submit(self, task_id: int, summary: str, deliverable: dict[str, Any] | None = None) -> Task:
        self.reports.settle(task_id)
        task = self.client.complete_task(task_id, summary, deliverable)
        self.log(f"task {task_id} submitted: outcome {task.outcome}")
        return task

    def abandon(self, task_id: int, reason: str) -> Task:
        self.reports.settle(task_id)
        task = self.client.abandon_task(task_id, reason)
        self.log(f"task {task_id} abandoned: {reason}")
        return task

    # Calls.

    def drive_call(
        self,
        task_id: int,
        call_id: int,
        *,
        tool: str,
        key: str,
        send: Send,
        state: str = "",
        patience_s: float | None = None,
        arguments: dict[str, Any] | None = None,
        evidence: tuple[str, ...] = (),
        attempt_id: Callable[[int], str] | None = None,
        admitted: Callable[[Admission], None] | None = None,
        first: CallRef | None = None,
    ) -> CallResult:
        """Drive an added call (`call_id`, last seen in `state`) until it is settled, degraded, left for a person, or
        refused: admit each attempt, let `send` make its request, report the facts, obey the answer.

        `arguments` (None: the call's) are repaired arguments the attempts carry, with `evidence` claimed by the first
        admission (`args_changed`); `attempt_id(number)` names each attempt (default "<key>-a<number>");
        `admitted(admission)` is told each admission before `send` runs (its `wire`: where the key goes). `first`: the
        call's registration when it carried the first attempt's admission (add_call(admit=<attempt 1's id>), API 1.2):
        that admission is used instead of asking again (with deferred reports, call `reports.settle(task_id)` before
        that registration, as recovery_client.recovered does)."""
        calls = self.calls.setdefault(task_id, [])
        if call_id not in calls:
            calls.append(call_id)
        outcome = CallResult(tool=tool, key=key, call_id=call_id, outcome="", state=state)
        deadline = time.monotonic() + (self.patience_s if patience_s is None else patience_s)
        name = attempt_id or (lambda number: f"{key}-a{number}")
        for number in range(1, self.max_rounds + 1):
            attempt = name(number)
            try:
                admission = self._admit(task_id, call_id, attempt, arguments, evidence, first if number == 1 else None)
            except NotAdmitted as denied:
                record = _denial(attempt, denied)
                outcome.attempts.append(record)
                self.log(f"  {tool} [{key}] not admitted: {record.denied} → {_action(record.required_next)}")
                if record.denied == "committed":  # it took effect before this run: it is never sent again
                    return self._done(outcome, COMMITTED, detail="committed before", state="COMMITTED")
                evidence = self._follow(outcome, record.required_next, deadline, task_id)
                if outcome.outcome:
                    return outcome
                continue
            if admitted is not None:
                admitted(admission)
            record = self._send_and_report(task_id, call_id, (tool, key, attempt), number, send, admission)
            outcome.attempts.append(record)
            outcome.state = record.call_state
            if record.call_state == "COMMITTED":
                return self._done(outcome, COMMITTED, record.value)
            evidence = self._follow(outcome, record.required_next, deadline, task_id)
            if outcome.outcome:
                return outcome
        return self._done(outcome, FAILED, detail=f"gave up after {self.max_rounds} rounds")

    def _admit(
        self,
        task_id: int,
        call_id: int,
        attempt: str,
        arguments: dict[str, Any] | None,
        evidence: tuple[str, ...],
        first: CallRef | None,
    ) -> Admission:
        """The attempt's admission: the one its registration carried, else asked now — after the task's deferred
        reports are in, so the console judges them before it admits anything more of the task."""
        if first is not None and first.admission is not None:
            return first.admission
        if first is not None and first.not_admitted is not None:
            gate = first.not_admitted.get("gate") or {}
            message = gate.get("public_message") or gate.get("reason", "")
            raise NotAdmitted(
                409, {"error": {"code": "not_admitted", "message": message, "detail": first.not_admitted}}
            )
        self.reports.settle(task_id)
        return self.client.admit(call_id, attempt, arguments=arguments, evidence=evidence)

    def _send_and_report(
        self, task_id: int, call_id: int, names: tuple[str, str, str], number: int, send: Send, admission: Admission
    ) -> AttemptRecord:
        """Send the admitted attempt and report it: at once, or — with defer_reports, for a 2xx passing the checks
        the admission handed over (recovery_client.deferred) — from the background, the caller answered now."""
        tool, key, attempt_id = names
        if self.before_send:
            self.before_send(tool, key, number)
        sent_at = time.time()
        facts, value = send(number)
        if self.defer_reports and passes(facts, admission.report, key=key):
            self.reports.defer(task_id, call_id, attempt_id, facts)
            self.log(f"  {tool} [{key}] attempt {number}: HTTP {facts['http_status']} → COMMITTED (report deferred)")
            return AttemptRecord(
                attempt_id=attempt_id, admitted=True, sent_at=sent_at, facts=facts, call_state="COMMITTED", value=value
            )
        answer = self.client.report(call_id, attempt_id, facts)
        decision: DecisionCard | dict[str, Any] = answer.decision or {}
        failure: Failure | dict[str, Any] = answer.failure or {}
        record = AttemptRecord(
            attempt_id=attempt_id,
            admitted=True,
            sent_at=sent_at,
            facts=facts,
            call_state=answer.call_state,
            route=decision.get("route", ""),
            required_next=answer.required_next,
            breaker_state=answer.breaker_state,
            public_message=decision.get("public_message") or failure.get("public_message", ""),
            value=value,
        )
        seen = f"HTTP {facts['http_status']}" if "http_status" in facts else facts.get("error", {}).get("kind", "?")
        card = f"; {decision.get('route')}, {_action(answer.required_next)}" if decision else ""
        self.log(f"  {tool} [{key}] attempt {number}: {seen} → {answer.call_state}{card}")
        return record

    def _follow(
        self, outcome: CallResult, required_next: RequiredNext | dict[str, Any], deadline: float, task_id: int
    ) -> tuple[str, ...]:
        """Do what `required_next` says; the evidence the next attempt carries, or set `outcome.outcome` to end."""
        action = required_next.get("action", "stop")
        if action == "retry_after":
            return self._retry_after(outcome, required_next, deadline)
        if action == "wait_for_reconcile":
            return self._after_reconcile(outcome, required_next, deadline, task_id)
        ending, detail = _ENDINGS.get(action, (FAILED, action))
        self._done(outcome, ending, detail=detail)
        return ()

    def _retry_after(
        self, outcome: CallResult, required_next: RequiredNext | dict[str, Any], deadline: float
    ) -> tuple[str, ...]:
        """Wait the delay the console named, unless it is longer than the agent waits (then end: retry later)."""
        wait_s = required_next.get("after_ms", 0) / 1000
        if self.max_wait_s is not None and wait_s > min(self.max_wait_s, max(0.0, deadline - time.monotonic())):
            self._done(outcome, RETRY_LATER, detail=f"retry after {wait_s:.1f} s: longer than the agent waits")
            return ()
        self.sleep(wait_s)
        return ("time_elapsed",)

    def _after_reconcile(
        self, outcome: CallResult, required_next: RequiredNext | dict[str, Any], deadline: float, task_id: int
    ) -> tuple[str, ...]:
        """Wait for the calls reconciliation settles, then end the call as its own settled state says, or go on."""
        detail = required_next.get("detail") or {}
        waited_for = detail.get("blocked_by") or [outcome.call_id]
        if detail.get("limit") == "unknown_budget":  # the task's other unknowns must settle first
            waited_for = [c for c in self.calls.get(task_id, []) if c != outcome.call_id] or waited_for
        states = self._wait_settled(waited_for, required_next.get("after_ms", 0), deadline)
        if any(state in SETTLING for state in states.values()):
            self._done(outcome, UNSETTLED, detail=f"still settling: {states}")
            return ()
        own = states.get(outcome.call_id) if outcome.call_id is not None else None
        if own == "RETRYABLE":  # NOT_COMMITTED → RETRYABLE: a receipt proved the first attempt did nothing
            return ("state_verified",)
        if own in _SETTLED_ENDINGS:  # final: the poll that saw it is the call's last word, no need to ask again
            ending, said = _SETTLED_ENDINGS[own]
            self._done(outcome, ending, detail=said, state=own)
            return ()
        if outcome.call_id not in waited_for and any(state != "COMMITTED" for state in states.values()):
            self._done(outcome, BLOCKED, detail=f"dependency ended {states}")
        return ()  # a dependency settled: this call's own first attempt is next

    def _wait_settled(self, call_ids: list[int], after_ms: int, deadline: float) -> dict[int, str]:
        """Wait until none of the calls is settling any more, or the agent's patience runs out: after the delay the
        console named, each call read once, then a long poll on a settling one (answered the moment it moves), again
        until none settles. One request per change, where polling would ask many times for nothing."""
        self.sleep(min(after_ms / 1000, max(0.0, deadline - time.monotonic())))
        seen = {call_id: self.client.get_call(call_id) for call_id in call_ids}
        while True:
            states = {call_id: detail["state"] for call_id, detail in seen.items()}
            settling = [call_id for call_id, state in states.items() if state in SETTLING]
            left_ms = int((deadline - time.monotonic()) * 1000)
            if not settling or left_ms <= 0:
                said = ", ".join(f"call {c} {s}" for c, s in states.items())
                if settling:
                    self.log(f"  not waiting any longer ({said}): reconciliation goes on without the agent")
                else:
                    self.log(f"  waited for reconciliation: {said}")
                return states
            call_id = settling[0]
            seen[call_id] = self.client.get_call(
                call_id, version=seen[call_id]["version"], wait_ms=min(left_ms, LONG_POLL_MS)
            )

    def _done(
        self, outcome: CallResult, kind: str, result: Any = None, *, detail: str = "", state: str = ""
    ) -> CallResult:
        outcome.outcome, outcome.detail = kind, detail
        if result is not None:
            outcome.result = result
        if state:
            outcome.state = state
        return outcome


def _denial(attempt: str, denied: NotAdmitted) -> AttemptRecord:
    """A round whose attempt was not admitted, as the denial says it."""
    return AttemptRecord(
        attempt_id=attempt,
        admitted=False,
        denied=denied.gate.get("reason", ""),
        required_next=denied.required_next,
        call_state=denied.detail.get("call_state", ""),
        breaker_state=(denied.required_next.get("detail") or {}).get("breaker", ""),
        public_message=denied.gate.get("public_message", ""),
    )


def _action(required_next: RequiredNext | dict[str, Any]) -> str:
    action = required_next.get("action", "")
    after = required_next.get("after_ms") or 0
    return f"{action} after {after} ms" if after else action

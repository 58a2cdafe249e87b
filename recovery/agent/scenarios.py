"""The demo agent's scenarios: each one a small task run by the Agent through the real API, against the sandbox
provider with one fault injected, ending in a pinned, checkable end.

    results = run_scenarios(stage, ["reply-lost-after-commit"], log=print)
    assert all(result.passed for result in results)

A scenario takes a Stage (recovery/drills/stage.py: the API's URL and a token, the sandbox, the registry) and a log
callable, and returns a ScenarioResult whose checks compare what it expected with what it observed — read back from
the console's API (GET /calls/{id}, GET /tasks/{id}) and from the sandbox's own evidence (its ledger of business
effects, its request log), never from the product's models: this is the agent's side of the wire, and it imports
nothing but the runtime and the client.

Faults are scoped to the scenario's own idempotency keys (writes) or to its own order ids (reads, whose routes name
the order), so scenarios run side by side, and next to anyone else's work on the same sandbox, without meeting.
The one exception is a circuit breaker, which is shared by design: the 5xx storm opens order.lookup's, so it runs
alone, after the others (`Scenario.exclusive`), and leaves the breaker closed again by a half-open probe once the
cooldown has passed (3 s on the drill registry, 20 s on the shipped one); the status-API-down refund fails its
checks on purpose, which counts against the provider's status-endpoint breaker, so it runs alone too. That refund is
left in HUMAN_REVIEW for the demo's reviewer and approver to replay with its own key (README, "Demo users").

The same scenarios run on the drill stage (quick reconcile schedules; what the tests use) and on the demo stage
(`make run`'s console and sandbox with the shipped registry's production schedules: a refund's first status check
after 5 s, a payment's after 3 s, a grant's after 2 s).
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from recovery.agent.runtime import DEGRADED, HUMAN_REVIEW, CallResult
from recovery.client import RecoveryError

if TYPE_CHECKING:
    from recovery.drills.stage import Stage

Log = Callable[[str], None]

# A provider's callback can settle a call before the runtime has even reported the lost reply (the signed word of
# the provider may come first, SPEC §10). The scenarios that lose a reply hold their key's callback back for this
# long, so what the agent meets is an UNKNOWN settled by the status query, the same on every run.
HOLD_CALLBACK_MS = 30_000
# Receipts that are the provider's own word about a call (not the runtime's 2xx, not a person's).
PROVIDER_RECEIPTS = ("poll", "callback")


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    expected: Any
    observed: Any
    passed: bool


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
    play: Callable[[_Play], None]
    exclusive: bool = False  # touches a shared breaker: runs alone, after the others


# The scenarios' shared machinery ------------------------------------------------------------------------------------


class _Play:
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

    # What it checks.

    def check(self, name: str, expected: Any, observed: Any, passed: bool | None = None) -> bool:
        ok = expected == observed if passed is None else passed
        self.result.checks.append(Check(name=name, expected=expected, observed=observed, passed=ok))
        self.log(f"  {'ok  ' if ok else 'FAIL'} {name}: expected {expected}, observed {observed}")
        return ok

    def call(self, call_id: int | None) -> dict:
        return self.client.get_call(call_id) if call_id is not None else {}

    def effects(self, key: str) -> int:
        return self.sandbox.ledger(key)["effects"]

    def writes(self, key: str) -> list[dict]:
        """The write requests the sandbox received with this idempotency key (status queries are GETs)."""
        return [r for r in self.sandbox.requests(key=key) if r["method"] != "GET"]

    def reads(self, route: str) -> list[dict]:
        return [r for r in self.sandbox.requests(path_prefix=route) if r["path"] == route]

    def submit(self, task_id: int, summary: str) -> str:
        return self.agent.submit(task_id, summary).outcome or ""


def _settling_receipt(call: dict, observed: str = "committed") -> dict | None:
    """The provider receipt (a status query or a signed callback) that moved the call on `observed`."""
    for receipt in call.get("receipts", []):
        if receipt["source"] in PROVIDER_RECEIPTS and receipt["applied"] and receipt["observed"] == observed:
            return receipt
    return None


def _settled_by(call: dict) -> str:
    receipt = _settling_receipt(call)
    if receipt is None:
        return "no provider receipt"
    return f"a {receipt['source']} receipt"


def _first_denial(result: CallResult) -> tuple[str, str]:
    """(gate reason, required_next.action) of the call's first refused admission, or ("", "")."""
    for record in result.attempts:
        if not record.admitted:
            return record.denied, record.required_next.get("action", "")
    return "", ""


def _first_admitted_at(call: dict) -> datetime | None:
    stamps = [a["admitted_at"] for a in call.get("attempts", []) if a.get("admitted_at")]
    return datetime.fromisoformat(stamps[0]) if stamps else None


def _settled_at(call: dict) -> datetime | None:
    receipt = _settling_receipt(call)
    return datetime.fromisoformat(receipt["checked_at"]) if receipt else None


def _after(later: datetime | None, earlier: datetime | None) -> bool:
    return later is not None and earlier is not None and later > earlier


def _gaps(requests: list[dict]) -> list[float]:
    times = [datetime.fromisoformat(r["at"]) for r in requests]
    return [round((b - a).total_seconds(), 3) for a, b in itertools.pairwise(times)]


REFUND_CENTS = 1250
ADDRESS = {"line1": "1 Rue de la Paix", "city": "Paris", "postcode": "75002", "country": "FR"}


# The scenarios --------------------------------------------------------------------------------------------------------


def _check_settled_by_receipt(play: _Play, name: str, call: dict) -> None:
    play.check(name, "a provider receipt", "a provider receipt" if _settling_receipt(call) else "none")


def _check_admitted_after(play: _Play, name: str, expected: str, waiting: dict, blocker: dict) -> None:
    """The waiting call's first admission came after the blocking call was settled by its receipt."""
    after = _after(_first_admitted_at(waiting), _settled_at(blocker))
    play.check(name, expected, "after" if after else "before or never", after)


def _refund_task(play: _Play, key: str, order_id: str, cents: int) -> tuple[int, CallResult]:
    """A task of one refund, run to its end by the agent: (the task's id, the refund's result)."""
    task_id = play.start(f"refund {cents} cents on order {order_id}")
    refund = play.run_call(
        "refund",
        task_id,
        step=1,
        tool=play.tool("refund.create"),
        key=key,
        arguments={"order_id": order_id, "amount_cents": cents},
    )
    return task_id, refund


def reply_lost_after_commit(play: _Play) -> None:
    key = play.key("refund")
    order_id = f"O-{play.digits(1)}"
    play.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    play.fault(route="/refunds", key=key, kind="delayed_callbacks", ms=HOLD_CALLBACK_MS, times=1)
    task_id, refund = _refund_task(play, key, order_id, REFUND_CENTS)
    outcome = play.submit(task_id, f"refund of order {order_id}: {refund.state}")

    call = play.call(refund.call_id)
    play.check("the lost reply", "UNKNOWN", refund.attempts[0].call_state if refund.attempts else "")
    play.check("call state", "COMMITTED", call["state"])
    _check_settled_by_receipt(play, "settled by", call)
    play.check("attempts made", 1, call["attempts_made"])
    play.check("write requests for the key", 1, len(play.writes(key)))
    play.check("business effects for the key", 1, play.effects(key))
    play.check("task outcome", "completed", outcome)
    play.result.end = f"{call['state']} by {_settled_by(call)}, {play.effects(key)} effect"


def lost_before_commit(play: _Play) -> None:
    key = play.key("refund")
    order_id = f"O-{play.digits(1)}"
    play.fault(route="/refunds", key=key, kind="drop_before_commit", times=1)
    task_id, refund = _refund_task(play, key, order_id, REFUND_CENTS)
    outcome = play.submit(task_id, f"refund of order {order_id}: {refund.state}")

    call = play.call(refund.call_id)
    sent = refund.sent
    play.check("the lost request", "UNKNOWN", sent[0].call_state if sent else "")
    not_committed = _settling_receipt(call, "not_committed")
    play.check(
        "the status query found",
        "not_committed",
        not_committed["observed"] if not_committed else "no receipt",
    )
    retries = [g for g in call["gate_decisions"] if g["allowed"] and g["evidence_used"]]
    play.check("the retry admitted on", "state_verified", retries[0]["evidence_used"] if retries else "no retry")
    outcomes = [r["outcome"] for r in play.writes(key)]
    play.check("write requests, same key", ["dropped_before_commit", "answered"], outcomes)
    play.check("call state", "COMMITTED", call["state"])
    play.check("business effects for the key", 1, play.effects(key))
    play.check("task outcome", "completed", outcome)
    play.result.end = f"{call['state']} after a same-key retry, {play.effects(key)} effect"


def rate_limited_lookup(play: _Play) -> None:
    key = play.key("lookup")
    order_id, route = play.order_route("lookup", 1)
    play.fault(route=route, kind="rate_limit", retry_after_s=2, times=2)
    task_id = play.start(f"look up order {order_id}")
    lookup = play.run_call(
        "lookup", task_id, step=1, tool=play.tool("order.lookup"), key=key, arguments={"order_id": order_id}
    )
    outcome = play.submit(task_id, f"order {order_id} is {(lookup.result or {}).get('status', '?')}")

    call = play.call(lookup.call_id)
    requests = play.reads(route)
    play.check("call state", "COMMITTED", call["state"])
    play.check("provider answers", ["rate_limited", "rate_limited", "answered"], [r["outcome"] for r in requests])
    gaps = _gaps(requests)
    play.check("seconds between attempts", "each >= 2 (Retry-After)", gaps, bool(gaps) and min(gaps) >= 2.0)
    play.check("task outcome", "completed", outcome)
    play.result.end = f"{call['state']} on attempt {call['attempts_made']}, gaps {gaps} s"


MAX_STORM_CALLS = 8


def dependency_5xx_storm(play: _Play) -> None:
    order_id, route = play.order_route("storm", 1)
    healthy_order, _ = play.order_route("probe", 2)
    lookup = play.tool("order.lookup")
    # Scoped to this scenario's order: once the breaker has cooled down, anyone's lookup of another order succeeds.
    play.fault(route=route, kind="error", status=503, times=3 * MAX_STORM_CALLS)
    task_id = play.start(f"summarise order {order_id}")
    step, opened = 0, None
    # Each failing call spends its attempts; the breaker opens once the window holds enough failures (4 on the
    # drill registry, 10 on the shipped one), and the call that meets it ends on the fallback path.
    while step < MAX_STORM_CALLS and opened is None:
        step += 1
        result = play.run_call(
            f"storm-{step}",
            task_id,
            step=step,
            tool=lookup,
            key=play.key(f"lookup-{step}"),
            arguments={"order_id": order_id},
        )
        if result.outcome == DEGRADED:
            opened = result
    sent_before = len(play.reads(route))
    step += 1
    denied = play.run_call(
        "denied", task_id, step=step, tool=lookup, key=play.key("lookup-denied"), arguments={"order_id": order_id}
    )
    sent_after = len(play.reads(route))
    refusal = denied.attempts[0] if denied.attempts else None
    detail = (refusal.required_next.get("detail") or {}) if refusal else {}
    cooldown_ms = refusal.required_next.get("after_ms", 0) if refusal else 0
    play.log(f"  the breaker cools down: {cooldown_ms / 1000:.1f} s, then a lookup of another order probes it")
    time.sleep(cooldown_ms / 1000 + 0.3)
    step += 1
    probe = play.run_call(
        "probe", task_id, step=step, tool=lookup, key=play.key("lookup-probe"), arguments={"order_id": healthy_order}
    )
    outcome = play.submit(task_id, "order status unavailable: a read-only summary from the fallback")

    seen = opened.attempts[-1].breaker_state if opened and opened.attempts else "never open"
    play.check("the breaker, as the storm left it", "open", seen)
    refused = f"{refusal.denied} → {refusal.required_next.get('action')}" if refusal and not refusal.admitted else "-"
    play.check("a further call at admission", "breaker_open → degrade", refused)
    play.check("the fallback it names", "read_only_summary", detail.get("fallback"))
    play.check("requests the refused call sent", 0, sent_after - sent_before)
    play.check("task outcome", "degraded", outcome)
    play.check("after the cooldown, a probe lookup", "COMMITTED", probe.state)
    play.check("the breaker after the probe", "closed", probe.sent[-1].breaker_state if probe.sent else "no probe")
    met = f"on storm call {step - 2}" if opened else "never"
    play.result.end = f"breaker opened {met}, then degrade; task {outcome}; closed again by a probe"


def order_payment_shipment(play: _Play) -> None:
    order_key, payment_key, shipment_key = play.key("order"), play.key("payment"), play.key("shipment")
    customer = f"C-{play.digits(1)}"
    play.fault(route="/payments", key=payment_key, kind="commit_then_drop", times=1)
    play.fault(route="/payments", key=payment_key, kind="delayed_callbacks", ms=HOLD_CALLBACK_MS, times=1)
    task_id = play.start(f"order, pay and ship for customer {customer}")
    order = play.run_call(
        "order",
        task_id,
        step=1,
        tool=play.tool("order.create"),
        key=order_key,
        arguments={"customer_id": customer, "items": [{"sku": "demo-mug", "quantity": 2}]},
    )
    created = order.result or {}
    # The agent does not wait for the payment's reconciliation: it goes on to the shipment, and the console holds it.
    payment = play.run_call(
        "payment",
        task_id,
        step=2,
        depends_on=[1],
        tool=play.tool("payment.capture"),
        key=payment_key,
        arguments={"order_id": created.get("order_id", "O-0"), "amount_cents": created.get("total_cents", 1)},
        patience_s=0,
    )
    shipment = play.run_call(
        "shipment",
        task_id,
        step=3,
        depends_on=[2],
        tool=play.tool("shipment.create"),
        key=shipment_key,
        arguments={"order_id": created.get("order_id", "O-0"), "address": ADDRESS, "service": "standard"},
    )
    outcome = play.submit(task_id, f"order {created.get('order_id')} paid and shipped")

    payment_call, shipment_call = play.call(payment.call_id), play.call(shipment.call_id)
    play.check("order", "COMMITTED", order.state)
    play.check("the payment's lost reply", "UNKNOWN", payment.sent[0].call_state if payment.sent else "")
    play.check("the shipment at admission", "blocked_by_dependency", _first_denial(shipment)[0])
    _check_settled_by_receipt(play, "payment settled by", payment_call)
    play.check("payment state", "COMMITTED", payment_call["state"])
    _check_admitted_after(play, "shipment first admitted", "after the payment's receipt", shipment_call, payment_call)
    play.check("shipment state", "COMMITTED", shipment_call["state"])
    effects = [play.effects(key) for key in (order_key, payment_key, shipment_key)]
    play.check("effects (order, payment, shipment)", [1, 1, 1], effects)
    play.check("payment write requests", 1, len(play.writes(payment_key)))
    play.check("task outcome", "completed", outcome)
    play.result.end = (
        f"shipment held until the payment was {payment_call['state']} by {_settled_by(payment_call)}; "
        f"shipment {shipment_call['state']}, task {outcome}"
    )


def grant_unknown_budget(play: _Play) -> None:
    editor_key, viewer_key = play.key("grant-editor"), play.key("grant-viewer")
    user = f"U-{play.digits(1)}"
    play.fault(route="/access/grants", key=editor_key, kind="commit_then_drop", times=1)
    play.fault(route="/access/grants", key=editor_key, kind="delayed_callbacks", ms=HOLD_CALLBACK_MS, times=1)
    task_id = play.start(f"onboard {user}: editor on the repository, viewer on the wiki")
    grant = play.tool("access.grant")
    editor = play.run_call(
        "editor",
        task_id,
        step=1,
        tool=grant,
        key=editor_key,
        arguments={"user_id": user, "role": "editor", "resource": f"repo:{user}"},
        patience_s=0,
    )
    viewer = play.run_call(
        "viewer",
        task_id,
        step=2,
        tool=grant,
        key=viewer_key,
        arguments={"user_id": user, "role": "viewer", "resource": f"wiki:{user}"},
    )
    outcome = play.submit(task_id, f"{user} onboarded")

    editor_call, viewer_call = play.call(editor.call_id), play.call(viewer.call_id)
    play.check("the first grant's lost reply", "UNKNOWN", editor.sent[0].call_state if editor.sent else "")
    play.check("the second grant at admission", "unknown_budget", _first_denial(viewer)[0])
    _check_settled_by_receipt(play, "first grant settled by", editor_call)
    play.check("first grant state", "COMMITTED", editor_call["state"])
    _check_admitted_after(
        play, "second grant first admitted", "after the first grant's receipt", viewer_call, editor_call
    )
    play.check("second grant state", "COMMITTED", viewer_call["state"])
    play.check("effects (editor, viewer)", [1, 1], [play.effects(editor_key), play.effects(viewer_key)])
    play.check("first grant write requests", 1, len(play.writes(editor_key)))
    play.check("task outcome", "completed", outcome)
    play.result.end = f"second grant held until the first was {editor_call['state']}, task {outcome}"


def invalid_result(play: _Play) -> None:
    key = play.key("lookup")
    order_id, route = play.order_route("lookup", 1)
    play.fault(route=route, kind="bad_result", drop=["status"], times=1)
    task_id = play.start(f"look up order {order_id}")
    lookup = play.run_call(
        "lookup", task_id, step=1, tool=play.tool("order.lookup"), key=key, arguments={"order_id": order_id}
    )
    outcome = play.submit(task_id, f"order {order_id} is {(lookup.result or {}).get('status', '?')}")

    call = play.call(lookup.call_id)
    first = call["attempts"][0] if call["attempts"] else {}
    play.check("first answer classified", "invalid_result", first.get("failure_class"))
    play.check("first answer's route", "reject", (first.get("decision") or {}).get("route"))
    play.check("provider answers", ["bad_result", "answered"], [r["outcome"] for r in play.reads(route)])
    play.check("call state", "COMMITTED", call["state"])
    play.check("attempts made", 2, call["attempts_made"])
    play.check("the result the agent kept has a status", True, "status" in (lookup.result or {}))
    play.check("task outcome", "completed", outcome)
    play.result.end = f"rejected once, {call['state']} on attempt {call['attempts_made']}"


def needs_approval(play: _Play) -> None:
    key = play.key("refund")
    order_id = f"O-{play.digits(1)}"
    play.fault(route="/refunds", key=key, kind="error", status=403, code="needs_approval", times=1)
    task_id, refund = _refund_task(play, key, order_id, REFUND_CENTS * 40)
    task = play.agent.submit(task_id, f"refund of order {order_id} waits for a reviewer's approval")

    call = play.call(refund.call_id)
    decision = call.get("latest_decision") or {}
    play.check("agent's end", HUMAN_REVIEW, refund.outcome)
    play.check("call state", "HUMAN_REVIEW", call["state"])
    play.check(
        "decision",
        "escalate → request_approval",
        f"{decision.get('route')} → {(decision.get('required_next') or {}).get('action')}",
    )
    play.check("attempts made", 1, call["attempts_made"])
    play.check("business effects for the key", 0, play.effects(key))
    play.check("task outcome", "completed_with_unknowns", task.outcome)
    play.check("the task lists it for review", [call["id"]], [c["call_id"] for c in task.raw.get("needs_review", [])])
    play.result.end = f"{call['state']}, no effect, task {task.outcome}"


# The demo's refund for a person to replay: its late callback is held back this long (the sandbox's maximum), so
# that what settles it is the reviewer's same-key replay, not the provider's webhook.
HOLD_REVIEW_CALLBACK_MS = 600_000
CHECK_WAIT_S = 10  # how long the impatient agent waits for each immediate check it asked for


def status_api_down(play: _Play) -> None:
    """The refund commits, its reply is lost, and the provider's status API answers 503 for its key: every check
    fails and counts, and at the poll budget the call goes to a person. The agent, impatient, asks for each check
    at once (POST .../reconcile) instead of waiting out the schedule (minutes on the shipped registry). What it
    leaves is the demo's refund for the reviewer and the approver: a same-key replay, deduplicated by the provider.
    It runs alone: its failing checks count against the provider's status-endpoint breaker, shared by everyone."""
    key = play.key("refund")
    order_id = f"O-{play.digits(1)}"
    tool = play.tool("refund.create")
    budget = next(t for t in play.stage.registry["tools"] if t["name"] == tool).get("reconcile", {}).get("max_checks")
    play.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    play.fault(route="/refunds", key=key, kind="delayed_callbacks", ms=HOLD_REVIEW_CALLBACK_MS, times=1)
    play.fault(route="/refunds/by-key", key=key, kind="status_down", status=503)
    task_id = play.start(f"refund {REFUND_CENTS} cents on order {order_id}")
    refund = play.run_call(
        "refund",
        task_id,
        step=1,
        tool=tool,
        key=key,
        arguments={"order_id": order_id, "amount_cents": REFUND_CENTS},
        patience_s=0,
    )
    call = play.call(refund.call_id)
    asked = 0
    while call.get("state") in ("UNKNOWN", "STILL_UNKNOWN") and asked < (budget or 0) + 2:
        asked += 1
        made = call["checks_made"]
        try:
            play.client.reconcile(refund.call_id)
        except RecoveryError as exc:
            if exc.code != "not_reconcilable":
                raise
            call = play.call(refund.call_id)  # a scheduled check got there first and spent the budget
            continue
        deadline = time.monotonic() + CHECK_WAIT_S
        while call["checks_made"] == made and time.monotonic() < deadline:
            time.sleep(0.1)
            call = play.call(refund.call_id)
    play.log(f"  the agent asked for {asked} immediate check(s); the call is {call.get('state')}")
    task = play.agent.submit(task_id, f"refund of order {order_id}: unconfirmed, waiting for a reviewer")

    call = play.call(refund.call_id)
    queries = [r["status"] for r in play.sandbox.requests(key=key) if r["method"] == "GET"]
    receipts = [r["observed"] for r in call["receipts"]]
    play.check("the lost reply", "UNKNOWN", refund.sent[0].call_state if refund.sent else "")
    play.check("checks made (the poll budget)", budget, call["checks_made"])
    play.check(
        "every check failed",
        "failed (503), or skipped as unreachable once the status endpoint's breaker opened",
        receipts,
        bool(receipts) and all(observed in ("failed", "unreachable") for observed in receipts),
    )
    play.check("status queries the provider answered", "503 only", queries, set(queries) <= {503})
    play.check("call state", "HUMAN_REVIEW", call["state"])
    play.check("outcome", "poll_budget_exhausted", call["outcome"])
    play.check("write requests for the key", 1, len(play.writes(key)))
    play.check("business effects for the key", 1, play.effects(key))
    play.check("task outcome", "completed_with_unknowns", task.outcome)
    play.check("the task lists it for review", [call["id"]], [c["call_id"] for c in task.raw.get("needs_review", [])])
    play.result.end = (
        f"{call['state']} after {call['checks_made']} failed checks, {play.effects(key)} effect at the provider:"
        f" replay it with the same key in the console (key {key})"
    )


DEADLINE_S = 2


def no_submission(play: _Play) -> None:
    key = play.key("lookup")
    order_id, _ = play.order_route("lookup", 1)
    deadline = datetime.now(UTC) + timedelta(seconds=DEADLINE_S)
    task_id = play.start(
        f"summarise order {order_id} within {DEADLINE_S} s", deadline=deadline.isoformat().replace("+00:00", "Z")
    )
    # The replica, not order.lookup: this scenario's lookup must not weigh on the breaker the others exercise.
    lookup = play.tool("order.lookup_replica")
    play.run_call("lookup", task_id, step=1, tool=lookup, key=key, arguments={"order_id": order_id})
    before = play.client.get_task(task_id).raw
    play.log("  the agent stops here: no submission, no abandon")
    time.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + 0.5)
    after = play.client.get_task(task_id).raw

    play.check("flagged before the deadline", False, before["no_submission"])
    play.check("flagged after the deadline", True, after["no_submission"])
    play.check("task status", "open", after["status"])
    play.check("task outcome", None, after["outcome"])
    play.check("next action", "submit_or_abandon", after["next_action"].split(" ")[0])
    play.result.end = f"{after['status']}, no_submission after its {DEADLINE_S} s deadline"


# The catalogue, and running it ---------------------------------------------------------------------------------------

SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            name="reply-lost-after-commit",
            title="refund, reply lost after commit",
            pinned_end="COMMITTED by a receipt, 1 effect, no second request",
            play=reply_lost_after_commit,
        ),
        Scenario(
            name="lost-before-commit",
            title="refund, lost before commit",
            pinned_end="NOT_COMMITTED → same-key retry → COMMITTED, 1 effect",
            play=lost_before_commit,
        ),
        Scenario(
            name="rate-limited-lookup",
            title="rate-limited lookup (429, Retry-After 2 s, twice)",
            pinned_end="COMMITTED, no attempt before its Retry-After",
            play=rate_limited_lookup,
        ),
        Scenario(
            name="invalid-result",
            title="a lookup whose result fails validation",
            pinned_end="invalid_result, rejected, retried once, then COMMITTED",
            play=invalid_result,
        ),
        Scenario(
            name="order-payment-shipment",
            title="order → payment → shipment, payment reply lost",
            pinned_end="shipment refused at admission until the payment is COMMITTED by a receipt; task completed",
            play=order_payment_shipment,
        ),
        Scenario(
            name="grant-unknown-budget",
            title="access grant with unknown budget 0, reply lost",
            pinned_end="the task's other writes refused until it settles",
            play=grant_unknown_budget,
        ),
        Scenario(
            name="needs-approval",
            title="a refund answered 403 with an approvable code",
            pinned_end="HUMAN_REVIEW, left for a reviewer",
            play=needs_approval,
        ),
        Scenario(
            name="no-submission",
            title="a task that stops without submitting",
            pinned_end="flagged no_submission after its deadline",
            play=no_submission,
        ),
        Scenario(
            name="status-api-down",
            title="refund, reply lost, status API down",
            pinned_end="HUMAN_REVIEW at the poll budget, 1 effect: left for a reviewer to replay with the same key",
            play=status_api_down,
            exclusive=True,
        ),
        Scenario(
            name="5xx-storm",
            title="5xx storm on order.lookup",
            pinned_end="breaker open, further attempts denied with degrade, task degraded",
            play=dependency_5xx_storm,
            exclusive=True,
        ),
    )
}


def run_scenario(stage: Stage, name: str, log: Log) -> ScenarioResult:
    """Run one scenario; an exception ends it with `error` set instead of escaping."""
    scenario = SCENARIOS[name]
    play = _Play(scenario, stage, log, number=list(SCENARIOS).index(name) + 1)
    log(f"{scenario.title}: expect {scenario.pinned_end}")
    started = time.monotonic()
    try:
        scenario.play(play)
    except Exception as exc:  # a scenario that breaks is a failed scenario, not a crashed demo
        play.result.error = f"{type(exc).__name__}: {exc}"
        for line in traceback.format_exc().rstrip().splitlines():
            log(f"  {line}")
    play.result.seconds = round(time.monotonic() - started, 1)
    verdict = "as pinned" if play.result.passed else "NOT as pinned"
    log(f"{verdict} ({play.result.score} checks, {play.result.seconds} s): {play.result.end or play.result.error}")
    return play.result


def run_scenarios(stage: Stage, names: Iterable[str] | None, log: Log) -> list[ScenarioResult]:
    """Run the named scenarios (all when `names` is empty), each line of their logs prefixed with the scenario's
    name. Those that share nothing run side by side on threads; exclusive ones (a shared breaker) run afterwards,
    one at a time. Results come back in the catalogue's order."""
    wanted = list(dict.fromkeys(names or SCENARIOS))
    unknown = [name for name in wanted if name not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    width = max(len(name) for name in wanted)
    lock = threading.Lock()

    def prefixed(name: str) -> Log:
        def write(line: str) -> None:
            with lock:
                log(f"{name:<{width}} | {line}")

        return write

    results: dict[str, ScenarioResult] = {}
    together = [name for name in wanted if not SCENARIOS[name].exclusive]
    alone = [name for name in wanted if SCENARIOS[name].exclusive]
    if together:
        with ThreadPoolExecutor(len(together), thread_name_prefix="scenario") as pool:
            futures = {name: pool.submit(run_scenario, stage, name, prefixed(name)) for name in together}
            results.update({name: future.result() for name, future in futures.items()})
    for name in alone:
        results[name] = run_scenario(stage, name, prefixed(name))
    return [results[name] for name in SCENARIOS if name in results]

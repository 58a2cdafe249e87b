"""Steps and checks the two compensation drills share (docs/compensation.md): an order the demo agent creates for real,
its compensation started by an approved `start_compensation` (the drill reviewer previews and requests it, an approver
approves it, a worker executes it: the entry is made and its cancel sent with the entry's own key), and what the
sandbox's ledger and request log say about the order and its cancellation."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from recovery_client.runtime import CallResult

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor
from recovery.devtools.agent import Agent
from recovery.devtools.drills.checks import check
from recovery.devtools.drills.evidence import action_events
from recovery.devtools.drills.framework import Run, wait
from recovery.devtools.drills.results import CheckRow
from recovery.devtools.drills.stage import DRILL_APPROVERS, DRILL_REVIEWER, drill_people
from recovery.engine.states import CallState as S
from recovery.models import ActionRequest, ActionStatus, Call, CompensationEntry
from recovery.services.actions import action_approve, action_preview, action_request
from recovery.services.compensation_plans import derive_key

START_COMPENSATION = "start_compensation"  # the operator action that undoes a COMMITTED call
ITEMS = [{"sku": "SKU-1", "quantity": 2}]
SETTLE_WAIT_S = 60  # how long the drill waits for the execution and the compensation to end
COMPENSATION_ENDS = (S.COMPENSATED, S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED)
ACTION_ENDS = (ActionStatus.EXECUTED, ActionStatus.FAILED, ActionStatus.INTERRUPTED, ActionStatus.STALE)
# An approved start, as its request's audit events tell it: each status once, in this order.
STARTED = [
    AuditAction.ACTION_PREVIEWED,
    AuditAction.ACTION_REQUESTED,
    AuditAction.ACTION_APPROVED,
    AuditAction.ACTION_EXECUTING,
    AuditAction.ACTION_EXECUTED,
]


@dataclass(frozen=True, kw_only=True)
class Order:
    """An order the demo agent created, COMMITTED: its task, its call and the provider's order id."""

    task_id: int
    result: CallResult
    order_id: str

    @property
    def key(self) -> str:
        return self.result.key

    @property
    def call_id(self) -> int:
        return self.result.call_id

    @property
    def cancel_route(self) -> str:
        """The sandbox route that cancels it (order.cancel's request path)."""
        return f"/orders/{self.order_id}/cancel"

    @property
    def compensation_key(self) -> str:
        """The key its first compensation must carry (docs/compensation.md: derived from the order's key and the entry
        number, never regenerated); the drill reads the sandbox's evidence under it."""
        return derive_key(self.key, 1)


def committed_order(run: Run, label: str, *, goal: str) -> tuple[Agent, Order]:
    """An order the agent creates for real (order.create through the API and the sandbox) in a task of its own
    (`drill-<label>`), recorded as a key row; RuntimeError when it did not commit (nothing to compensate)."""
    agent = run.agent()
    task_id = agent.start_task(run.key(f"drill-{label}"), goal=goal).id
    arguments = {"customer_id": f"C-{int(run.tag, 16)}", "items": ITEMS}
    tool = run.stage.tool("order.create")
    result = run.call(agent.run_call(task_id, step=1, tool=tool, key=run.key(f"order-{label}"), arguments=arguments))
    order_id = result.result.get("order_id") if isinstance(result.result, dict) else None
    if result.state != S.COMMITTED or not isinstance(order_id, str):
        raise RuntimeError(f"the order did not commit ({result.state}: {result.detail}): nothing to compensate")
    run.log(f"  order {order_id} created (call {result.call_id}, key {result.key})")
    return agent, Order(task_id=task_id, result=result, order_id=order_id)


def start_compensation(run: Run, order: Order, *, reason: str) -> int:
    """The drill reviewer previews and requests `start_compensation` on the order's call, the first drill approver
    approves it (a second person: four eyes), and a worker executes it; the request's id."""
    people = drill_people()
    reviewer, approver = people.reviewer, people.approvers[0]
    actor = Actor.for_user(reviewer)
    preview = action_preview(call_id=order.call_id, action=START_COMPENSATION, user=reviewer, actor=actor)
    requested = action_request(
        request_id=preview.pk, user=reviewer, actor=actor, reason=reason, plan_hash=preview.plan_hash
    )
    if requested.status != ActionStatus.REQUESTED:
        raise RuntimeError(f"the start_compensation request is {requested.status}, not requested")
    action_approve(
        request_id=preview.pk,
        user=approver,
        actor=Actor.for_user(approver),
        reason="drill: undo the order; its cancel carries a key of its own, so the provider deduplicates it",
    )
    run.log(f"  start_compensation requested by {reviewer.get_username()}, approved by {approver.get_username()}")
    return preview.pk


def wait_compensation_end(run: Run, order: Order, request_id: int) -> CompensationEntry | None:
    """Wait until the request's execution is over and the order's compensation has ended (or SETTLE_WAIT_S
    passed); the order's first entry, if one was made."""

    def ended() -> bool:
        executed = ActionRequest.objects.filter(pk=request_id, status__in=ACTION_ENDS).exists()
        return executed and Call.objects.filter(pk=order.call_id, state__in=COMPENSATION_ENDS).exists()

    settled = wait(ended, SETTLE_WAIT_S, every_s=0.2)
    entry = CompensationEntry.objects.filter(call_id=order.call_id, number=1).first()
    state = Call.objects.values_list("state", flat=True).get(pk=order.call_id)
    seen = f"entry 1 {entry.state}" if entry else "no entry"
    run.log(f"  {'compensation ended' if settled else f'still waiting after {SETTLE_WAIT_S} s'}: {seen}, call {state}")
    return entry


def check_started_by_approval(run: Run, order: Order, request_id: int) -> None:
    """One request, requested by the drill reviewer and approved by another person, executed once by a worker,
    which made the order's one compensation entry."""
    request = ActionRequest.objects.select_related("requested_by", "decided_by").get(pk=request_id)
    made = CompensationEntry.objects.filter(call_id=order.call_id).order_by("number")
    run.check(
        "started by an approved start_compensation",
        expected={
            "action": START_COMPENSATION,
            "request": ActionStatus.EXECUTED,
            "requested by": DRILL_REVIEWER,
            "approved by": DRILL_APPROVERS[0],
            "its events": STARTED,
            "entries, made by it": [{"number": 1, "by the request": True}],
        },
        observed={
            "action": request.action,
            "request": request.status,
            "requested by": request.requested_by.get_username() if request.requested_by else None,
            "approved by": request.decided_by.get_username() if request.decided_by else None,
            "its events": action_events([order.call_id])[order.call_id],
            "entries, made by it": [
                {"number": entry.number, "by the request": entry.requested_by_id == request.pk} for entry in made
            ],
        },
    )


def cancel_posts(run: Run, order: Order) -> list[dict]:
    """The cancel requests of the order in the sandbox's request log."""
    return run.sandbox.requests(path_prefix=order.cancel_route, method="POST")


def status_queries(run: Run, order: Order) -> list[dict]:
    """The status queries by the compensation's key in the sandbox's request log (order.cancel's status API)."""
    return run.sandbox.requests(path_prefix=f"/cancellations/by-key/{order.compensation_key}", method="GET")


def ledger_under(run: Run, key: str) -> list[dict]:
    """The sandbox ledger's business effects under one key."""
    return run.sandbox.ledger(key)["entries"]


def check_ledger(run: Run, order: Order, *, cancellations: int) -> None:
    """The sandbox's ledger under the order's key and under its compensation's own key (ledger_effects)."""
    under_order, under_undo = ledger_under(run, order.key), ledger_under(run, order.compensation_key)
    run.checks.append(
        ledger_effects(order, cancellations=cancellations, under_order=under_order, under_undo=under_undo)
    )


def ledger_effects(order: Order, *, cancellations: int, under_order: list[dict], under_undo: list[dict]) -> CheckRow:
    """One order under the order's key and `cancellations` cancellations of that order under its compensation's own
    key — the "1 order, N cancellation(s)" of docs/drills.md — from the sandbox ledger's entries under the two keys."""
    name = f"1 order, {cancellations} cancellation{'s' if cancellations != 1 else ''} in the sandbox ledger"
    return check(
        name,
        expected={
            "under the order's key": {"orders": 1},
            "under its compensation's key": {"cancellations": cancellations} if cancellations else {},
            "routes of the cancellations": [order.cancel_route] * cancellations,
        },
        observed={
            "under the order's key": dict(Counter(effect["kind"] for effect in under_order)),
            "under its compensation's key": dict(Counter(effect["kind"] for effect in under_undo)),
            "routes of the cancellations": [e["route"] for e in under_undo if e["kind"] == "cancellations"],
        },
    )

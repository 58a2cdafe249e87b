"""Saga aborted (docs/drills.md, docs/compensation.md): order → payment → shipment made for real, the shipment refused
for good, the runtime aborts the saga and the worker undoes the payment, then the order, each under its entry's own
key. The variant (`saga-aborted-unknown-step`): the payment's reply is lost, so it is UNKNOWN at the abort and nothing
is undone until a receipt settles it COMMITTED.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from recovery_client.runtime import CallResult

from recovery.devtools.agent import Agent
from recovery.devtools.drills.checks import check, in_order
from recovery.devtools.drills.evidence import at
from recovery.devtools.drills.framework import Run, wait
from recovery.devtools.drills.results import CheckRow
from recovery.devtools.drills.table import ARROW
from recovery.engine.states import CallState as S
from recovery.models import Receipt, Task
from recovery.selectors.compensations import effect_story, task_compensations
from recovery.services.compensation_plans import derive_key

ITEMS = [{"sku": "SKU-1", "quantity": 1}]
AMOUNT_CENTS = 2400
ADDRESS = {"line1": "1 Rue de la Paix", "city": "Paris", "postcode": "75002", "country": "FR"}
REFUSED = {"status": 422, "code": "address_rejected"}  # the carrier will not deliver there: no retry helps
SAGA_WAIT_S = 60  # how long the drill waits for the saga to end
SAGA_ENDS = ("done", "stopped")


@dataclass(frozen=True, kw_only=True)
class Saga:
    """The three steps the agent ran in one task: their results (the shipment's may never have been sent)."""

    task_id: int
    order: CallResult
    payment: CallResult
    shipment: CallResult
    order_id: str

    @property
    def cancel_route(self) -> str:
        return f"/orders/{self.order_id}/cancel"

    def undo_key(self, step: CallResult) -> str:
        """The key of the step's first compensation entry (derived from its own key, never regenerated)."""
        return derive_key(step.key, 1)


def play(run: Run) -> None:
    agent = run.agent()
    saga = _three_steps(run, agent, "saga")
    aborted = _abort(run, saga, reason="the shipment was refused for good: undo the payment and the order")
    _wait_saga(run, saga)

    shipment = run.sandbox.requests(key=saga.shipment.key, method="POST")
    run.check(
        "the shipment refused for good, the saga aborted in console mode",
        expected={
            "shipment requests": [{"status": REFUSED["status"], "outcome": "error_injected"}],
            "the abort": {"saga": "running", "executor": "console"},
        },
        observed={
            "shipment requests": [{"status": r["status"], "outcome": r["outcome"]} for r in shipment],
            "the abort": {"saga": aborted.get("saga"), "executor": aborted.get("executor")},
        },
    )
    _check_outcome(run, saga)


def play_unknown_step(run: Run) -> None:
    agent = run.agent()
    saga = _three_steps(run, agent, "saga-unknown", payment_lost=True)
    aborted = _abort(run, saga, reason="the payment is in doubt and the shipment cannot go: undo what stands")
    _wait_saga(run, saga)

    requested_at = Task.objects.values_list("saga_requested_at", flat=True).get(pk=saga.task_id)
    receipt = Receipt.objects.filter(call_id=saga.payment.call_id, applied=True).order_by("id").first()
    refund = _posts(run, saga.undo_key(saga.payment))
    run.check(
        "the payment UNKNOWN at the abort, nothing undone before it settled",
        expected={"its lost reply": S.UNKNOWN, "the abort waited for": [saga.payment.call_id]},
        observed={
            "its lost reply": saga.payment.sent[0].call_state if saga.payment.sent else None,
            "the abort waited for": aborted.get("waiting_for"),
        },
    )
    run.check(
        "the payment settled by a receipt before its undo",
        expected={
            "applied receipts": [{"observed": "committed", "moved": ARROW.join((S.UNKNOWN, S.COMMITTED))}],
            "times": in_order("the abort", "the payment's receipt", "its refund request"),
        },
        observed={
            "applied receipts": [
                {"observed": r.observed, "moved": ARROW.join((r.local_state_before, r.local_state_after))}
                for r in Receipt.objects.filter(call_id=saga.payment.call_id, applied=True).order_by("id")
            ],
            "times": {
                "the abort": requested_at,
                "the payment's receipt": receipt.checked_at if receipt else None,
                "its refund request": at(refund[0]) if refund else None,
            },
        },
    )
    _check_outcome(run, saga)


def _three_steps(run: Run, agent: Agent, label: str, *, payment_lost: bool = False) -> Saga:
    """The order (1), its payment (2, after 1) and its shipment (3, after 2), each recorded as a key row of its step.
    The shipment is refused for good; with `payment_lost` the payment's reply is dropped after it commits, and the
    agent does not wait for its reconciliation (the shipment is then refused at admission: its dependency is in
    doubt)."""
    tool = run.stage.tool
    task_id = agent.start_task(run.key(f"drill-{label}"), goal="order, pay and ship; undo what stands if it fails").id
    basket = {"customer_id": f"C-{int(run.tag, 16)}", "items": ITEMS}
    order = run.call(
        agent.run_call(task_id, step=1, tool=tool("order.create"), key=run.key(f"order-{label}"), arguments=basket),
        step="order",
    )
    order_id = order.result.get("order_id") if isinstance(order.result, dict) else None
    if order.state != S.COMMITTED or not isinstance(order_id, str):
        raise RuntimeError(f"the order did not commit ({order.state}: {order.detail}): no saga to abort")
    payment_key, shipment_key = run.key(f"payment-{label}"), run.key(f"shipment-{label}")
    if payment_lost:
        run.sandbox.fault(route="/payments", key=payment_key, kind="commit_then_drop", times=1)
    run.sandbox.fault(route="/shipments", key=shipment_key, kind="error", **REFUSED)
    amount = {"order_id": order_id, "amount_cents": AMOUNT_CENTS}
    payment = run.call(
        agent.run_call(
            task_id, step=2, depends_on=[1], tool=tool("payment.capture"), key=payment_key, arguments=amount,
            patience_s=0 if payment_lost else None,
        ),
        step="payment",
    )  # fmt: skip
    parcel = {"order_id": order_id, "address": ADDRESS, "service": "standard"}
    shipment = run.call(
        agent.run_call(
            task_id, step=3, depends_on=[2], tool=tool("shipment.create"), key=shipment_key, arguments=parcel,
            patience_s=0,
        ),
        step="shipment",
    )  # fmt: skip
    run.log(f"  order {order_id} {order.state}, payment {payment.state}, shipment {shipment.outcome or shipment.state}")
    return Saga(task_id=task_id, order=order, payment=payment, shipment=shipment, order_id=order_id)


def _abort(run: Run, saga: Saga, *, reason: str) -> dict:
    answer = run.stage.client().compensate_task(saga.task_id, executor="console", reason=reason)
    run.log(f"  saga aborted: {answer.get('saga')} ({answer.get('executor')}), waiting for {answer.get('waiting_for')}")
    return dict(answer)


def _wait_saga(run: Run, saga: Saga) -> dict:
    """Poll GET /tasks/{id}/compensation until the saga is done or stopped (or SAGA_WAIT_S passed)."""
    client, seen = run.stage.client(), {}

    def ended() -> bool:
        seen.update(client.task_compensation(saga.task_id))
        return seen.get("saga") in SAGA_ENDS

    settled = wait(ended, SAGA_WAIT_S, every_s=0.2)
    run.log(f"  saga {seen.get('saga')}{'' if settled else f' after {SAGA_WAIT_S} s'}: outcome {seen.get('outcome')}")
    return seen


def _posts(run: Run, key: str) -> list[dict]:
    return run.sandbox.requests(key=key, method="POST")


def _check_outcome(run: Run, saga: Saga) -> None:
    """The checks both drills make once the saga ended: the undo order, the ledger, the task's record."""
    undos = _posts(run, saga.undo_key(saga.payment)) + _posts(run, saga.undo_key(saga.order))
    run.checks.append(undo_order(saga, undos))
    ledger = {key: run.sandbox.ledger(key)["entries"] for key in _keys(saga)}
    run.checks.append(saga_ledger(saga, ledger))
    client = run.stage.client()
    state, task = client.task_compensation(saga.task_id), client.get_task(saga.task_id)
    entries = task_compensations(saga.task_id).get(saga.order.call_id, [])
    story = effect_story(
        call_state=client.get_call(saga.order.call_id)["state"],
        forward_tool=run.stage.tool("order.create"),
        target=saga.order_id,
        entries=entries,
    )
    run.check(
        "the task compensated: created, then cancelled",
        expected={
            "saga": "done",
            "outcome": "compensated",
            "compensated": {"order": S.COMPENSATED, "payment": S.COMPENSATED},
            "the order's record": "created, then cancelled",
        },
        observed={
            "saga": state.get("saga"),
            "outcome": task.outcome,
            "compensated": {
                role: brief["state"]
                for role, step in (("order", saga.order), ("payment", saga.payment))
                for brief in task.compensated
                if brief["call_id"] == step.call_id
            },
            "the order's record": story.headline if story else None,
        },
    )


def _keys(saga: Saga) -> list[str]:
    return [
        saga.order.key,
        saga.undo_key(saga.order),
        saga.payment.key,
        saga.undo_key(saga.payment),
        saga.shipment.key,
    ]


def undo_order(saga: Saga, posts: list[dict]) -> CheckRow:
    """From the sandbox's request log under the two entries' keys: one refund of the payment (step 2), then one
    cancel of the order (step 1), both answered — the refund's request time before the cancel's."""
    posts = sorted(posts, key=at)
    payment_key, order_key = saga.undo_key(saga.payment), saga.undo_key(saga.order)
    first = {p["key"]: at(p) for p in reversed(posts)}  # each key's first request
    times: dict[str, datetime | None] = {
        "the refund (step 2)": first.get(payment_key),
        "the cancel (step 1)": first.get(order_key),
    }
    return check(
        "steps 2 then 1 compensated in that order",
        expected={
            "undo requests": [
                {"path": "/refunds", "key": payment_key, "status": 200},
                {"path": saga.cancel_route, "key": order_key, "status": 200},
            ],
            "times": in_order(*times),
        },
        observed={
            "undo requests": [{"path": p["path"], "key": p["key"], "status": p["status"]} for p in posts],
            "times": times,
        },
    )


def saga_ledger(saga: Saga, ledger: dict[str, list[dict]]) -> CheckRow:
    """From the sandbox's ledger, by key: one order and one cancellation of it, one payment and one refund, no
    shipment — "1 each, 1 cancellation each" of docs/drills.md."""

    def kinds(key: str) -> dict[str, int]:
        return dict(Counter(effect["kind"] for effect in ledger.get(key, [])))

    return check(
        "one effect and one undo each in the sandbox ledger",
        expected={
            "order": {"under its key": {"orders": 1}, "under its undo's key": {"cancellations": 1}},
            "payment": {"under its key": {"payments": 1}, "under its undo's key": {"refunds": 1}},
            "shipment": {"under its key": {}},
            "routes of the cancellations": [saga.cancel_route],
        },
        observed={
            "order": {
                "under its key": kinds(saga.order.key),
                "under its undo's key": kinds(saga.undo_key(saga.order)),
            },
            "payment": {
                "under its key": kinds(saga.payment.key),
                "under its undo's key": kinds(saga.undo_key(saga.payment)),
            },
            "shipment": {"under its key": kinds(saga.shipment.key)},
            "routes of the cancellations": [
                e["route"] for e in ledger.get(saga.undo_key(saga.order), []) if e["kind"] == "cancellations"
            ],
        },
    )

from __future__ import annotations

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.play import Play, scenario

REFUSAL = {"status": 409, "code": "not_cancellable"}


@scenario(
    name="saga-cancel-refused",
    title="order → payment refused for good → saga aborted, the cancel refused",
    pinned_end="COMPENSATION_FAILED (409 not_cancellable, not retried), saga stopped, 1 order and 0 cancellations:"
    " left in the Compensation problems queue",
)
def saga_cancel_refused(play: Play) -> None:
    """The same abort, but the provider refuses to cancel the order (409 `not_cancellable`: it has shipped), a code
    in order.cancel's `refusal_codes`: nothing was executed, the entry failed and is not retried, the order's call
    is COMPENSATION_FAILED and the saga stops there for a person. Left for the demo reviewer in the Compensation
    problems queue (README, "The demo")."""
    task_id, order, payment, order_id = shared.order_payment_refused(play, "its payment will be declined")
    play.result.routes["cancel"] = route = f"/orders/{order_id}/cancel"
    play.fault(route=route, kind="error", **REFUSAL)  # every time: the order stays shipped
    aborted, saga = shared.abort_saga(play, task_id, "the payment was declined for good: cancel the order")

    call = play.call(order.call_id)
    entry = shared.first_entry(call)
    task = play.client.get_task(task_id)
    cancels = play.sandbox.requests(path_prefix=route, method="POST")
    shared.check_refused_payment(play, order, payment, aborted)
    play.check(
        "saga", {"saga": "stopped", "stopped_at": order.call_id}, {k: saga.get(k) for k in ("saga", "stopped_at")}
    )
    play.check("order state", "COMPENSATION_FAILED", call["state"])
    play.check("its compensation entry", ("failed", "refused"), (entry.get("state"), entry.get("outcome")))
    play.check("cancel requests answered", [REFUSAL["status"]], [r["status"] for r in cancels])
    effects = [play.effects(order.key), play.effects(entry.get("idempotency_key", "-"))]
    play.check("effects (order, cancellation)", [1, 0], effects)
    play.check("task outcome (the order still stands)", "abandoned", task.outcome)
    play.result.end = (
        f"order {order_id} {call['state']}: cancel refused {REFUSAL['status']} {REFUSAL['code']}, saga"
        f" {saga.get('saga')}; in the Compensation problems queue for a reviewer (task {task.outcome})"
    )

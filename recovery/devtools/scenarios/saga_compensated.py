from __future__ import annotations

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.play import Play, scenario


@scenario(
    name="saga-compensated",
    title="order → payment refused for good → saga aborted",
    pinned_end="the order cancelled under its entry's own key (COMPENSATED), 1 order and 1 cancellation; task"
    " compensated",
)
def saga_compensated(play: Play) -> None:
    """The order is created, the provider refuses its payment for good (402 `card_declined`: nothing was charged),
    and the runtime aborts the saga in console mode: the console's worker cancels the order, the one step that
    stands, with the entry's own key. The task is compensated: "created, then cancelled", never "never created"."""
    task_id, order, payment, order_id = shared.order_payment_refused(play, "its payment will be declined")
    aborted, saga = shared.abort_saga(play, task_id, "the payment was declined for good: cancel the order")
    play.result.routes["cancel"] = route = f"/orders/{order_id}/cancel"

    call = play.call(order.call_id)
    entry = shared.first_entry(call)
    task = play.client.get_task(task_id)
    cancels = play.sandbox.requests(path_prefix=route, method="POST")
    shared.check_refused_payment(play, order, payment, aborted)
    play.check("saga", {"saga": "done", "outcome": "compensated"}, {k: saga.get(k) for k in ("saga", "outcome")})
    play.check("order state", "COMPENSATED", call["state"])
    play.check(
        "its compensation entry", (play.tool("order.cancel"), "committed"), (entry.get("tool", ""), entry.get("state"))
    )
    play.check(
        "cancel requests (key, status)",
        [(entry.get("idempotency_key"), 200)],
        [(r["key"], r["status"]) for r in cancels],
    )
    effects = [play.effects(order.key), play.effects(payment.key), play.effects(entry.get("idempotency_key", "-"))]
    play.check("effects (order, payment, cancellation)", [1, 0, 1], effects)
    play.check("task outcome", "compensated", task.outcome)
    play.check("the task lists it compensated", [order.call_id], [c["call_id"] for c in task.compensated])
    play.result.end = f"order {order_id} created, then cancelled ({call['state']}); task {task.outcome}"

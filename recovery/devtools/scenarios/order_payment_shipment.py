from __future__ import annotations

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.play import Play, scenario

ADDRESS = {"line1": "1 Rue de la Paix", "city": "Paris", "postcode": "75002", "country": "FR"}


@scenario(
    name="order-payment-shipment",
    title="order → payment → shipment, payment reply lost",
    pinned_end="shipment refused at admission until the payment is COMMITTED by a receipt; task completed",
)
def order_payment_shipment(play: Play) -> None:
    """Order, payment and shipment in one task, each step depending on the one before, the payment's reply lost:
    the console refuses the shipment at admission until the payment is committed by a receipt; the agent itself
    does not wait for it."""
    order_key, payment_key, shipment_key = play.key("order"), play.key("payment"), play.key("shipment")
    customer = f"C-{play.digits(1)}"
    play.fault(route="/payments", key=payment_key, kind="commit_then_drop", times=1)
    play.fault(route="/payments", key=payment_key, kind="delayed_callbacks", ms=shared.HOLD_CALLBACK_MS, times=1)
    task_id = play.start(f"order, pay and ship for customer {customer}")
    create, capture, ship = play.tool("order.create"), play.tool("payment.capture"), play.tool("shipment.create")
    basket = {"customer_id": customer, "items": [{"sku": "demo-mug", "quantity": 2}]}
    order = play.run_call("order", task_id, step=1, tool=create, key=order_key, arguments=basket)
    created = order.result or {}
    order_id = created.get("order_id", "O-0")
    # The agent does not wait for the payment's reconciliation: it goes on to the shipment, and the console holds it.
    amount = {"order_id": order_id, "amount_cents": created.get("total_cents", 1)}
    payment = play.run_call(
        "payment", task_id, step=2, depends_on=[1], tool=capture, key=payment_key, arguments=amount, patience_s=0
    )
    parcel = {"order_id": order_id, "address": ADDRESS, "service": "standard"}
    shipment = play.run_call("shipment", task_id, step=3, depends_on=[2], tool=ship, key=shipment_key, arguments=parcel)
    outcome = play.submit(task_id, f"order {created.get('order_id')} paid and shipped")

    play.check("order", "COMMITTED", order.state)
    payment_call, shipment_call = shared.check_held_until_settled(
        play, "payment", payment, "shipment", shipment, "blocked_by_dependency"
    )
    effects = [play.effects(key) for key in (order_key, payment_key, shipment_key)]
    play.check("effects (order, payment, shipment)", [1, 1, 1], effects)
    play.check("payment write requests", 1, len(play.writes(payment_key)))
    play.check("task outcome", "completed", outcome)
    play.result.end = (
        f"shipment held until the payment was {payment_call['state']} by {shared.settled_by(payment_call)}; "
        f"shipment {shipment_call['state']}, task {outcome}"
    )

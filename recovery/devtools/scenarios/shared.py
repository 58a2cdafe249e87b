"""What several scenarios share: a refund task, a lookup task, reading a call's receipts and admissions, the checks
made of them.

A call is what the console's API answers for GET /calls/{id}: its receipts and attempts are read here, never the
product's models.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime
from typing import Any

from recovery_client.runtime import CallResult

from recovery.devtools.scenarios.checks import after, one_of
from recovery.devtools.scenarios.play import Play

# A provider's callback can settle a call before the runtime has even reported the lost reply (the signed word of
# the provider may come first, docs/reconciliation.md). The scenarios that lose a reply hold their key's callback back
# for this long, so what the agent meets is an UNKNOWN settled by the status query, the same on every run.
HOLD_CALLBACK_MS = 30_000
# Receipts that are the provider's own word about a call (not the runtime's 2xx, not a person's).
PROVIDER_RECEIPTS = ("poll", "callback")

REFUND_CENTS = 1250


def refund_task(play: Play, key: str, order_id: str, cents: int, **options: Any) -> tuple[int, CallResult]:
    """A task of one refund, run to its end by the agent: (the task's id, the refund's result)."""
    task_id = play.start(f"refund {cents} cents on order {order_id}")
    arguments = {"order_id": order_id, "amount_cents": cents}
    refund = play.run_call(
        "refund", task_id, step=1, tool=play.tool("refund.create"), key=key, arguments=arguments, **options
    )
    return task_id, refund


def lookup_task(play: Play, **fault: Any) -> tuple[str, CallResult, str]:
    """A task of one order lookup, its order's route faulted as `fault` says, run and submitted by the agent: (the
    route, the lookup's result, the task's outcome)."""
    key = play.key("lookup")
    order_id, route = play.order_route("lookup", 1)
    play.fault(route=route, **fault)
    task_id = play.start(f"look up order {order_id}")
    lookup = play.run_call(
        "lookup", task_id, step=1, tool=play.tool("order.lookup"), key=key, arguments={"order_id": order_id}
    )
    outcome = play.submit(task_id, f"order {order_id} is {(lookup.result or {}).get('status', '?')}")
    return route, lookup, outcome


def provider_receipts(call: dict) -> list[dict]:
    """The receipts that moved the call on the provider's own word (a status query or a signed callback)."""
    return [r for r in call.get("receipts", []) if r["source"] in PROVIDER_RECEIPTS and r["applied"]]


def settling_receipt(call: dict) -> dict | None:
    """The provider receipt that moved the call on "committed"."""
    return next((receipt for receipt in provider_receipts(call) if receipt["observed"] == "committed"), None)


def settled_by(call: dict) -> str:
    receipt = settling_receipt(call)
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
    receipt = settling_receipt(call)
    return datetime.fromisoformat(receipt["checked_at"]) if receipt else None


def gaps(requests: list[dict]) -> list[float]:
    times = [datetime.fromisoformat(r["at"]) for r in requests]
    return [round((b - a).total_seconds(), 3) for a, b in itertools.pairwise(times)]


def check_settled_by_receipt(play: Play, name: str, call: dict) -> None:
    receipt = settling_receipt(call)
    play.check(name, one_of(*PROVIDER_RECEIPTS), receipt["source"] if receipt else None)


def check_held_until_settled(
    play: Play, first: str, blocker: CallResult, then: str, held: CallResult, reason: str
) -> tuple[dict, dict]:
    """A write (`then`) refused at admission for `reason` while the one before it (`first`), its reply lost, was
    unknown, and admitted only once a provider receipt had settled that one, both COMMITTED: (their calls)."""
    blocker_call, held_call = play.call(blocker.call_id), play.call(held.call_id)
    play.check(f"the {first}'s lost reply", "UNKNOWN", blocker.sent[0].call_state if blocker.sent else "")
    play.check(f"the {then} at admission", reason, _first_denial(held)[0])
    check_settled_by_receipt(play, f"{first} settled by", blocker_call)
    play.check(f"{first} state", "COMMITTED", blocker_call["state"])
    settled = after(_settled_at(blocker_call), f"the {first}'s receipt")
    play.check(f"{then} first admitted", settled, _first_admitted_at(held_call))
    play.check(f"{then} state", "COMMITTED", held_call["state"])
    return blocker_call, held_call


# Sagas (docs/compensation.md): an order whose payment the provider refuses for good, and the abort that undoes what
# stands.

SAGA_WAIT_S = 60  # how long a scenario waits for the console's worker to end an aborted saga
SAGA_ENDS = ("done", "stopped")
DECLINED = {"status": 402, "code": "card_declined"}  # the provider's final word: no retry pays it


def order_payment_refused(play: Play, label: str) -> tuple[int, CallResult, CallResult, str]:
    """A task whose order the agent creates for real and whose payment the provider refuses for good: (the task's
    id, the order's result, the payment's, the order's id)."""
    order_key, payment_key = play.key("order"), play.key("payment")
    customer = f"C-{play.digits(1)}"
    play.fault(route="/payments", key=payment_key, kind="error", **DECLINED)
    task_id = play.start(f"order and pay for customer {customer} ({label})")
    basket = {"customer_id": customer, "items": [{"sku": "demo-mug", "quantity": 1}]}
    order = play.run_call("order", task_id, step=1, tool=play.tool("order.create"), key=order_key, arguments=basket)
    order_id = (order.result or {}).get("order_id", "O-0")
    amount = {"order_id": order_id, "amount_cents": (order.result or {}).get("total_cents", 1)}
    payment = play.run_call(
        "payment", task_id, step=2, depends_on=[1], tool=play.tool("payment.capture"), key=payment_key, arguments=amount
    )
    return task_id, order, payment, order_id


def abort_saga(play: Play, task_id: int, reason: str) -> tuple[dict, dict]:
    """Abort the task as a saga in console mode (the console's worker sends each undo), then poll
    GET /tasks/{id}/compensation until it is done or stopped (or SAGA_WAIT_S passed): (the abort's answer, the
    saga's last)."""
    aborted = dict(play.client.compensate_task(task_id, executor="console", reason=reason))
    play.log(f"  saga aborted ({aborted.get('executor')}): {aborted.get('saga')}")
    deadline = time.monotonic() + SAGA_WAIT_S
    saga = dict(play.client.task_compensation(task_id))
    while saga.get("saga") not in SAGA_ENDS and time.monotonic() < deadline:
        time.sleep(0.25)
        saga = dict(play.client.task_compensation(task_id))
    play.log(f"  saga {saga.get('saga')}: outcome {saga.get('outcome')}, stopped at {saga.get('stopped_at')}")
    return aborted, saga


def first_entry(call: dict) -> dict:
    """The call's first compensation entry, as GET /calls/{id} answers it ({} when none was made)."""
    return next((entry for entry in call.get("compensations", []) if entry["number"] == 1), {})


def check_refused_payment(play: Play, order: CallResult, payment: CallResult, aborted: dict) -> None:
    play.check("order", "COMMITTED", order.state)
    play.check("payment refused for good", "FAILED_PERMANENT", payment.state)
    play.check("payment requests answered", [DECLINED["status"]], [r["status"] for r in play.writes(payment.key)])
    play.check(
        "the abort", {"saga": "running", "executor": "console"}, {k: aborted.get(k) for k in ("saga", "executor")}
    )

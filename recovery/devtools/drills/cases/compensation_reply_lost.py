"""Compensation reply lost: an order the agent created for real is undone by an approved start_compensation; the
sandbox commits the cancel and drops its reply, so the entry is unknown and the order's call COMPENSATING until
reconciliation finds the cancellation by the entry's own key: a receipt on the entry, the call COMPENSATED, and
never a second cancel request."""

from __future__ import annotations

from recovery.devtools.drills.cases.compensation import (
    Order,
    cancel_posts,
    check_ledger,
    check_started_by_approval,
    committed_order,
    start_compensation,
    status_queries,
    wait_compensation_end,
)
from recovery.devtools.drills.checks import check
from recovery.devtools.drills.framework import Run
from recovery.devtools.drills.results import CheckRow
from recovery.devtools.drills.table import ARROW
from recovery.models import CompensationReceipt


def play(run: Run) -> None:
    agent, order = committed_order(run, "undo-lost", goal="create an order, then undo it; the undo's reply is lost")
    run.sandbox.fault(route=order.cancel_route, kind="commit_then_drop", times=1)
    request_id = start_compensation(run, order, reason="the customer withdrew the order: cancel it")
    entry = wait_compensation_end(run, order, request_id)
    agent.submit(order.task_id, "order created, then cancelled")

    check_started_by_approval(run, order, request_id)
    run.checks.append(no_second_cancel(order, cancel_posts(run, order)))
    refs = [effect["provider_ref"] for effect in run.sandbox.ledger(order.compensation_key)["entries"]]
    receipts = CompensationReceipt.objects.filter(entry=entry, applied=True).order_by("id") if entry else []
    run.check(
        "settled by a receipt on the entry",
        expected={
            "applied receipts": [
                {"observed": "committed", "moved": ARROW.join(run.drill.compensation.path[-2:]), "provider ref": refs}
            ],
            "status queries by its key": [200],
        },
        observed={
            "applied receipts": [
                {
                    "observed": r.observed,
                    "moved": ARROW.join((r.state_before, r.state_after)),
                    "provider ref": [r.provider_ref] if r.provider_ref else [],
                }
                for r in receipts
            ],
            "status queries by its key": [query["status"] for query in status_queries(run, order)],
        },
    )
    check_ledger(run, order, cancellations=run.drill.compensation.effects)


def no_second_cancel(order: Order, posts: list[dict]) -> CheckRow:
    """From the sandbox's request log of the order's cancel route: one cancel request, with the compensation's own
    key, which the sandbox committed and whose reply it dropped."""
    return check(
        "no second cancel request",
        expected={"cancel requests": [{"key": order.compensation_key, "outcome": "dropped_after_commit"}]},
        observed={"cancel requests": [{"key": post["key"], "outcome": post["outcome"]} for post in posts]},
    )

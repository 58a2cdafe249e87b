"""Compensation refused: an order the agent created for real is to be undone by an approved start_compensation,
and the provider answers the cancel 409 `not_cancellable` (already shipped). A refusal code of the tool is read
before anything else: nothing was executed, the entry failed, the order's call ends COMPENSATION_FAILED, and the
cancel is never sent again — not by the worker, not by the reconcile schedule."""

from __future__ import annotations

import time

from django.conf import settings
from django.utils import timezone

from recovery.devtools.drills.cases.compensation import (
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
from recovery.engine.compensation_states import EntryState as E
from recovery.models import Call, CompensationEntry, CompensationReceipt
from recovery.selectors.queues import COMPENSATION_STATES, QueueFilters, queue_page
from recovery.services.compensations import RETRY_S, compensations_due

REFUSAL = {"status": 409, "code": "not_cancellable"}


def quiet_s() -> float:
    """How long the drill watches after the refusal: two runs of the reconcile schedule (which also sends and checks
    the due compensation entries), after the longest a not-committed entry waits before it is sent again."""
    return 2 * settings.RECOVERY_RECONCILE_EVERY_S + RETRY_S + 1


def play(run: Run) -> None:
    agent, order = committed_order(run, "undo-refused", goal="create an order, then undo it; it has shipped")
    run.sandbox.fault(route=order.cancel_route, kind="error", **REFUSAL)  # every time: the order stays shipped
    request_id = start_compensation(run, order, reason="the customer withdrew the order: cancel it")
    entry = wait_compensation_end(run, order, request_id)
    agent.submit(order.task_id, "order created; its cancellation was refused")

    check_started_by_approval(run, order, request_id)
    attempt = entry.attempts.order_by("number").first() if entry else None
    run.check(
        "the provider refused the cancel: nothing executed",
        expected={
            "cancel requests": [
                {"key": order.compensation_key, "status": REFUSAL["status"], "outcome": "error_injected"}
            ],
            "read as": {"row": "refusal", "code": REFUSAL["code"], "entry": E.FAILED, "outcome": "refused"},
        },
        observed={
            "cancel requests": [
                {"key": p["key"], "status": p["status"], "outcome": p["outcome"]} for p in cancel_posts(run, order)
            ],
            "read as": {
                "row": attempt.row if attempt else None,
                "code": attempt.error_code if attempt else None,
                "entry": entry.state if entry else None,
                "outcome": entry.outcome if entry else None,
            },
        },
    )

    watched = quiet_s()
    run.log(f"  watching {watched:g} s: the reconcile schedule runs every {settings.RECOVERY_RECONCILE_EVERY_S} s")
    time.sleep(watched)
    entry = CompensationEntry.objects.filter(pk=entry.pk).first() if entry else None
    sends, checks = compensations_due()
    seen = None
    if entry is not None:
        receipts = CompensationReceipt.objects.filter(entry=entry).count()
        seen = {"state": entry.state, "attempts": entry.attempts_count, "receipts": receipts}
    due = entry.pk in {*sends, *checks} if entry else None
    run.checks.append(not_retried(cancel_posts(run, order), status_queries(run, order), entry=seen, due=due))
    check_ledger(run, order, cancellations=run.drill.compensation.effects)
    listed = [row["id"] for row in _problems(order)]
    run.check(
        "the item in the Compensation problems queue",
        expected={"listed": [order.call_id], "state": "COMPENSATION_FAILED"},
        observed={"listed": listed, "state": Call.objects.values_list("state", flat=True).get(pk=order.call_id)},
    )


def _problems(order) -> list[dict]:
    """The Compensation problems queue's rows for the order's task, as a reviewer's page reads them."""
    filters = QueueFilters(states=COMPENSATION_STATES, compensation=True, q=str(order.task_id))
    return queue_page(filters, now=timezone.now()).rows


def not_retried(posts: list[dict], queries: list[dict], *, entry: dict | None, due: bool | None) -> CheckRow:
    """After the schedule ran: still the one cancel request and no status query in the sandbox's request log, the
    entry failed after one attempt with no receipt, and nothing of it due to be sent or checked."""
    return check(
        "the cancel not retried",
        expected={
            "cancel requests": 1,
            "status queries by its key": 0,
            "entry": {"state": E.FAILED, "attempts": 1, "receipts": 0},
            "due to be sent or checked": False,
        },
        observed={
            "cancel requests": len(posts),
            "status queries by its key": len(queries),
            "entry": entry,
            "due to be sent or checked": due,
        },
    )

"""Status API down: the refund commits, its reply is dropped, and the status endpoint answers 503. Every check
fails and counts, and the poll budget sends the call to a person."""

from __future__ import annotations

from recovery.drills.cases.shared import check_one_request, unconfirmed_refund
from recovery.drills.checks import each, one_of
from recovery.drills.framework import Run
from recovery.models import Call, Receipt


def play(run: Run) -> None:
    _, _, result = unconfirmed_refund(run, "status-down", goal="refund an order the provider cannot confirm")
    key = result.key

    check_one_request(run, key)
    call = Call.objects.select_related("tool").get(pk=result.call_id)
    budget = (call.tool.reconcile or {}).get("max_checks") or 0
    receipts = Receipt.objects.filter(call=call, source="poll").order_by("id").values_list("observed", flat=True)
    queries = run.sandbox.requests(key=key, path_prefix="/refunds/by-key/")
    run.check(
        "every check failed and counted toward the poll budget",
        expected={
            "checks made": budget,
            "poll receipts": each(one_of("failed", "unreachable"), of=budget, unit="receipts"),
            "status queries answered": [503],
            "outcome": "poll_budget_exhausted",
        },
        observed={
            "checks made": call.checks_made,
            "poll receipts": list(receipts),
            "status queries answered": sorted({entry["status"] for entry in queries}),
            "outcome": call.outcome,
        },
    )

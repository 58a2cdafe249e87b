"""Timeout after send: the refund commits and its reply is dropped; the call is UNKNOWN, settled by a status query,
and never sent again."""

from __future__ import annotations

from recovery.devtools.drills.cases.shared import check_one_request, check_settled_by_one_receipt
from recovery.devtools.drills.framework import Run
from recovery.models import Receipt


def play(run: Run) -> None:
    key, arguments = run.refund_args("reply-lost", 1)
    run.sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    agent = run.agent()
    task_id, result = run.refund(
        agent, key, arguments, task="drill-reply-lost", goal="refund an order whose reply is lost"
    )
    agent.submit(task_id, f"refund {result.state}")

    check_settled_by_one_receipt(run, list(Receipt.objects.filter(call_id=result.call_id, applied=True).order_by("id")))
    check_one_request(run, key)

"""Deferred report lost: the refund commits, the runtime answers its caller at once (a 2xx that passed the checks its
admission handed over) and dies before its deferred report leaves. The call is swept to UNKNOWN when its outcome
timeout passes, settled by a status query, and never sent again (docs/api.md#reporting-off-the-clock)."""

from __future__ import annotations

from typing import Any

from recovery_client.deferred import DeferredReports

from recovery.devtools.drills.cases.shared import check_settled_by_one_receipt
from recovery.devtools.drills.framework import Run, wait
from recovery.devtools.drills.stage import DRILL_OUTCOME_TIMEOUT_S
from recovery.models import Attempt, Call, Receipt

SETTLE_WAIT_S = DRILL_OUTCOME_TIMEOUT_S + 50  # the sweep after the outcome timeout, then the status query


class _Lost(DeferredReports):
    """A runtime that answered its caller and died before the report left: the report is never sent."""

    def defer(self, task_id: int, call_id: int, attempt_id: str, facts: dict[str, Any]) -> None:
        self.log(f"  call {call_id}: the runtime stops before its deferred report of {attempt_id} leaves")


def play(run: Run) -> None:
    key, arguments = run.refund_args("deferred", 1)
    agent = run.agent(defer_reports=True)
    agent.reports = _Lost(agent.client, run.log)
    tool = run.stage.tool("refund.create")
    task_id = agent.start_task(run.key("drill-deferred"), goal="refund an order; the runtime dies after answering").id
    ref = agent.client.add_call(task_id, step=1, tool=tool, arguments=arguments, idempotency_key=key, admit=f"{key}-a1")
    result = agent.drive_call(
        task_id,
        ref.call_id,
        state=ref.state,
        tool=tool,
        key=key,
        first=ref,
        send=lambda number: agent._send(tool, key, arguments),
    )
    state_when_answered = Call.objects.get(pk=ref.call_id).state
    run.call(result)
    settled = wait(lambda: Call.objects.get(pk=ref.call_id).state == "COMMITTED", SETTLE_WAIT_S, every_s=0.5)
    attempt = Attempt.objects.get(call_id=ref.call_id, number=1)
    run.check(
        "the caller was answered before any report",
        expected={"answer": "committed", "call when answered": "SENT", "report received": False},
        observed={
            "answer": result.outcome,
            "call when answered": state_when_answered,
            "report received": attempt.reported_at is not None,
        },
    )
    receipts = list(Receipt.objects.filter(call_id=ref.call_id, applied=True).order_by("id")) if settled else []
    check_settled_by_one_receipt(run, receipts)
    posts = run.sandbox.requests(key=key, method="POST")
    run.check(
        "no second request",
        expected={"refund requests under the key": ["answered"]},
        observed={"refund requests under the key": [post["outcome"] for post in posts]},
    )
    agent.submit(task_id, "refund settled by the console")

from __future__ import annotations

import time

from recovery_client import RecoveryError
from recovery_client.runtime import CallResult

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.checks import each, one_of, only
from recovery.devtools.scenarios.play import Play, exclusive_scenario

# The demo's refund for a person to replay: its late callback is held back this long (the sandbox's maximum), so
# that what settles it is the reviewer's same-key replay, not the provider's webhook.
HOLD_REVIEW_CALLBACK_MS = 600_000
CHECK_WAIT_S = 10  # how long the impatient agent waits for each immediate check it asked for


@exclusive_scenario(
    name="status-api-down",
    title="refund, reply lost, status API down",
    pinned_end="HUMAN_REVIEW at the poll budget, 1 effect: left for a reviewer to replay with the same key",
)
def status_api_down(play: Play) -> None:
    """The refund commits, its reply is lost, and the provider's status API answers 503 for its key: every check
    fails and counts, and at the poll budget the call goes to a person. The agent, impatient, asks for each check
    at once (POST .../reconcile) instead of waiting out the schedule (minutes on the shipped registry). What it
    leaves is the demo's refund for the reviewer and the approver: a same-key replay, deduplicated by the provider.
    It runs alone: its failing checks count against the provider's status-endpoint breaker, shared by everyone."""
    key = play.key("refund")
    order_id = f"O-{play.digits(1)}"
    tool = play.tool("refund.create")
    budget = next(t for t in play.stage.registry["tools"] if t["name"] == tool).get("reconcile", {}).get("max_checks")
    play.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    play.fault(route="/refunds", key=key, kind="delayed_callbacks", ms=HOLD_REVIEW_CALLBACK_MS, times=1)
    play.fault(route="/refunds/by-key", key=key, kind="status_down", status=503)
    task_id, refund = shared.refund_task(play, key, order_id, shared.REFUND_CENTS, patience_s=0)
    _ask_for_every_check(play, refund, budget)
    task = play.agent.submit(task_id, f"refund of order {order_id}: unconfirmed, waiting for a reviewer")

    call = play.call(refund.call_id)
    queries = [r["status"] for r in play.sandbox.requests(key=key) if r["method"] == "GET"]
    receipts = [r["observed"] for r in call["receipts"]]
    play.check("the lost reply", "UNKNOWN", refund.sent[0].call_state if refund.sent else "")
    play.check("checks made (the poll budget)", budget, call["checks_made"])
    # Failed (503), or skipped as unreachable once the status endpoint's breaker opened.
    play.check("every check failed", each(one_of("failed", "unreachable")), receipts)
    play.check("status queries the provider answered", only(503), queries)
    play.check("call state", "HUMAN_REVIEW", call["state"])
    play.check("outcome", "poll_budget_exhausted", call["outcome"])
    play.check("write requests for the key", 1, len(play.writes(key)))
    play.check("business effects for the key", 1, play.effects(key))
    play.check("task outcome", "completed_with_unknowns", task.outcome)
    play.check("the task lists it for review", [call["id"]], [c["call_id"] for c in task.raw.get("needs_review", [])])
    play.result.end = (
        f"{call['state']} after {call['checks_made']} failed checks, {play.effects(key)} effect at the provider:"
        f" replay it with the same key in the console (key {key})"
    )


def _ask_for_every_check(play: Play, refund: CallResult, budget: int | None) -> None:
    """Ask for one immediate check after another, each waited for, while the call is unknown (and a little past
    the budget, should the console allow more than it says)."""
    call = play.call(refund.call_id)
    asked = 0
    while call.get("state") in ("UNKNOWN", "STILL_UNKNOWN") and asked < (budget or 0) + 2:
        asked += 1
        made = call["checks_made"]
        try:
            play.client.reconcile(refund.call_id)
        except RecoveryError as exc:
            if exc.code != "not_reconcilable":
                raise
            call = play.call(refund.call_id)  # a scheduled check got there first and spent the budget
            continue
        deadline = time.monotonic() + CHECK_WAIT_S
        while call["checks_made"] == made and time.monotonic() < deadline:
            time.sleep(0.1)
            call = play.call(refund.call_id)
    play.log(f"  the agent asked for {asked} immediate check(s); the call is {call.get('state')}")

from __future__ import annotations

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.checks import contains
from recovery.devtools.scenarios.play import Play, scenario


@scenario(
    name="lost-before-commit",
    title="refund, lost before commit",
    pinned_end="NOT_COMMITTED → same-key retry → COMMITTED, 1 effect",
)
def lost_before_commit(play: Play) -> None:
    """The refund request is dropped before the provider executes it: a status query's receipt says not committed,
    and the retry under the same key is admitted on that evidence (state_verified) and commits, once."""
    key = play.key("refund")
    order_id = f"O-{play.digits(1)}"
    play.fault(route="/refunds", key=key, kind="drop_before_commit", times=1)
    task_id, refund = shared.refund_task(play, key, order_id, shared.REFUND_CENTS)
    outcome = play.submit(task_id, f"refund of order {order_id}: {refund.state}")

    call = play.call(refund.call_id)
    sent = refund.sent
    play.check("the lost request", "UNKNOWN", sent[0].call_state if sent else "")
    found = [receipt["observed"] for receipt in shared.provider_receipts(call)]
    play.check("the status query found", contains("not_committed"), found)
    retries = [g for g in call["gate_decisions"] if g["allowed"] and g["evidence_used"]]
    play.check("the retry admitted on", "state_verified", retries[0]["evidence_used"] if retries else "no retry")
    outcomes = [r["outcome"] for r in play.writes(key)]
    play.check("write requests, same key", ["dropped_before_commit", "answered"], outcomes)
    play.check("call state", "COMMITTED", call["state"])
    play.check("business effects for the key", 1, play.effects(key))
    play.check("task outcome", "completed", outcome)
    play.result.end = f"{call['state']} after a same-key retry, {play.effects(key)} effect"

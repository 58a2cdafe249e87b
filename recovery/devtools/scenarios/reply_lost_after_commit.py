from __future__ import annotations

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.play import Play, scenario


@scenario(
    name="reply-lost-after-commit",
    title="refund, reply lost after commit",
    pinned_end="COMMITTED by a receipt, 1 effect, no second request",
)
def reply_lost_after_commit(play: Play) -> None:
    """The provider commits the refund and its reply is lost (its callback held back): the call is UNKNOWN until
    the status query's receipt says committed, and nothing is sent again."""
    key = play.key("refund")
    order_id = f"O-{play.digits(1)}"
    play.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    play.fault(route="/refunds", key=key, kind="delayed_callbacks", ms=shared.HOLD_CALLBACK_MS, times=1)
    task_id, refund = shared.refund_task(play, key, order_id, shared.REFUND_CENTS)
    outcome = play.submit(task_id, f"refund of order {order_id}: {refund.state}")

    call = play.call(refund.call_id)
    play.check("the lost reply", "UNKNOWN", refund.attempts[0].call_state if refund.attempts else "")
    play.check("call state", "COMMITTED", call["state"])
    shared.check_settled_by_receipt(play, "settled by", call)
    play.check("attempts made", 1, call["attempts_made"])
    play.check("write requests for the key", 1, len(play.writes(key)))
    play.check("business effects for the key", 1, play.effects(key))
    play.check("task outcome", "completed", outcome)
    play.result.end = f"{call['state']} by {shared.settled_by(call)}, {play.effects(key)} effect"

from __future__ import annotations

from recovery_client.runtime import HUMAN_REVIEW

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.play import Play, scenario


@scenario(
    name="needs-approval",
    title="a refund answered 403 with an approvable code",
    pinned_end="HUMAN_REVIEW, left for a reviewer",
)
def needs_approval(play: Play) -> None:
    """A large refund the provider answers 403 needs_approval: the decision escalates it for approval, nothing is
    committed, and the task is submitted with the call listed for review."""
    key = play.key("refund")
    order_id = f"O-{play.digits(1)}"
    play.fault(route="/refunds", key=key, kind="error", status=403, code="needs_approval", times=1)
    task_id, refund = shared.refund_task(play, key, order_id, shared.REFUND_CENTS * 40)
    task = play.agent.submit(task_id, f"refund of order {order_id} waits for a reviewer's approval")

    call = play.call(refund.call_id)
    decision = call.get("latest_decision") or {}
    play.check("agent's end", HUMAN_REVIEW, refund.outcome)
    play.check("call state", "HUMAN_REVIEW", call["state"])
    play.check(
        "decision",
        "escalate → request_approval",
        f"{decision.get('route')} → {(decision.get('required_next') or {}).get('action')}",
    )
    play.check("attempts made", 1, call["attempts_made"])
    play.check("business effects for the key", 0, play.effects(key))
    play.check("task outcome", "completed_with_unknowns", task.outcome)
    play.check("the task lists it for review", [call["id"]], [c["call_id"] for c in task.raw.get("needs_review", [])])
    play.result.end = f"{call['state']}, no effect, task {task.outcome}"

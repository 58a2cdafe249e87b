"""Checks and steps more than one drill makes."""

from __future__ import annotations

from recovery.agent.runtime import Agent, CallResult
from recovery.audit import Actor
from recovery.drills.framework import Run
from recovery.drills.table import ARROW
from recovery.models import ActionRequest, Receipt
from recovery.services.actions import action_preview, action_request


def check_settled_by_one_receipt(run: Run, receipts: list[Receipt], label: str = "applied receipts") -> None:
    """The call left UNKNOWN on exactly one applied receipt (`receipts`), which observed the refund committed: the
    last step of the table's path."""
    run.check(
        "settled by a receipt",
        expected={label: [{"observed": "committed", "moved": ARROW.join(run.drill.path[-2:])}]},
        observed={
            label: [
                {"observed": r.observed, "moved": ARROW.join((r.local_state_before, r.local_state_after))}
                for r in receipts
            ]
        },
    )


def check_one_request(run: Run, key: str) -> None:
    """The provider was sent the refund once, and its reply was lost."""
    posts = run.sandbox.requests(key=key, method="POST")
    run.check(
        "no second request",
        expected={"refund requests under the key": ["dropped_after_commit"] * run.drill.sends},
        observed={"refund requests under the key": [post["outcome"] for post in posts]},
    )


def unconfirmed_refund(run: Run, label: str, *, goal: str) -> tuple[Agent, int, CallResult]:
    """A refund committed with its reply dropped while the provider's status endpoint answers 503 for its key, in a
    task of its own (`drill-<label>`): its agent, the task's id and the call."""
    key, arguments = run.refund_args(label, 1)
    run.sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    run.sandbox.fault(route="/refunds/by-key", key=key, kind="status_down", status=503)
    agent = run.agent()
    task_id, result = run.refund(agent, key, arguments, task=f"drill-{label}", goal=goal)
    return agent, task_id, result


def request_replay(call_id: int, reviewer, reason: str) -> ActionRequest:
    """The reviewer's dry run of a same-key replay, then the request for it with a reason (bound to the plan's hash)."""
    actor = Actor.for_user(reviewer)
    preview = action_preview(call_id=call_id, action="replay_same_key", user=reviewer, actor=actor)
    return action_request(request_id=preview.pk, user=reviewer, actor=actor, reason=reason, plan_hash=preview.plan_hash)

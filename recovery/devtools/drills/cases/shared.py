"""Checks and steps more than one drill makes."""

from __future__ import annotations

from recovery_client.runtime import CallResult

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor
from recovery.devtools.agent import Agent
from recovery.devtools.drills.cases.compensation import ACTION_ENDS
from recovery.devtools.drills.evidence import action_events
from recovery.devtools.drills.framework import Run, wait
from recovery.devtools.drills.stage import DRILL_APPROVERS, DRILL_REVIEWER, drill_people
from recovery.devtools.drills.table import ARROW
from recovery.engine.states import CallState as S
from recovery.models import ActionRequest, ActionStatus, DuplicateProbe, Receipt, Tool
from recovery.services.actions import action_approve, action_preview, action_request

PROBE_DUPLICATE = "probe_duplicate"  # the operator action that runs a duplicate probe (docs/replay.md)
PROBE_WAIT_S = 60  # how long a drill waits for an approved probe's execution
# An approved probe, as its request's audit events tell it: each status once, in this order.
PROBED_EVENTS = [
    AuditAction.ACTION_PREVIEWED,
    AuditAction.ACTION_REQUESTED,
    AuditAction.ACTION_APPROVED,
    AuditAction.ACTION_EXECUTING,
    AuditAction.ACTION_EXECUTED,
]


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


def check_one_request(run: Run, key: str, *, step: str = "") -> None:
    """The provider was sent the refund once, and its reply was lost (`step`: the call's role, in a drill of
    steps)."""
    posts = run.sandbox.requests(key=key, method="POST")
    run.check(
        "no second request",
        expected={"refund requests under the key": ["dropped_after_commit"] * run.drill.sends_of(step)},
        observed={"refund requests under the key": [post["outcome"] for post in posts]},
    )


def write_outcomes(run: Run, key: str) -> list[str]:
    """What the sandbox did with each write request under the key, in order (answered, replayed, dropped_...)."""
    return [post["outcome"] for post in run.sandbox.requests(key=key, method="POST")]


def unconfirmed_refund(
    run: Run, label: str, *, goal: str, tool: str = "refund.create", step: str = "", n: int = 1
) -> tuple[Agent, int, CallResult]:
    """A refund committed with its reply dropped while the provider's status endpoint answers 503 for its key, in a
    task of its own (`drill-<label>`): its agent, the task's id and the call (`tool`, `step`: as Run.refund; `n`
    numbers its order)."""
    key, arguments = run.refund_args(label, n)
    run.sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    run.sandbox.fault(route="/refunds/by-key", key=key, kind="status_down", status=503)
    agent = run.agent()
    task_id, result = run.refund(agent, key, arguments, task=f"drill-{label}", goal=goal, tool=tool, step=step)
    return agent, task_id, result


def committed_refund(run: Run, label: str, *, goal: str, tool: str, step: str, n: int) -> CallResult:
    """A refund the agent makes for real with `tool`, in a task of its own (`drill-<label>`), recorded as the key
    row of `step`; RuntimeError when it did not commit (nothing to probe)."""
    key, arguments = run.refund_args(label, n)
    _, result = run.refund(run.agent(), key, arguments, task=f"drill-{label}", goal=goal, tool=tool, step=step)
    if result.state != S.COMMITTED:
        raise RuntimeError(f"the refund did not commit ({result.state}: {result.detail}): nothing to probe")
    return result


def approved_probe(run: Run, call_id: int, *, reason: str) -> ActionRequest:
    """A duplicate probe of the COMMITTED call through the console's action flow (docs/replay.md): the drill reviewer
    previews and requests `probe_duplicate`, the first drill approver approves it (a second person), and a worker
    executes it — one same-key replay and one read of the provider's ledger. The request, once it has ended (or
    after PROBE_WAIT_S)."""
    people = drill_people()
    reviewer, approver = people.reviewer, people.approvers[0]
    actor = Actor.for_user(reviewer)
    preview = action_preview(call_id=call_id, action=PROBE_DUPLICATE, user=reviewer, actor=actor)
    action_request(request_id=preview.pk, user=reviewer, actor=actor, reason=reason, plan_hash=preview.plan_hash)
    action_approve(
        request_id=preview.pk,
        user=approver,
        actor=Actor.for_user(approver),
        reason="drill: a sandbox tenant; the probe's one replay is the evidence",
    )
    ended = ActionRequest.objects.filter(pk=preview.pk, status__in=ACTION_ENDS)
    wait(ended.exists, PROBE_WAIT_S, every_s=0.2)
    request = ActionRequest.objects.get(pk=preview.pk)
    probe = DuplicateProbe.objects.filter(action=request).first()
    seen = f"{probe.decision} ({probe.detail})" if probe else "no probe stored"
    run.log(
        f"  probe_duplicate requested by {reviewer.get_username()}, approved by {approver.get_username()}:"
        f" {request.status}, {seen}"
    )
    return request


def check_probe_approved(run: Run, request: ActionRequest) -> None:
    """The probe ran as an approved operator action: requested by the drill reviewer, approved by another person,
    executed once by a worker (its audit events, in order), and stored one probe of the call."""
    request = ActionRequest.objects.select_related("requested_by", "decided_by").get(pk=request.pk)
    run.check(
        "the duplicate probe ran as an approved probe_duplicate",
        expected={
            "action": PROBE_DUPLICATE,
            "request": ActionStatus.EXECUTED,
            "requested by": DRILL_REVIEWER,
            "approved by": DRILL_APPROVERS[0],
            "its events": PROBED_EVENTS,
            "probes stored by it": 1,
        },
        observed={
            "action": request.action,
            "request": request.status,
            "requested by": request.requested_by.get_username() if request.requested_by else None,
            "approved by": request.decided_by.get_username() if request.decided_by else None,
            "its events": action_events([request.call_id])[request.call_id],
            "probes stored by it": DuplicateProbe.objects.filter(action=request).count(),
        },
    )


def probe_of(request: ActionRequest) -> DuplicateProbe | None:
    return DuplicateProbe.objects.filter(action=request).select_related("tool").first()


def probe_seen(probe: DuplicateProbe | None) -> dict:
    """A probe's verdict as a check shows it, and the retry path its tool has now (with the probe that set it)."""
    if probe is None:
        return {"second": None, "downstream audit": None, "effects": None, "decision": None, "tool's retry path": None}
    tool = Tool.objects.get(pk=probe.tool_id)
    return {
        "second": probe.second,
        "downstream audit": probe.downstream_audit,
        "effects": {"observed": probe.observed_effects, "expected": probe.expected_effects},
        "decision": probe.decision,
        "tool's retry path": {"now": tool.retry_path, "set by this probe": tool.retry_path_probe_id == probe.pk},
    }


def request_replay(call_id: int, reviewer, reason: str) -> ActionRequest:
    """The reviewer's dry run of a same-key replay, then the request for it with a reason (bound to the plan's hash)."""
    actor = Actor.for_user(reviewer)
    preview = action_preview(call_id=call_id, action="replay_same_key", user=reviewer, actor=actor)
    return action_request(request_id=preview.pk, user=reviewer, actor=actor, reason=reason, plan_hash=preview.plan_hash)

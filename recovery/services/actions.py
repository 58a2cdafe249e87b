"""Operator actions (docs/actions.md): a dry run, a reviewer's request, a second person's decision, a worker's
execution. Every service asks the catalogue first (so nothing the call page would not offer is accepted); the
four-eyes steps are recovery.services.approvals' (this module adds the plan's binding: a request goes STALE when the
call or the plan moved since the preview). Execution is recovery.services.action_execution (re-exported here); the
plan, recovery.services.action_plans."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor
from recovery.engine.actions import REVIEW_PERMISSION
from recovery.engine.fingerprint import fingerprint
from recovery.engine.states import CallState
from recovery.jobs import queueing
from recovery.models import ActionRequest, ActionStatus, Call, GateDecision
from recovery.services import approvals
from recovery.services.action_execution import (  # noqa: F401  (the job's body and the sweep, re-exported)
    action_execute,
    actions_approved_waiting,
    actions_sweep_interrupted,
)
from recovery.services.action_plans import (
    ACTION_BY_NAME,
    SECOND_PERSON,
    SETTLES,
    CallFacts,
    Plan,
    PlanError,
    action_event,
    build_plan,
    call_facts,
    call_for_action,
    require_allowed,
)
from recovery.services.calls import call_abandon
from recovery.services.errors import Refusal

A = ActionStatus
S = CallState
HOLD_ACTION = "execute_held"  # a held MCP call's execution (docs/mcp-gateway.md, "Approval holds")
EVIDENCE_FIELDS = {"provider_ref": 255, "receipt_id": 255, "link": 2000}
SWEEP_LIMIT = 500
_LINK = URLValidator(schemes=["http", "https"])

# The job that executes an approved request, by name: recovery.jobs calls this module, so it cannot be imported here.
EXECUTE_JOB = "recovery.jobs.tasks.execute_action"


def _record(request: ActionRequest, to: str, actor: Actor, *, reason: str, was: str, user) -> None:
    """A four-eyes step of the request (`action.<status>`), on its call's task chain."""
    evidence = approvals.step_evidence(to, was, user)
    action_event(AuditAction.request_entered(to), request, request.call, actor, reason=reason, status=to, **evidence)


KIND = approvals.FourEyes(
    model=ActionRequest,
    noun="request",
    thing="action",
    own="You requested this action: a different person with the approver role decides it (four eyes).",
    expired="This request expired ({why}): preview the action again.",
    reason_use="recorded with the action and read by the other person",
    record=_record,
    related=("call", "requested_by", "decided_by"),
    sweep_limit=SWEEP_LIMIT,
)


def _plan(call: Call, action: str, facts: CallFacts, evidence: dict, now: datetime) -> Plan:
    try:
        return build_plan(call, action, facts=facts, evidence=evidence, now=now)
    except PlanError as exc:
        raise Refusal("forbidden", f"No plan can be made: {exc}.") from None


# --- evidence ------------------------------------------------------------------------------------------------------


def clean_evidence(action: str, evidence: dict | None) -> dict:
    """The evidence a person settling a call by hand gives (provider_ref, receipt_id, link): at least one, a link
    an http(s) address. Other actions carry none."""
    if action not in SETTLES:
        return {}
    evidence = evidence or {}
    if not isinstance(evidence, dict):
        raise Refusal("evidence", "Evidence is a provider reference, a receipt id or a link.", field="provider_ref")
    for key in evidence:
        if key not in EVIDENCE_FIELDS:
            raise Refusal("evidence", f"{key!r} is not evidence: give provider_ref, receipt_id or link.", field=key)
    given = {key: _evidence_value(key, evidence.get(key), limit) for key, limit in EVIDENCE_FIELDS.items()}
    if clean := {key: value for key, value in given.items() if value}:
        return clean
    message = (
        "Settling a call by hand needs evidence: the provider's reference, a receipt id, or a link to the provider's "
        "receipt or a document."
    )
    raise Refusal("evidence", message, field="provider_ref")


def _evidence_value(key: str, value, limit: int) -> str:
    """One piece of evidence, stripped ("" when not given): text within its length; a link, an http(s) address."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Refusal("evidence", "This must be text.", field=key)
    value = value.strip()
    if len(value) > limit:
        raise Refusal("evidence", f"At most {limit} characters.", field=key)
    if key == "link" and value:
        try:
            _LINK(value)
        except ValidationError:
            message = "The link must be an http:// or https:// address of the receipt or document."
            raise Refusal("evidence", message, field="link") from None
    return value


# --- preview -------------------------------------------------------------------------------------------------------


def action_preview(*, call_id: int, action: str, user, actor: Actor, evidence: dict | None = None) -> ActionRequest:
    """The dry run: the plan of `action` on the call, stored as a PREVIEWED request. Sends nothing."""
    approvals.require_role(user, REVIEW_PERMISSION, "Previewing an action")
    if action not in ACTION_BY_NAME:
        raise Refusal("forbidden", f"There is no action {action!r}.", field="action")
    now = timezone.now()
    call = call_for_action(call_id)
    if call is None:
        raise Call.DoesNotExist(f"no call {call_id}")
    facts = call_facts(call, user=user, now=now)
    require_allowed(call, facts, action, perms=user.get_all_permissions())
    clean = clean_evidence(action, evidence)
    plan = _plan(call, action, facts, clean, now)
    return store_preview(call, plan, clean, user=user, actor=actor, now=now)


def store_preview(call: Call, plan: Plan, clean: dict, *, user, actor: Actor, now: datetime) -> ActionRequest:
    """A plan stored as a PREVIEWED request with its audit event (and a replay's dry-run gate answer). `user` None:
    the MCP gateway stored it, the preview of a held call (recovery.services.mcp_holds)."""
    action = plan.data["action"]
    with transaction.atomic():
        request = ActionRequest.objects.create(
            call=call,
            action=action,
            status=A.PREVIEWED,
            plan=plan.data,
            plan_hash=plan.hash,
            call_version=call.version,
            evidence=clean,
            previewed_by=user,
            previewed_at=now,
            expires_at=now + approvals.ttl(),
            updated_at=now,
        )
        if plan.gate is not None:
            _store_dry_gate(call, plan, request, user)
        failed = [check["check"] for check in plan.failed_checks]
        action_event(
            AuditAction.ACTION_PREVIEWED,
            request,
            call,
            actor,
            reason=f"dry run of {plan.data['label']}: nothing was sent",
            status=A.PREVIEWED,
            state=call.state,
            failed_checks=failed,
            evidence_given=clean,
        )
    return request


def _store_dry_gate(call: Call, plan: Plan, request: ActionRequest, user) -> None:
    """The gate's dry-run answer, stored as any gate answer is (docs/design/gate.md), marked as nothing admitted."""
    gate, candidate = plan.gate, plan.candidate
    GateDecision.objects.create(
        call=call,
        candidate_attempt_id=f"preview-{request.pk}",
        candidate={
            "tool": candidate.tool,
            "fingerprint": fingerprint(candidate.tool, candidate.arguments),
            "credential_version": None,
            "evidence": list(candidate.evidence),
        },
        dry_run=True,
        allowed=gate.allowed,
        reason=gate.reason,
        evidence_used=gate.evidence_used,
        checks=[{"name": c.name, "passed": c.passed, "detail": c.detail} for c in gate.checks],
        required_next=asdict(gate.required_next) if gate.required_next else {},
        actor_user_id=user.pk if user is not None else None,
    )


# --- stale and expired ---------------------------------------------------------------------------------------------


def _stale_why(request: ActionRequest, call: Call, facts: CallFacts, now: datetime) -> tuple[str, Plan | None]:
    """Why the preview no longer holds (the call moved, or the plan re-built now differs), or ""; and the plan."""
    if call.version != request.call_version:
        was = request.plan.get("state", "?") if isinstance(request.plan, dict) else "?"
        why = (
            f"the call changed since the preview (it was {was} at version {request.call_version}, it is "
            f"{call.state} at version {call.version})"
        )
        return why, None
    try:
        plan = build_plan(call, request.action, facts=facts, evidence=request.evidence or {}, now=now)
    except PlanError as exc:
        return f"the plan cannot be made any more ({exc})", None
    if plan.hash != request.plan_hash:
        return f"the plan changed since the preview ({_what_changed(request.plan, plan.data)})", plan
    return "", plan


def _what_changed(before: dict, after: dict) -> str:
    before = before if isinstance(before, dict) else {}
    was = {c["check"]: c["passed"] for c in before.get("checks", [])}
    changed = [
        f"{c['check']} now {'passes' if c['passed'] else 'fails'}: {c['detail']}"
        for c in after["checks"]
        if was.get(c["check"]) != c["passed"]
    ]
    for key in ("requests", "approval", "sends"):
        if before.get(key) != after.get(key):
            changed.append(f"its {key} changed")
    if sorted(f["action"] for f in before.get("forbidden", [])) != sorted(f["action"] for f in after["forbidden"]):
        changed.append("the forbidden actions changed")
    return "; ".join(changed) or "its content changed"


def _go_stale(request: ActionRequest, actor: Actor, why: str, now: datetime) -> None:
    """The request → STALE (what moved is the news, so it is kept); not_pending when it moved first."""
    if not approvals.mark(KIND, request, actor, to=A.STALE, reason=f"{why}: preview again", now=now):
        raise approvals.not_pending(KIND, request)


# --- request -------------------------------------------------------------------------------------------------------


def action_request(*, request_id: int, user, actor: Actor, reason: str, plan_hash: str) -> ActionRequest:
    """PREVIEWED → REQUESTED, with a reason, for the plan the reviewer read (its hash). STALE instead (returned) when
    the call or the plan moved since the preview. A read-only action with one confirmation configured is APPROVED at
    once and its execution enqueued."""

    def binds(request: ActionRequest) -> None:
        if plan_hash != request.plan_hash:
            message = "This is not the plan that was previewed: open the request again, read its plan, then request it."
            raise Refusal("stale", message, field="plan_hash")

    asked = approvals.requestable(
        KIND, request_id, user=user, actor=actor, reason=reason, what="Requesting an action", binds=binds
    )
    request, now = asked.row, asked.now
    call = call_for_action(request.call_id)
    facts = call_facts(call, user=user, now=now)
    why, plan = _stale_why(request, call, facts, now)
    if why:
        _go_stale(request, actor, why, now)
        return approvals.load(KIND, request.pk)
    require_allowed(call, facts, request.action, perms=user.get_all_permissions())
    if failed := plan.failed_checks:
        details = "; ".join(f"{c['check']}: {c['detail']}" for c in failed)
        raise Refusal("forbidden", f"The plan's checks fail ({details}): it would not run. Nothing was requested.")
    if plan.data["approval"] == SECOND_PERSON:
        return approvals.request(asked)
    return approvals.request(asked, then=lambda: _approve_alone(request, call, actor, now))


def _approve_alone(request: ActionRequest, call: Call, actor: Actor, now: datetime) -> None:
    """A read-only action on the requester's confirmation alone (no decider: the constraint allows it for
    reconcile_now only), executed by a worker once this transaction commits."""
    ActionRequest.objects.filter(pk=request.pk, status=A.REQUESTED).update(
        status=A.APPROVED, decided_at=now, decision_reason="read-only: one confirmation", updated_at=now
    )
    why = "read-only action: the requester's confirmation is enough (RECOVERY_READ_ACTIONS_ONE_CONFIRMATION)"
    action_event(
        AuditAction.ACTION_APPROVED, request, call, actor, reason=why, status=A.APPROVED, one_confirmation=True
    )
    _enqueue_execution(request.pk)


def _enqueue_execution(request_id: int) -> None:
    queueing.enqueue(EXECUTE_JOB, request_id, job_id=f"action-execute-{request_id}")


# --- approve, reject, withdraw ----------------------------------------------------------------------------------------


def action_approve(*, request_id: int, user, actor: Actor, reason: str) -> ActionRequest:
    """REQUESTED → APPROVED by a second person; refused as stale when the call or the plan moved since the preview
    (the request is then STALE), as expired past its expiry. The execution job is enqueued on commit."""
    asked = approvals.decidable(KIND, request_id, user=user, actor=actor, reason=reason, what="Approving an action")
    request, now = asked.row, asked.now
    call = call_for_action(request.call_id)
    why, _ = _stale_why(request, call, call_facts(call, user=None, now=now), now)
    if why:
        _go_stale(request, actor, why, now)
        raise Refusal("stale", f"Not approved: {why}. Preview the action again.")

    def then() -> None:
        if request.action == HOLD_ACTION:  # the task's other holds of the tool are refused, never executed
            supersede_others(request, actor, now)
        _enqueue_execution(request.pk)

    approvals.decide(asked, to=A.APPROVED, then=then)
    return approvals.load(KIND, request.pk)


def action_reject(*, request_id: int, user, actor: Actor, reason: str) -> ActionRequest:
    """REQUESTED → REJECTED by a second person, with a reason."""
    asked = approvals.decidable(KIND, request_id, user=user, actor=actor, reason=reason, what="Rejecting an action")
    request = asked.row

    def then() -> None:
        if request.action == HOLD_ACTION:  # a held call refused: it ends, and the client's re-issue is told so
            refuse_held(request.call_id, actor, f"the held call was rejected by {user.get_username()}: {asked.reason}")

    approvals.decide(asked, to=A.REJECTED, then=then)
    return approvals.load(KIND, request_id)


def action_withdraw(*, request_id: int, user, actor: Actor, reason: str) -> ActionRequest:
    """REQUESTED → WITHDRAWN by the person who requested it, with a reason, while nobody has decided."""
    return approvals.withdraw(KIND, request_id, user=user, actor=actor, reason=reason)


# --- held MCP calls: what a decision on one means for its call and the task's other holds ---------------------------


def refuse_held(call_id: int, actor: Actor, reason: str) -> None:
    """A held call nobody will execute (rejected, superseded) ends FAILED_PERMANENT (abandoned), through the
    transition function, in the caller's transaction."""
    call = Call.objects.select_for_update().get(pk=call_id)
    if call.state == S.READY:
        call_abandon(call=call, actor=actor, reason=reason)


def cancel_held(call_id: int, actor: Actor, now: datetime | None = None) -> bool:
    """The client cancels its held call (the MCP tasks extension's `tasks/cancel`, docs/mcp-gateway.md "Tasks"):
    while no one has approved it, its holds are withdrawn, marked cancelled by the client, and the call ends
    FAILED_PERMANENT, never executed. Once approved it runs once regardless (cancellation is cooperative): False."""
    now = now or timezone.now()
    why = f"cancelled by its MCP client (tasks/cancel) before anyone approved call {call_id}"
    holds = ActionRequest.objects.filter(call_id=call_id, action=HOLD_ACTION)
    withdrawn = False
    with transaction.atomic():
        if not list(Call.objects.select_for_update().filter(pk=call_id, state=S.READY).values_list("pk", flat=True)):
            return False
        if holds.filter(status__in=(A.APPROVED, A.EXECUTING, A.EXECUTED)).exists():
            return False
        for request in holds.filter(status__in=(A.PREVIEWED, A.REQUESTED)).select_related("call", "requested_by"):
            if approvals.mark(KIND, request, actor, to=A.WITHDRAWN, reason=why, now=now):
                ActionRequest.objects.filter(pk=request.pk).update(result={"what": why, "cancelled_by_client": True})
                withdrawn = True
        if withdrawn:
            refuse_held(call_id, actor, why)
    return withdrawn


def supersede_others(approved: ActionRequest, actor: Actor, now: datetime) -> list[int]:
    """Approving one hold refuses the task's other undecided holds of the same tool (a re-issue whose arguments
    differed): each request goes stale, marked superseded, and its call ends — none is ever executed. In the
    approval's transaction; the calls refused."""
    call = approved.call
    others = ActionRequest.objects.filter(
        action=HOLD_ACTION,
        status__in=(A.PREVIEWED, A.REQUESTED),
        call__task_id=call.task_id,
        call__tool_id=call.tool_id,
        call__state=S.READY,
    ).exclude(call_id=call.pk)  # another preview of the same call (a reviewer's) is not another intent
    refused = []
    with transaction.atomic():
        for other in others.select_related("call", "requested_by", "decided_by"):
            why = f"superseded: the hold of call {call.pk} (request {approved.pk}) was approved instead"
            if approvals.mark(KIND, other, actor, to=A.STALE, reason=why, now=now):
                ActionRequest.objects.filter(pk=other.pk).update(result={"what": why, "superseded_by": call.pk})
                refuse_held(other.call_id, actor, why)
                refused.append(other.call_id)
    return refused


# --- periodic: expiry (interrupted executions: recovery.services.action_execution) --------------------------------


def actions_expire_due(*, now: datetime | None = None) -> int:
    """PREVIEWED and REQUESTED requests past their expiry → EXPIRED, each with its audit event; how many. A held MCP
    call whose hold expired with nobody deciding it ends FAILED_PERMANENT (its client is answered the refusal)."""
    actor = Actor.job("actions-expire")
    expired = approvals.expire_due(KIND, actor=actor, now=now)
    live = ActionRequest.objects.filter(action=HOLD_ACTION, call_id=OuterRef("call_id")).exclude(status=A.EXPIRED)
    ended = ActionRequest.objects.filter(action=HOLD_ACTION, status=A.EXPIRED, call__state=S.READY)
    for call_id in ended.exclude(Exists(live)).values_list("call_id", flat=True).distinct()[:SWEEP_LIMIT]:
        with transaction.atomic():
            refuse_held(call_id, actor, "its hold expired: nobody approved it in time, it never ran")
    return expired

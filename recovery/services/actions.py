"""Operator actions (docs/actions.md): a dry run, a reviewer's request, a second person's decision, a worker's
execution.

    request = action_preview(call_id=7, action="replay_same_key", user=reviewer, actor=Actor.for_user(reviewer))
    action_request(request_id=request.pk, user=reviewer, actor=..., reason="...", plan_hash=request.plan_hash)
    action_approve(request_id=request.pk, user=approver, actor=..., reason="...")   # the job runs on commit
    action_execute(request.pk, worker="host:pid:thread")                          # the job's body: once

Every service first asks the catalogue (recovery.engine.actions.actions_for) with the person's permissions and the
call's facts, so nothing is accepted here that the call page would not offer. A refusal is a Refusal with a code
and a message for a person; nothing changed, except where the refusal itself is the news (stale, expired: the request's
status records it). Statuses move only by conditional UPDATEs on (id, status): of two approvers, two workers or an
approver and the expiry job, exactly one wins and the other is told so. An approval binds to the call's version and
the plan's hash at preview: approving re-reads the call and re-builds the plan, and anything that moved makes the
request STALE. Writes always need a second person with the approver role — the database's `action_four_eyes`
constraint backs the service's check — and a read-only reconcile may run on the requester's confirmation alone
(RECOVERY_READ_ACTIONS_ONE_CONFIRMATION).

Execution, by a worker and once, is recovery/services/action_execution.py (re-exported here: `action_execute`,
`actions_sweep_interrupted`, `actions_approved_waiting`); the plan and the catalogue's answer are
recovery/services/action_plans.py. Every step is an audit event on the call's task chain, with its actor and
evidence.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor
from recovery.engine.actions import REVIEW_PERMISSION
from recovery.engine.fingerprint import fingerprint
from recovery.engine.states import CallState
from recovery.jobs import queueing
from recovery.models import ActionRequest, ActionStatus, Call, GateDecision
from recovery.services.action_execution import (  # noqa: F401  (the job's body and the sweep, re-exported)
    action_execute,
    actions_approved_waiting,
    actions_sweep_interrupted,
)
from recovery.services.action_plans import (
    ACTION_BY_NAME,
    APPROVE_PERMISSION,
    SECOND_PERSON,
    SETTLES,
    CallFacts,
    Plan,
    PlanError,
    action_event,
    build_plan,
    call_facts,
    call_for_action,
    clean_reason,
    require_allowed,
    require_role,
)
from recovery.services.errors import Refusal

A = ActionStatus
S = CallState
OPEN = (A.PREVIEWED, A.REQUESTED)
EVIDENCE_FIELDS = {"provider_ref": 255, "receipt_id": 255, "link": 2000}
SWEEP_LIMIT = 500
_LINK = URLValidator(schemes=["http", "https"])

# The job that executes an approved request, by name: recovery.jobs calls this module, so it cannot be imported here.
EXECUTE_JOB = "recovery.jobs.tasks.execute_action"


def _ttl() -> timedelta:
    return timedelta(seconds=settings.RECOVERY_ACTION_TTL_S)


def _load(request_id: int) -> ActionRequest:
    """The request with its call (ActionRequest.DoesNotExist for an unknown id)."""
    return ActionRequest.objects.select_related("call", "requested_by", "decided_by").get(pk=request_id)


def _not_pending(request: ActionRequest) -> Refusal:
    return Refusal("not_pending", f"This request is {request.status} now: nothing more can be done with it.")


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
    clean = {}
    for key, limit in EVIDENCE_FIELDS.items():
        value = evidence.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise Refusal("evidence", "This must be text.", field=key)
        value = value.strip()
        if not value:
            continue
        if len(value) > limit:
            raise Refusal("evidence", f"At most {limit} characters.", field=key)
        if key == "link":
            try:
                _LINK(value)
            except ValidationError:
                message = "The link must be an http:// or https:// address of the receipt or document."
                raise Refusal("evidence", message, field="link") from None
        clean[key] = value
    if not clean:
        message = (
            "Settling a call by hand needs evidence: the provider's reference, a receipt id, or a link to the "
            "provider's receipt or a document."
        )
        raise Refusal("evidence", message, field="provider_ref")
    return clean


# --- preview -------------------------------------------------------------------------------------------------------


def action_preview(*, call_id: int, action: str, user, actor: Actor, evidence: dict | None = None) -> ActionRequest:
    """The dry run: the plan of `action` on the call, stored as a PREVIEWED request. Sends nothing."""
    require_role(user, REVIEW_PERMISSION, "Previewing an action")
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
            expires_at=now + _ttl(),
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
        actor_user_id=user.pk,
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


def _mark(request: ActionRequest, call: Call, actor: Actor, *, to: str, reason: str, now) -> bool:
    """request: its current status → `to` (STALE, EXPIRED), with its audit event; False when it moved first."""
    with transaction.atomic():
        moved = ActionRequest.objects.filter(pk=request.pk, status=request.status).update(status=to, updated_at=now)
        if moved:
            action_event(
                AuditAction.request_entered(to), request, call, actor, reason=reason, status=to, was=request.status
            )
    if moved:
        request.status = to
    return bool(moved)


def _expire_now(request: ActionRequest, actor: Actor, now: datetime) -> Refusal:
    """Mark a request found past its expiry EXPIRED; the refusal to raise."""
    why = f"not {'decided' if request.status == A.REQUESTED else 'requested'} before {request.expires_at.isoformat()}"
    if not _mark(request, request.call, actor, to=A.EXPIRED, reason=why, now=now):
        return _not_pending(_load(request.pk))
    return Refusal("expired", f"This request expired ({why}): preview the action again.")


# --- request -------------------------------------------------------------------------------------------------------


def action_request(*, request_id: int, user, actor: Actor, reason: str, plan_hash: str) -> ActionRequest:
    """PREVIEWED → REQUESTED, with a reason. STALE instead (returned) when the call or the plan moved since the
    preview. A read-only action with one confirmation configured is APPROVED at once and its execution enqueued."""
    require_role(user, REVIEW_PERMISSION, "Requesting an action")
    reason = clean_reason(reason)
    now = timezone.now()
    request = _load(request_id)
    if request.status != A.PREVIEWED:
        raise _not_pending(request)
    if plan_hash != request.plan_hash:
        message = "This is not the plan that was previewed: open the request again, read its plan, then request it."
        raise Refusal("stale", message, field="plan_hash")
    if now >= request.expires_at:
        raise _expire_now(request, actor, now)
    call = call_for_action(request.call_id)
    facts = call_facts(call, user=user, now=now)
    why, plan = _stale_why(request, call, facts, now)
    if why:
        if not _mark(request, call, actor, to=A.STALE, reason=f"{why}: preview again", now=now):
            raise _not_pending(_load(request.pk))
        return _load(request.pk)
    require_allowed(call, facts, request.action, perms=user.get_all_permissions())
    if failed := plan.failed_checks:
        details = "; ".join(f"{c['check']}: {c['detail']}" for c in failed)
        raise Refusal("forbidden", f"The plan's checks fail ({details}): it would not run. Nothing was requested.")
    one_confirmation = plan.data["approval"] != SECOND_PERSON
    with transaction.atomic():
        moved = ActionRequest.objects.filter(pk=request.pk, status=A.PREVIEWED).update(
            status=A.REQUESTED,
            requested_by=user,
            requested_at=now,
            reason=reason,
            expires_at=now + _ttl(),
            updated_at=now,
        )
        if not moved:
            raise _not_pending(_load(request.pk))
        action_event(
            AuditAction.ACTION_REQUESTED,
            request,
            call,
            actor,
            reason=reason,
            status=A.REQUESTED,
            requested_by=user.get_username(),
        )
        if one_confirmation:
            _approve_alone(request, call, actor, now)
    return _load(request.pk)


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


# --- approve and reject ----------------------------------------------------------------------------------------------


def _decidable(request_id: int, user, actor: Actor, what: str, now: datetime) -> ActionRequest:
    """The request, REQUESTED, not the user's own, not expired; Refusal otherwise (the role first)."""
    require_role(user, APPROVE_PERMISSION, what)
    request = _load(request_id)
    if request.status != A.REQUESTED:
        raise _not_pending(request)
    if request.requested_by_id == user.pk:
        raise Refusal(
            "four_eyes", "You requested this action: a different person with the approver role decides it (four eyes)."
        )
    if now >= request.expires_at:
        raise _expire_now(request, actor, now)
    return request


def action_approve(*, request_id: int, user, actor: Actor, reason: str) -> ActionRequest:
    """REQUESTED → APPROVED by a second person; refused as stale when the call or the plan moved since the preview
    (the request is then STALE), as expired past its expiry. The execution job is enqueued on commit."""
    require_role(user, APPROVE_PERMISSION, "Approving an action")
    reason = clean_reason(reason)
    now = timezone.now()
    request = _decidable(request_id, user, actor, "Approving an action", now)
    call = call_for_action(request.call_id)
    facts = call_facts(call, user=None, now=now)
    why, _ = _stale_why(request, call, facts, now)
    if why:
        if not _mark(request, call, actor, to=A.STALE, reason=f"{why}: preview again", now=now):
            raise _not_pending(_load(request.pk))
        raise Refusal("stale", f"Not approved: {why}. Preview the action again.")
    with transaction.atomic():
        moved = ActionRequest.objects.filter(pk=request.pk, status=A.REQUESTED).update(
            status=A.APPROVED, decided_by=user, decided_at=now, decision_reason=reason, updated_at=now
        )
        if not moved:
            raise _not_pending(_load(request.pk))
        action_event(
            AuditAction.ACTION_APPROVED,
            request,
            call,
            actor,
            reason=reason,
            status=A.APPROVED,
            decided_by=user.get_username(),
        )
        _enqueue_execution(request.pk)
    return _load(request.pk)


def action_reject(*, request_id: int, user, actor: Actor, reason: str) -> ActionRequest:
    """REQUESTED → REJECTED by a second person, with a reason."""
    require_role(user, APPROVE_PERMISSION, "Rejecting an action")
    reason = clean_reason(reason)
    now = timezone.now()
    request = _decidable(request_id, user, actor, "Rejecting an action", now)
    with transaction.atomic():
        moved = ActionRequest.objects.filter(pk=request.pk, status=A.REQUESTED).update(
            status=A.REJECTED, decided_by=user, decided_at=now, decision_reason=reason, updated_at=now
        )
        if not moved:
            raise _not_pending(_load(request.pk))
        action_event(
            AuditAction.ACTION_REJECTED,
            request,
            request.call,
            actor,
            reason=reason,
            status=A.REJECTED,
            decided_by=user.get_username(),
        )
    return _load(request.pk)


def action_withdraw(*, request_id: int, user, actor: Actor, reason: str) -> ActionRequest:
    """REQUESTED → WITHDRAWN by the person who requested it, with a reason, while nobody has decided: of a withdrawal
    and an approval at once, exactly one moves the request (the same conditional UPDATE) and the other is told."""
    reason = clean_reason(reason)
    now = timezone.now()
    request = _load(request_id)
    if request.requested_by_id != user.pk:
        raise Refusal("role", "Only the person who requested this action can withdraw it.")
    if request.status != A.REQUESTED:
        raise _not_pending(request)
    with transaction.atomic():
        moved = ActionRequest.objects.filter(pk=request.pk, status=A.REQUESTED).update(
            status=A.WITHDRAWN, decided_at=now, decision_reason=reason, updated_at=now
        )
        if not moved:
            raise _not_pending(_load(request.pk))
        action_event(AuditAction.ACTION_WITHDRAWN, request, request.call, actor, reason=reason, status=A.WITHDRAWN)
    return _load(request.pk)


# --- periodic: expiry (interrupted executions: recovery.services.action_execution) --------------------------------


def actions_expire_due(*, now: datetime | None = None) -> int:
    """PREVIEWED and REQUESTED requests past their expiry → EXPIRED, each with its audit event; how many."""
    now = now or timezone.now()
    due = ActionRequest.objects.filter(status__in=OPEN, expires_at__lte=now).select_related("call")
    expired = 0
    for request in due.order_by("expires_at")[:SWEEP_LIMIT]:
        why = (
            f"not {'decided' if request.status == A.REQUESTED else 'requested'} before {request.expires_at.isoformat()}"
        )
        expired += _mark(request, request.call, Actor.job("actions-expire"), to=A.EXPIRED, reason=why, now=now)
    return expired

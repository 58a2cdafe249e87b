"""Task lifecycle (docs/design/tasks.md): create, complete with a structured submission, abandon, and the no_submission
flag."""

from __future__ import annotations

import contextlib
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.canonical import canonical_json
from recovery.engine.states import CallState
from recovery.engine.types import FieldError
from recovery.models import Call, Decision, GateDecision, Task, TaskOutcome, TaskStatus, Tenant
from recovery.services.errors import Refusal
from recovery.statemachine.transitions import TransitionConflict, transition_call

S = CallState
IN_DOUBT = {S.UNKNOWN, S.STILL_UNKNOWN, S.ACCEPTED, S.SENT, S.HUMAN_REVIEW, S.COMPENSATING}


def task_create(
    *, tenant: Tenant, external_id: str, agent: str, goal: str, budget: dict, actor: Actor
) -> tuple[Task, bool]:
    """Create the task, or return the existing one for a repeated identical request (same tenant and external id)."""
    fields = {
        "agent": agent,
        "goal": goal,
        "budget": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in budget.items() if v is not None},
        "max_rounds": budget.get("max_rounds"),
        "deadline": budget.get("deadline"),
        "token_budget": budget.get("token_budget"),
    }
    existing = Task.objects.filter(tenant=tenant, external_id=external_id).first()
    if existing is None:
        try:
            with transaction.atomic():
                task = Task.objects.create(
                    tenant=tenant, external_id=external_id, created_by_token_id=actor.token_id, **fields
                )
                append_event(
                    action=AuditAction.TASK_CREATED,
                    actor=actor,
                    task_id=task.pk,
                    reason=goal[:200],
                    evidence={"external_id": external_id, "agent": agent, "budget": fields["budget"]},
                )
            return task, True
        except IntegrityError:
            existing = Task.objects.filter(tenant=tenant, external_id=external_id).first()
            if existing is None:
                raise
    same = (existing.agent, existing.goal, canonical_json(existing.budget)) == (
        agent,
        goal,
        canonical_json(fields["budget"]),
    )
    if not same:
        raise Refusal(
            "task_exists",
            f"task {external_id!r} already exists with another agent, goal or budget",
            status=409,
            field_errors=[
                FieldError(
                    field="external_id",
                    expected="an unused external id for a new task",
                    received=external_id,
                    suggestion="Reuse the existing task or pick a new id.",
                )
            ],
            detail={"existing_task": existing.pk},
        )
    return existing, False


def _degraded(task: Task) -> bool:
    return (
        Decision.objects.filter(call__task=task, route="degrade").exists()
        or GateDecision.objects.filter(call__task=task, reason="breaker_open", allowed=False).exists()
    )


def task_outcome(task: Task) -> str:
    states = set(Call.objects.filter(task=task).values_list("state", flat=True))
    if states & IN_DOUBT:
        return TaskOutcome.COMPLETED_WITH_UNKNOWNS
    if _degraded(task):
        return TaskOutcome.DEGRADED
    if states <= {S.COMMITTED}:
        return TaskOutcome.COMPLETED
    return TaskOutcome.FAILED


def _same_submission(task: Task, summary: str, deliverable: dict | None) -> bool:
    stored = task.submission or {}
    return stored.get("summary") == summary and canonical_json(stored.get("deliverable")) == canonical_json(deliverable)


def task_complete(*, task: Task, summary: str, deliverable: dict | None, actor: Actor) -> Task:
    if task.status != TaskStatus.OPEN:
        if task.status == TaskStatus.SUBMITTED and _same_submission(task, summary, deliverable):
            return task  # a repeated submit (a reply lost on the way back): the stored summary again
        raise Refusal("task_closed", f"the task is already {task.status}", status=409)
    now = timezone.now()
    outcome = task_outcome(task)
    with transaction.atomic():
        updated = Task.objects.filter(pk=task.pk, status=TaskStatus.OPEN).update(
            status=TaskStatus.SUBMITTED,
            outcome=outcome,
            submission={"summary": summary, "deliverable": deliverable},
            closed_at=now,
            updated_at=now,
        )
        if updated != 1:
            raise Refusal("task_closed", "the task was closed by someone else", status=409)
        append_event(
            action=AuditAction.TASK_SUBMITTED,
            actor=actor,
            task_id=task.pk,
            reason=summary[:500],
            evidence={"outcome": outcome},
        )
    task.refresh_from_db()
    return task


def task_abandon(*, task: Task, reason: str, actor: Actor) -> Task:
    """READY and RETRYABLE calls end FAILED_PERMANENT; UNKNOWN ones keep being reconciled (docs/design/tasks.md)."""
    if task.status == TaskStatus.ABANDONED:
        return task
    if task.status != TaskStatus.OPEN:
        raise Refusal("task_closed", f"the task is already {task.status}", status=409)
    now = timezone.now()
    with transaction.atomic():
        updated = Task.objects.filter(pk=task.pk, status=TaskStatus.OPEN).update(
            status=TaskStatus.ABANDONED, outcome=TaskOutcome.ABANDONED, closed_at=now, updated_at=now
        )
        if updated != 1:
            raise Refusal("task_closed", "the task was closed by someone else", status=409)
        for call in Call.objects.filter(task=task, state__in=[S.READY, S.RETRYABLE]).order_by("pk"):
            # A call that moved on meanwhile (e.g. just admitted) is no longer READY/RETRYABLE: nothing to abandon.
            with contextlib.suppress(TransitionConflict):
                transition_call(
                    call, S.FAILED_PERMANENT, actor=actor, reason="task abandoned", changes={"outcome": "abandoned"}
                )
        append_event(
            action=AuditAction.TASK_ABANDONED, actor=actor, task_id=task.pk, reason=reason[:500] or "abandoned"
        )
    task.refresh_from_db()
    return task


def task_flag_no_submission(*, now: datetime, actor: Actor) -> int:
    """Flag OPEN tasks past their deadline with no submission (a periodic job calls this); one audit event each."""
    flagged = 0
    due = Task.objects.filter(status=TaskStatus.OPEN, deadline__lt=now, no_submission=False).values_list(
        "pk", flat=True
    )
    for task_id in list(due[:1000]):
        with transaction.atomic():
            if Task.objects.filter(pk=task_id, status=TaskStatus.OPEN, no_submission=False).update(
                no_submission=True, updated_at=now
            ):
                append_event(
                    action=AuditAction.TASK_NO_SUBMISSION,
                    actor=actor,
                    task_id=task_id,
                    reason="past its deadline without a submission",
                )
                flagged += 1
    return flagged

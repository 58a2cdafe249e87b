"""Aborting a saga (docs/compensation.md, "Sagas"): undo what stands of a task that failed halfway, one entry at a time.
`saga_abort` closes the task and marks the saga running; `saga_advance` takes one step each time it is called, in
reverse dependency order, waiting on steps still settling and stopping at an undo that needs a person.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.states import CallState
from recovery.engine.types import FieldError
from recovery.jobs.queueing import enqueue
from recovery.models import Call, CompensationEntry, Step, Task, TaskOutcome, TaskStatus
from recovery.services.compensations import compensation_start
from recovery.services.errors import Refusal
from recovery.statemachine.transitions import TransitionConflict, transition_call

logger = logging.getLogger("recovery.sagas")

S = CallState
RUNNING, STOPPED, DONE = "running", "stopped", "done"
EXECUTORS = ("console", "runtime")
SETTLING = frozenset({S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.ACCEPTED})
STOPS = frozenset({S.COMPENSATION_FAILED, S.PARTIAL_COMPENSATED, S.HUMAN_REVIEW})
ADVANCE_JOB = "recovery.jobs.tasks.advance_saga"


def _has_compensation(call: Call) -> bool:
    template = call.step.compensation or call.tool.compensation
    return isinstance(template, dict) and bool(template.get("tool"))


def saga_abort(*, task: Task, executor: str, reason: str, actor: Actor) -> Task:
    """Abort the task as a saga; the compensations follow (saga_advance). Refused, changing nothing: a closed or
    already compensating task (409), an unknown executor, or a committed (or maybe committed) write step with no
    compensation (422, one field error per step)."""
    _check_executor(executor)
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        calls = _abortable_calls(task)
        now = timezone.now()
        Task.objects.filter(pk=task.pk).update(
            status=TaskStatus.ABANDONED,
            outcome=TaskOutcome.ABANDONED,
            closed_at=now,
            updated_at=now,
            saga=RUNNING,
            saga_executor=executor,
            saga_requested_at=now,
        )
        for call in calls:
            if call.state in (S.READY, S.RETRYABLE):
                with contextlib.suppress(TransitionConflict):
                    transition_call(
                        call, S.FAILED_PERMANENT, actor=actor, reason="saga aborted", changes={"outcome": "abandoned"}
                    )
        append_event(
            action=AuditAction.TASK_ABANDONED,
            actor=actor,
            task_id=task.pk,
            reason=(reason or "saga aborted")[:500],
            evidence={"saga": RUNNING, "executor": executor},
        )
        enqueue(ADVANCE_JOB, task.pk, job_id=f"saga-{task.pk}-abort")
    task.refresh_from_db()
    return task


def _check_executor(executor: str) -> None:
    if executor not in EXECUTORS:
        raise Refusal(
            "invalid_request",
            "executor must be console or runtime",
            status=422,
            field_errors=[
                FieldError(
                    field="executor",
                    expected="console or runtime",
                    received=executor,
                    suggestion="console: the console's worker sends each undo; runtime: you do.",
                )
            ],
        )


def _abortable_calls(task: Task) -> list[Call]:
    """The locked task's calls; Refusal if its saga was aborted already, it is closed, or a write step that took (or
    may have taken) effect has nothing to undo it."""
    if task.saga:
        raise Refusal("already_compensating", f"the task's saga was already aborted ({task.saga})", status=409)
    if task.status != TaskStatus.OPEN:
        raise Refusal("task_closed", f"the task is {task.status}: there is no saga to abort", status=409)
    calls = list(Call.objects.filter(task=task).select_related("tool", "step").order_by("pk"))
    may_stand = (S.COMMITTED, *SETTLING)
    missing = [c for c in calls if c.side_effect == "write" and c.state in may_stand and not _has_compensation(c)]
    if missing:
        raise Refusal(
            "compensation_unavailable",
            "a step that took (or may have taken) effect has no compensation: nothing can undo it",
            status=422,
            field_errors=[
                FieldError(
                    field=f"steps.{c.step.index}",
                    expected="a compensation for this step (the tool's registry default, or the step's own)",
                    received=c.tool.name,
                    suggestion="Declare the step's compensation when its call is added, or settle it by hand.",
                )
                for c in missing
            ],
        )
    return calls


@dataclass(frozen=True, kw_only=True)
class SagaView:
    """Where a saga stands: its state, what it waits for, the entry to execute next (runtime mode), the step it
    stopped at."""

    state: str  # "" (no saga), running, stopped, done
    executor: str
    waiting_for: tuple[int, ...] = ()  # calls still settling
    next_entry: CompensationEntry | None = None  # open and waiting for its sender
    stopped_at: int | None = None  # the call the chain stopped at


def _order(calls: list[Call]) -> list[Call]:
    """The committed writes left standing, in the order they are undone: reverse dependency order (a step after
    every step that depends on it, directly or not), the highest step first among the free ones."""
    standing = {c.step_id: c for c in calls if c.state == S.COMMITTED and c.side_effect == "write"}
    deps: dict[int, set[int]] = {}
    for step_id, dep_id in Step.depends_on.through.objects.filter(from_step__task_id=calls[0].task_id).values_list(
        "from_step_id", "to_step_id"
    ):
        deps.setdefault(step_id, set()).add(dep_id)

    def depends(a: int, b: int, seen: frozenset = frozenset()) -> bool:  # does step a depend on step b?
        direct = deps.get(a, set())
        return b in direct or any(depends(d, b, seen | {a}) for d in direct if d not in seen)

    ordered, left = [], dict(standing)
    while left:
        free = [c for sid, c in left.items() if not any(depends(other, sid) for other in left if other != sid)]
        nxt = max(free or left.values(), key=lambda c: (c.step.index, c.pk))
        ordered.append(nxt)
        del left[nxt.step_id]
    return ordered


def saga_view(task: Task) -> SagaView:
    calls = list(Call.objects.filter(task=task).select_related("tool", "step").order_by("pk"))
    waiting = tuple(c.pk for c in calls if c.state in SETTLING)
    stopped = next((c.pk for c in calls if c.state in STOPS), None)
    entry = (
        CompensationEntry.objects.select_related("tool", "call__step")
        .filter(call__task=task, state__in=["pending", "not_committed", "sent", "unknown", "review"])
        .first()
    )
    return SagaView(
        state=task.saga, executor=task.saga_executor, waiting_for=waiting, next_entry=entry, stopped_at=stopped
    )


def saga_advance(task_id: int, *, actor: Actor | None = None) -> str:
    """One step of the saga: start the next entry, or say why not (waiting, stopped, done). Safe to call any time,
    from any process: the task's row is locked while it decides, and compensation_start refuses a second entry."""
    actor = actor or Actor.job("saga")
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        if task.saga not in (RUNNING, STOPPED):
            return task.saga
        calls = list(Call.objects.filter(task=task).select_related("tool__provider", "step", "task").order_by("pk"))
        if any(c.state in STOPS for c in calls):
            if task.saga != STOPPED:
                _set(task, STOPPED, actor, "an entry failed, undid only part, or a step waits for a person")
            return STOPPED
        if task.saga == STOPPED:  # a person settled what stopped it: the chain goes on
            _set(task, RUNNING, actor, "resumed: what stopped the chain was settled")
        if any(c.state in SETTLING or c.state == S.COMPENSATING for c in calls):
            return RUNNING  # a step is settling or an entry is under way: one at a time
        ordered = _order(calls) if calls else []
        if not ordered:
            undone = any(c.state == S.COMPENSATED for c in calls)
            _set(task, DONE, actor, "nothing left standing", outcome=TaskOutcome.COMPENSATED if undone else None)
            return DONE
        nxt = ordered[0]
        try:
            with transaction.atomic():
                compensation_start(nxt, actor=actor, send=task.saga_executor == "console", executor=task.saga_executor)
        except Refusal as exc:  # its undo cannot even be made (a template needing a value the call lacks)
            _set(task, STOPPED, actor, f"step {nxt.step.index} cannot be undone: {exc.message}")
            return STOPPED
        return RUNNING


def _set(task: Task, state: str, actor: Actor, why: str, *, outcome: str | None = None) -> None:
    changes = {"saga": state, "updated_at": timezone.now()}
    if outcome:
        changes["outcome"] = outcome
    Task.objects.filter(pk=task.pk).update(**changes)
    append_event(
        action=AuditAction.TASK_SAGA,
        actor=actor,
        task_id=task.pk,
        reason=f"saga {state}: {why}",
        evidence={"saga": state, "outcome": outcome or task.outcome},
    )


def sagas_running() -> list[int]:
    """The tasks whose saga is running (the reconcile schedule advances them)."""
    return list(Task.objects.filter(saga=RUNNING).order_by("pk").values_list("pk", flat=True)[:500])


def sagas_advance_due(*, actor: Actor | None = None) -> int:
    """Periodic: advance every running saga once; how many started an entry or ended."""
    moved = 0
    for task_id in sagas_running():
        try:
            before = CompensationEntry.objects.filter(call__task_id=task_id).count()
            state = saga_advance(task_id, actor=actor)
            moved += state != RUNNING or CompensationEntry.objects.filter(call__task_id=task_id).count() > before
        except Exception:
            logger.exception("saga of task %s could not advance", task_id)
    return moved

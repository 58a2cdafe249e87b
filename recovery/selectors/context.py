"""Reads that turn rows into the engine's views (CallView, TaskView, GateContext), a fixed number of queries each."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Q

from recovery.engine.budgets import tighter
from recovery.engine.states import UNSETTLED, CallState
from recovery.engine.types import Budgets, CallView, GateContext, PreviousAttempt, TaskView, ToolPolicy
from recovery.models import ActionRequest, ActionStatus, Attempt, Call, Receipt, Step, Task, Tool
from recovery.selectors.breakers import breaker_view, breaker_view_of


def task_budgets(task: Task) -> Budgets:
    budget = task.budget or {}
    return Budgets(
        max_attempts=budget.get("max_attempts"),
        max_rounds=task.max_rounds,
        deadline=task.deadline,
        token_budget=task.token_budget,
        write_retry=budget.get("write_retry"),
        unknown_budget=budget.get("unknown_budget"),
        max_business_effects=budget.get("max_business_effects"),
    )


def task_view(task: Task, *, unsettled: int | None = None, compensating: int | None = None) -> TaskView:
    """The task as the gate sees it. `unsettled`: how many of its calls are unsettled, when the caller read it with
    the call (selectors.tasks_calls.call_for_attempt); none means no per-tool count to read."""
    by_tool: dict[str, int] = {}
    limits: dict[str, int | None] = {}
    if unsettled is None or unsettled > 0:
        counted = (
            Call.objects.filter(task=task, state__in=UNSETTLED)
            .order_by()
            .values_list("tool__name", "tool__budgets")
            .annotate(n=Count("pk"))
        )
        for name, budgets, count in counted:
            by_tool[name] = by_tool.get(name, 0) + count
            limits[name] = (budgets or {}).get("unknown_budget")
    return TaskView(
        rounds_used=task.rounds_used,
        tokens_used=task.tokens_used,
        write_retries_used=task.write_retries_used,
        unsettled_unknowns=sum(by_tool.values()),
        unsettled_by_tool=by_tool,
        unknown_budget_by_tool=limits,
        compensating=(
            Call.objects.filter(task=task, state=CallState.COMPENSATING).count()
            if compensating is None
            else compensating
        ),
        budgets=task_budgets(task),
    )


def task_view_for_decision(task: Task, counters) -> TaskView:
    """The task as decide() reads it after an outcome: its counters as the outcome's transaction left them (and its
    budgets). decide() never reads the unsettled counts, which are the gate's: none are read for it."""
    return TaskView(
        rounds_used=counters.rounds_used,
        tokens_used=counters.tokens_used,
        write_retries_used=counters.write_retries_used,
        budgets=task_budgets(task),
    )


def call_view(call: Call, tool: ToolPolicy, task: Task, first_sent_at: datetime | None) -> CallView:
    max_attempts = tighter(tool.budgets, task_budgets(task)).max_attempts
    return CallView(
        call_id=str(call.pk),
        tool=tool.name,
        state=call.state,
        idempotency_key=call.idempotency_key,
        fingerprint=call.fingerprint,
        attempts_made=call.attempts_count,
        max_attempts=max_attempts,
        first_sent_at=first_sent_at,
    )


def previous_attempt(attempt: Attempt | None) -> PreviousAttempt | None:
    if attempt is None:
        return None
    failure = attempt.failure or {}
    decision = getattr(attempt, "decision", None)
    return PreviousAttempt(
        number=attempt.number,
        tool=attempt.tool.name,
        fingerprint=attempt.fingerprint,
        credential_version=attempt.credential_version,
        failure_class=attempt.failure_class or None,
        phase=failure.get("phase"),
        side_effect=failure.get("side_effect"),
        # An attempt swept to UNKNOWN was never reported: when it was sent is the moment a later receipt must follow.
        finished_at=attempt.reported_at or attempt.admitted_at,
        wait_ms=decision.delay_ms if decision is not None else 0,
    )


def gate_context(
    call: Call,
    *,
    tool: ToolPolicy,
    candidate_tool: ToolPolicy | None,
    executing_tool: Tool,
    task: Task,
    now: datetime,
    approval: bool,
) -> tuple[GateContext, CallView]:
    """What admission knows besides the candidate. A call read by selectors.tasks_calls.call_for_attempt brings
    most of it along (its latest receipt, whether its dependencies have calls, its task's unsettled count, its
    tool's breaker row), so a first attempt of a call without dependencies reads nothing more; any other call
    is read here, a fixed number of queries."""
    # attempts_count is written with every attempt, in its transaction: a call read with none has none to read.
    last = call.attempts.select_related("tool", "decision").order_by("-number").first() if call.attempts_count else None
    first_sent_at = call.first_sent_at()
    read = hasattr(call, "latest_receipt_at")  # read with call_for_attempt's annotations
    dependencies = {}
    if not read or call.has_dependency_calls:
        steps = Step.depends_on.through.objects.filter(from_step_id=call.step_id).values("to_step_id")
        dependencies = {
            str(pk): state for pk, state in Call.objects.filter(step_id__in=steps).values_list("pk", "state")
        }
    if read:
        latest_receipt, latest_receipt_at = call.latest_receipt_observed, call.latest_receipt_at
    else:
        latest = Receipt.objects.filter(call=call).order_by("-checked_at").values_list("observed", "checked_at")
        latest_receipt, latest_receipt_at = latest.first() or (None, None)
    # The breaker of the tool the attempt will call: the call's own came with it (a reverse one-to-one, absent
    # until the breaker first opens).
    if read and executing_tool.pk == call.tool_id:
        breaker = breaker_view_of(executing_tool, getattr(call.tool, "breaker_row", None), now=now)
    else:
        breaker = breaker_view(executing_tool, now=now)
    context = GateContext(
        now=now,
        tool=tool,
        candidate_tool=candidate_tool,
        previous=previous_attempt(last),
        dependencies=dependencies,
        latest_receipt=latest_receipt,
        latest_receipt_at=latest_receipt_at,
        approval_available=approval,
        task=task_view(
            task,
            unsettled=call.unsettled_in_task if read else None,
            compensating=call.compensating_in_task if read else None,
        ),
        breaker=breaker,
    )
    return context, call_view(call, tool, task, first_sent_at)


# A replay's own attempt id names its action request, so its approval admits that attempt and no other.
ACTION_ATTEMPT_PREFIX = "action-"


def action_attempt_id(request_id: int) -> str:
    return f"{ACTION_ATTEMPT_PREFIX}{request_id}"


def approval_for(call: Call, *, attempt_id: str) -> list[int]:
    """The action requests that allow this attempt of `call` one admission on `approval_granted` now
    (docs/design/gate.md), the attempt's own replay first.

    An EXECUTED grant_approval not used yet, while the call is still at the version its execution left it at (one
    past the version it was approved for: only the grant itself moved it); or, for the attempt a replay makes
    ("action-<request id>"), that EXECUTING replay_same_key request, while the call is still at the version it was
    approved for. Binding to the version keeps an approval to one moment of the call: once anything else moved it
    (another admission, a receipt), the approval is void. The one admission that uses it marks it used
    (recovery.services.attempts._use_approval), in its own transaction, by a conditional UPDATE.
    """
    allowing = Q(action="grant_approval", status=ActionStatus.EXECUTED, call_version=call.version - 1)
    number = attempt_id.removeprefix(ACTION_ATTEMPT_PREFIX)
    own = int(number) if attempt_id.startswith(ACTION_ATTEMPT_PREFIX) and number.isdigit() else None
    if own is not None:
        executing = Q(action="replay_same_key", status=ActionStatus.EXECUTING, call_version=call.version)
        allowing |= Q(executing, pk=own)
    found = ActionRequest.objects.filter(allowing, call_id=call.pk, approval_used_at__isnull=True)
    ids = list(found.order_by("pk").values_list("pk", flat=True))
    return sorted(ids, key=lambda pk: pk != own)  # the attempt's own replay first

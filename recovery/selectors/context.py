"""Reads that turn rows into the engine's views (CallView, TaskView, GateContext), a fixed number of queries each."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q

from recovery.engine.budgets import tighter
from recovery.engine.states import UNSETTLED, CallState
from recovery.engine.types import Budgets, CallView, GateContext, PreviousAttempt, TaskView, ToolPolicy
from recovery.models import ActionRequest, ActionStatus, Attempt, Breaker, Call, Receipt, Step, Task, Tool
from recovery.models import Decision as DecisionRow
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


@dataclass(frozen=True, kw_only=True)
class AdmissionRead:
    """What the call's admission read (recovery.statemachine.hot_path.call_for_attempt) brought along with the call,
    handed to admission explicitly: with it, gate_context reads only what these say there is to read."""

    stored_attempt_pk: int | None  # the call's attempt under the attempt id asked about
    latest_receipt_observed: str | None
    latest_receipt_at: datetime | None
    has_dependency_calls: bool
    unsettled_in_task: int
    tool_has_alternates: bool
    compensating_in_task: int
    breaker_row: Breaker | None  # the call's tool's (None: it never opened)
    # A first admission in the request that registered the call (recovery.statemachine.hot_path.first_admission_read)
    # reads two things more in the same statement: the task's 2xx reports since its last admission, as
    # hot_reads.reported_2xx_since_last_admission answers them, and the keys its attempt and gate answer will have
    # (attempt, gate decision), so that both rows go in at once with the stored answer. None: not read.
    reported: list[tuple[int, str, dict | None, dict | None]] | None = None
    reserved_ids: tuple[int, int] | None = None


def task_view(task: Task, *, unsettled: int | None = None, compensating: int | None = None) -> TaskView:
    """The task as the gate sees it. `unsettled`: how many of its calls are unsettled, when the caller read it with
    the call (AdmissionRead); none means no per-tool count to read."""
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
    try:
        decision = attempt.decision
    except DecisionRow.DoesNotExist:  # a reverse one-to-one: an attempt without a decision card has none
        decision = None
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
    read: AdmissionRead | None = None,
) -> tuple[GateContext, CallView]:
    """What admission knows besides the candidate. `read`: what the call's admission read brought along (its latest
    receipt, whether its dependencies have calls, its task's counts, its tool's breaker row), so a first attempt of
    a call without dependencies reads nothing more; None: all of it is read here, a fixed number of queries."""
    # attempts_count is written with every attempt, in its transaction: a call read with none has none to read.
    last = call.attempts.select_related("tool", "decision").order_by("-number").first() if call.attempts_count else None
    first_sent_at = call.first_sent_at()
    dependencies = _dependencies(call) if read is None or read.has_dependency_calls else {}
    latest_receipt, latest_receipt_at = _latest_receipt(call, read)
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
            unsettled=read.unsettled_in_task if read else None,
            compensating=read.compensating_in_task if read else None,
        ),
        breaker=_breaker(call, executing_tool, read, now),
    )
    return context, call_view(call, tool, task, first_sent_at)


def _dependencies(call: Call) -> dict[str, str]:
    """The states of the calls of the call's dependency steps, by call id."""
    steps = Step.depends_on.through.objects.filter(from_step_id=call.step_id).values("to_step_id")
    return {str(pk): state for pk, state in Call.objects.filter(step_id__in=steps).values_list("pk", "state")}


def _latest_receipt(call: Call, read: AdmissionRead | None) -> tuple[str | None, datetime | None]:
    if read is not None:
        return read.latest_receipt_observed, read.latest_receipt_at
    latest = Receipt.objects.filter(call=call).order_by("-checked_at").values_list("observed", "checked_at")
    return latest.first() or (None, None)


def _breaker(call: Call, executing_tool: Tool, read: AdmissionRead | None, now: datetime):
    """The breaker of the tool the attempt will call: the call's own tool's row came with the read."""
    if read is not None and executing_tool.pk == call.tool_id:
        return breaker_view_of(executing_tool, read.breaker_row, now=now)
    return breaker_view(executing_tool, now=now)


# A replay's own attempt id names its action request, so its approval admits that attempt and no other.
ACTION_ATTEMPT_PREFIX = "action-"
ATTEMPTING_ACTIONS = ("replay_same_key", "execute_held")  # the actions whose execution makes an attempt itself


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
        # A same-key replay, or a held MCP call's first execution (docs/mcp-gateway.md): the attempt the request makes.
        executing = Q(action__in=ATTEMPTING_ACTIONS, status=ActionStatus.EXECUTING, call_version=call.version)
        allowing |= Q(executing, pk=own)
    found = ActionRequest.objects.filter(allowing, call_id=call.pk, approval_used_at__isnull=True)
    ids = list(found.order_by("pk").values_list("pk", flat=True))
    return sorted(ids, key=lambda pk: pk != own)  # the attempt's own replay first

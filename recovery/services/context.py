"""Reads that turn rows into the engine's views (CallView, TaskView, GateContext), a fixed number of queries each."""

from __future__ import annotations

import json
from datetime import datetime

from django.db import connection
from django.db.models import Q

from recovery import rows
from recovery.engine.budgets import tighter
from recovery.engine.types import Budgets, CallView, GateContext, PreviousAttempt, TaskView, ToolPolicy
from recovery.models import ActionRequest, ActionStatus, Attempt, Call, Receipt, Step, Task, Tool
from recovery.services.breakers import breaker_view
from recovery.states import UNSETTLED


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


_UNSETTLED_STATES = sorted(UNSETTLED)
# Raw SQL: the statement Call.objects.filter(task=..., state__in=UNSETTLED).values("tool__name", "tool__budgets")
# .annotate(n=Count("id")) makes, without the ORM building it anew on every admission and outcome (the hot path).
_UNSETTLED_BY_TOOL = (
    f"SELECT t.name, t.budgets, COUNT(c.id) FROM {Call._meta.db_table} c "
    f"JOIN {Tool._meta.db_table} t ON c.tool_id = t.id "
    f"WHERE c.task_id = %s AND c.state IN ({', '.join(['%s'] * len(_UNSETTLED_STATES))}) GROUP BY t.name, t.budgets"
)


def task_view(task: Task) -> TaskView:
    with connection.cursor() as cursor:
        cursor.execute(_UNSETTLED_BY_TOOL, [task.pk, *_UNSETTLED_STATES])
        rows = cursor.fetchall()
    by_tool: dict[str, int] = {}
    limits: dict[str, int | None] = {}
    for name, budgets, count in rows:
        budgets = json.loads(budgets) if isinstance(budgets, str) else budgets  # JSONField's from_db_value
        by_tool[name] = by_tool.get(name, 0) + count
        limits[name] = (budgets or {}).get("unknown_budget")
    return TaskView(
        rounds_used=task.rounds_used,
        tokens_used=task.tokens_used,
        write_retries_used=task.write_retries_used,
        unsettled_unknowns=sum(by_tool.values()),
        unsettled_by_tool=by_tool,
        unknown_budget_by_tool=limits,
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


# Raw SQL generated once, like task_view's: gate_context runs on every admission.
_DEPENDENCY_STATES = (
    f"SELECT c.id, c.state FROM {Call._meta.db_table} c WHERE c.step_id IN "
    f"(SELECT d.to_step_id FROM {Step.depends_on.through._meta.db_table} d WHERE d.from_step_id = %s)"
)
_RECEIPT_FIELDS = ("observed", "checked_at")
_LATEST_RECEIPT = (
    f"SELECT r.observed, r.checked_at FROM {Receipt._meta.db_table} r WHERE r.call_id = %s "
    "ORDER BY r.checked_at DESC LIMIT 1"
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
    # attempts_count is written with every attempt, in its transaction: a call read with none has none to read.
    last = call.attempts.select_related("tool", "decision").order_by("-number").first() if call.attempts_count else None
    first_sent_at = (
        call.attempts.filter(number=1).values_list("admitted_at", flat=True).first() if call.attempts_count else None
    )
    with connection.cursor() as cursor:
        cursor.execute(_DEPENDENCY_STATES, [call.step_id])
        dependencies = {str(pk): state for pk, state in cursor.fetchall()}
        cursor.execute(_LATEST_RECEIPT, [call.pk])
        receipt = cursor.fetchone()
    latest_receipt, latest_receipt_at = rows.convert(Receipt, _RECEIPT_FIELDS, receipt) if receipt else (None, None)
    breaker = breaker_view(executing_tool, now=now)  # the breaker of the tool the attempt will call
    context = GateContext(
        now=now,
        tool=tool,
        candidate_tool=candidate_tool,
        previous=previous_attempt(last),
        dependencies=dependencies,
        latest_receipt=latest_receipt,
        latest_receipt_at=latest_receipt_at,
        approval_available=approval,
        task=task_view(task),
        breaker=breaker,
    )
    return context, call_view(call, tool, task, first_sent_at)


# A replay's own attempt id names its action request, so its approval admits that attempt and no other.
ACTION_ATTEMPT_PREFIX = "action-"


def action_attempt_id(request_id: int) -> str:
    return f"{ACTION_ATTEMPT_PREFIX}{request_id}"


def approval_for(call: Call, *, attempt_id: str) -> list[int]:
    """The action requests that allow this attempt of `call` one admission on `approval_granted` now (SPEC §5),
    the attempt's own replay first.

    An EXECUTED grant_approval not used yet, while the call is still at the version its execution left it at (one
    past the version it was approved for: only the grant itself moved it); or, for the attempt a replay makes
    ("action-<request id>"), that EXECUTING replay_same_key request, while the call is still at the version it was
    approved for. Binding to the version keeps an approval to one moment of the call: once anything else moved it
    (another admission, a receipt), the approval is void. The one admission that uses it marks it used
    (ingest._use_approval), in its own transaction, by a conditional UPDATE.
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

"""Reads of one task or one call for the API (GET /tasks/{id}, GET /calls/{id}): a fixed number of queries each."""

from __future__ import annotations

from collections.abc import Collection

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from recovery.engine.states import UNSETTLED, CallState
from recovery.models import Attempt, Call, Receipt, Step, Task, TaskStatus, Tenant, Tool
from recovery.registry import with_alternates
from recovery.selectors.compensations import effect_story, past, task_compensations
from recovery.selectors.facts import shown_facts

S = CallState


def _in_tenants(call_id: int, tenant_ids: Collection[int]):
    low, high = connection.ops.integer_field_range("BigAutoField")
    if not tenant_ids or not low <= call_id <= high:
        return None  # what the ORM answers for an id no column can hold: nothing, not an error
    return Call.objects.select_related("tool__provider", "task__tenant", "step").filter(
        pk=call_id, tenant_id__in=tenant_ids
    )


def call_in_tenants(call_id: int, tenant_ids: Collection[int]) -> Call | None:
    """The call if it belongs to one of `tenant_ids`, with its tool (and provider), task (and tenant) and step."""
    calls = _in_tenants(call_id, tenant_ids)
    return calls.first() if calls is not None else None


def attempt_in_tenants(call_id: int, attempt_id: str, tenant_ids: Collection[int]) -> Attempt | None:
    """The call's attempt `attempt_id` with its tool (and provider) and its call, if the call belongs to one of
    `tenant_ids`: what reporting an outcome reads, in one statement."""
    low, high = connection.ops.integer_field_range("BigAutoField")
    if not tenant_ids or not low <= call_id <= high:
        return None
    attempts = Attempt.objects.select_related("tool__provider", "call").annotate(
        tool_has_alternates=Exists(Tool.alternates.through.objects.filter(from_tool_id=OuterRef("tool_id")))
    )
    attempt = attempts.filter(call_id=call_id, call__tenant_id__in=tenant_ids, attempt_id=attempt_id).first()
    if attempt is not None and not attempt.tool_has_alternates:
        with_alternates(attempt.tool, none=True)  # nothing to read for its policy
    return attempt


def call_for_attempt(call_id: int, tenant_ids: Collection[int], *, attempt_id: str) -> Call | None:
    """call_in_tenants() with what admitting `attempt_id` reads besides, in the same statement
    (docs/design/quality-targets.md: the single-shot attempt in at most 15 statements): whether the call has that
    attempt already, its latest receipt, whether its dependency steps have calls, how many calls of its task are
    unsettled, whether its tool has alternates (its policy's, read later only if it does), and its tool's breaker row.
    recovery.selectors.context.gate_context reads what is left only when these say there is something to read."""
    calls = _in_tenants(call_id, tenant_ids)
    if calls is None:
        return None
    receipts = Receipt.objects.filter(call=OuterRef("pk")).order_by("-checked_at")
    # Two levels down: the dependency steps of the call the outermost query reads.
    dependency_steps = Step.depends_on.through.objects.filter(from_step_id=OuterRef(OuterRef("step_id")))
    dependency_steps = dependency_steps.values("to_step_id")
    unsettled = (
        Call.objects.filter(task_id=OuterRef("task_id"), state__in=UNSETTLED)
        .order_by()
        .values("task_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    alternates = Tool.alternates.through.objects.filter(from_tool_id=OuterRef("tool_id"))
    compensating = (
        Call.objects.filter(task_id=OuterRef("task_id"), state=S.COMPENSATING)
        .order_by()
        .values("task_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    call = (
        calls.select_related("tool__breaker_row")
        .annotate(
            stored_attempt_pk=Subquery(
                Attempt.objects.filter(call=OuterRef("pk"), attempt_id=attempt_id).values("pk")[:1]
            ),
            latest_receipt_observed=Subquery(receipts.values("observed")[:1]),
            latest_receipt_at=Subquery(receipts.values("checked_at")[:1]),
            has_dependency_calls=Exists(Call.objects.filter(step_id__in=dependency_steps)),
            unsettled_in_task=Coalesce(Subquery(unsettled), 0),
            tool_has_alternates=Exists(alternates),
            compensating_in_task=Coalesce(Subquery(compensating), 0),
        )
        .first()
    )
    if call is not None and not call.tool_has_alternates:
        with_alternates(call.tool, none=True)  # nothing to read for its policy
    return call


def allowed_tools(tenant: Tenant) -> list[Tool]:
    """The tenant's capabilities, by name, with their providers."""
    tools = Tool.objects.order_by("name") if tenant.all_tools else tenant.tools.order_by("name")
    return list(tools.select_related("provider"))


def allowed_tool(tenant: Tenant, name: str) -> Tool | None:
    """The tenant's capability `name` with its provider, and whether it has alternates, in one statement (None: not
    one of its capabilities; allowed_tools() lists them)."""
    tools = Tool.objects if tenant.all_tools else tenant.tools
    tools = tools.select_related("provider").annotate(
        has_alternates=Exists(Tool.alternates.through.objects.filter(from_tool_id=OuterRef("pk")))
    )
    tool = tools.filter(name=name).first()
    if tool is not None and not tool.has_alternates:
        with_alternates(tool, none=True)  # nothing to read for its policy
    return tool


def blocking(call: Call) -> tuple[list[int], list[int]]:
    """What admission waits for before it lets `call` go (the gate's dependency check): the calls of its step's
    dependencies that are not COMMITTED, and the indexes of the dependency steps those calls are in or that have no
    call yet. One query."""
    rows = Step.objects.filter(dependents=call.step_id).values_list("index", "calls__pk", "calls__state")
    calls, steps = set(), set()
    for index, pk, state in rows:
        if pk is None or state != S.COMMITTED:
            steps.add(index)
        if pk is not None and state != S.COMMITTED:
            calls.add(pk)
    return sorted(calls), sorted(steps)


def _call_brief(call: Call) -> dict:
    return {
        "call_id": call.pk,
        "step": call.step.index,
        "tool": call.tool.name,
        "state": call.state,
        "idempotency_key": call.idempotency_key,
        "provider_ref": call.provider_ref,
        "outcome": call.outcome,
    }


def step_states(steps: list[Step], calls: list[Call]) -> dict[int, str]:
    """A step is COMMITTED when one of its calls committed, else the state of its latest call (PENDING: none)."""
    by_step: dict[int, list[Call]] = {}
    for call in calls:
        by_step.setdefault(call.step_id, []).append(call)
    states = {}
    for step in steps:
        own = sorted(by_step.get(step.pk, []), key=lambda c: c.pk)
        if any(c.state == S.COMMITTED for c in own):
            states[step.pk] = S.COMMITTED
        else:
            states[step.pk] = own[-1].state if own else "PENDING"
    return states


# The task answer's groups of calls, in the order it lists them, and the group of each state (any other state: the
# effect was compensated).
GROUPS = (
    "done",
    "accepted_in_progress",
    "unknown",
    "needs_review",
    "not_executed",
    "in_flight",
    "pending",
    "compensated",
)
GROUP_OF_STATE = {
    S.COMMITTED: "done",
    S.ACCEPTED: "accepted_in_progress",
    S.UNKNOWN: "unknown",
    S.STILL_UNKNOWN: "unknown",
    S.HUMAN_REVIEW: "needs_review",
    S.FAILED_PERMANENT: "not_executed",
    S.NOT_COMMITTED: "not_executed",
    S.SENT: "in_flight",
    S.READY: "pending",
    S.RETRYABLE: "pending",
}


def _steps_json(steps: list[Step], calls: list[Call], undone: dict) -> tuple[list[dict], list[int]]:
    """Each step as the task answer shows it, and the indexes of the steps blocked by an uncommitted dependency."""
    states = step_states(steps, calls)
    steps_json, blocked = [], []
    for step in steps:
        deps = sorted(dep.index for dep in step.depends_on.all())
        waiting = sorted(dep.index for dep in step.depends_on.all() if states[dep.pk] != S.COMMITTED)
        if waiting and states[step.pk] != S.COMMITTED:
            blocked.append(step.index)
        own = [c for c in calls if c.step_id == step.pk]
        steps_json.append(
            {
                "index": step.index,
                "name": step.name,
                "depends_on": deps,
                "state": states[step.pk],
                "blocked_by_steps": waiting,
                "calls": [c.pk for c in own],
                "effect": _step_effect(own, undone),
            }
        )
    return steps_json, blocked


def task_summary(task: Task, *, with_facts: bool = False) -> dict:
    """docs/design/tasks.md: confirmed facts, unknown facts, what was not executed, blocked steps and the next action.
    With `with_facts` (the task page) each call's brief also holds its `facts` (recovery.selectors.facts): what every
    page states of the call, read from the rows already loaded."""
    now = timezone.now()
    steps = list(Step.objects.filter(task=task).prefetch_related("depends_on").order_by("index"))
    calls = list(Call.objects.filter(task=task).select_related("tool", "step").order_by("pk"))
    steps_json, blocked = _steps_json(steps, calls, task_compensations(task.pk))
    groups = {group: [] for group in GROUPS}
    for call in calls:
        brief = _call_brief(call)
        if with_facts:
            brief["facts"] = shown_facts(call)
        groups[GROUP_OF_STATE.get(call.state, "compensated")].append(brief)
    no_submission = task.no_submission or (
        task.status == TaskStatus.OPEN and task.deadline is not None and task.deadline < now
    )
    return {
        "id": task.pk,
        "tenant": task.tenant.name,
        "external_id": task.external_id,
        "agent": task.agent,
        "goal": task.goal,
        "status": task.status,
        "outcome": task.outcome or None,
        "no_submission": no_submission,
        "budget": {
            "max_rounds": task.max_rounds,
            "rounds_used": task.rounds_used,
            "deadline": task.deadline.isoformat() if task.deadline else None,
            "token_budget": task.token_budget,
            "tokens_used": task.tokens_used,
            "write_retries_used": task.write_retries_used,
            "limits": task.budget,
        },
        "steps": steps_json,
        "blocked_steps": blocked,
        **groups,
        "next_action": _next_action(task, groups, blocked, no_submission),
        "submission": task.submission,
        "saga": task.saga or None,
    }


def _step_effect(calls: list[Call], undone: dict) -> str:
    """What became of a step's effect, in words: "created", "created, then cancelled", "not executed", "unknown"...
    (a compensated effect is never "never created")."""
    for call in calls:
        story = effect_story(
            call_state=call.state,
            forward_tool=call.tool.name,
            target=call.provider_ref,
            entries=undone.get(call.pk, []),
        )
        if story is not None:
            return story.headline
    if any(c.state == S.COMMITTED for c in calls):
        done = next(c for c in calls if c.state == S.COMMITTED)
        return (past(done.tool.name) or "committed") if done.side_effect == "write" else "read"
    if any(c.state in (S.UNKNOWN, S.STILL_UNKNOWN, S.ACCEPTED, S.SENT) for c in calls):
        return "unknown: being settled"
    if calls and all(c.state in (S.FAILED_PERMANENT, S.NOT_COMMITTED) for c in calls):
        return "not executed"
    return "pending" if calls else "no call yet"


def _next_action(task: Task, groups: dict, blocked: list[int], no_submission: bool) -> str:
    # An aborted saga's undos come first, open task or closed: being sent, or stopped for a person.
    if task.saga == "stopped":
        return "wait_for_compensation_review"
    if task.saga == "running":
        return "wait_for_compensation"
    if task.status != TaskStatus.OPEN:
        return "none: the task is closed" if not groups["unknown"] else "wait_for_reconcile"
    if groups["needs_review"]:
        return "wait_for_human_review"
    if groups["unknown"] or groups["accepted_in_progress"]:
        return "wait_for_reconcile"
    if blocked:
        return "wait_for_dependencies"
    if groups["pending"] or groups["in_flight"]:
        return "continue"
    if no_submission:
        return "submit_or_abandon (past the deadline)"
    return "submit"


def call_detail(call: Call) -> dict:
    """GET /calls/{id}: the call with its attempts, decisions, gate answers, receipts and compensation entries (6
    queries)."""
    attempts = list(call.attempts.select_related("tool").order_by("number"))
    compensations = list(call.compensations.select_related("tool").order_by("number"))
    decisions = {d.attempt_id: d for d in call.decisions.all()}
    gates = list(call.gate_decisions.order_by("pk"))
    receipts = list(call.receipts.order_by("pk"))
    latest = decisions.get(attempts[-1].pk) if attempts else None
    return {
        "id": call.pk,
        "task_id": call.task_id,
        "step": call.step.index,
        "tool": call.tool.name,
        "side_effect": call.side_effect,
        "state": call.state,
        "version": call.version,
        "state_changed_at": call.state_changed_at.isoformat(),
        "outcome": call.outcome or None,
        "idempotency_key": call.idempotency_key,
        "arguments": call.arguments,
        "provider_ref": call.provider_ref or None,
        "observed": call.observed,
        "attempts_made": call.attempts_count,
        "max_attempts": call.max_attempts,
        "checks_made": call.checks_made,
        "next_check_at": call.next_check_at.isoformat() if call.next_check_at else None,
        "attempts": [_attempt_json(a, decisions) for a in attempts],
        "latest_decision": latest.card if latest else None,
        "gate_decisions": [_gate_json(g) for g in gates],
        "receipts": [_receipt_json(r) for r in receipts],
        "compensations": [_compensation_json(c) for c in compensations],
    }


def _attempt_json(a, decisions: dict) -> dict:
    return {
        "attempt_id": a.attempt_id,
        "number": a.number,
        "tool": a.tool.name,
        "policy_bypassed": a.policy_bypassed,
        "admitted_at": a.admitted_at.isoformat() if a.admitted_at else None,
        "reported_at": a.reported_at.isoformat() if a.reported_at else None,
        "http_status": a.http_status,
        "error_kind": a.error_kind or None,
        "failure_class": a.failure_class or None,
        "decision": decisions[a.pk].card | {"id": decisions[a.pk].pk} if a.pk in decisions else None,
    }


def _gate_json(g) -> dict:
    return {
        "id": g.pk,
        "allowed": g.allowed,
        "reason": g.reason,
        "evidence_used": g.evidence_used,
        "dry_run": g.dry_run,
        "required_next": g.required_next or None,
        "created_at": g.created_at.isoformat(),
    }


def _receipt_json(r) -> dict:
    return {
        "id": r.pk,
        "source": r.source,
        "observed": r.observed,
        "provider_status": r.provider_status,
        "provider_ref": r.provider_ref or None,
        "applied": r.applied,
        "checked_at": r.checked_at.isoformat(),
        "local_state_before": r.local_state_before,
        "local_state_after": r.local_state_after,
    }


def _compensation_json(c) -> dict:
    return {
        "compensation_id": c.compensation_id,
        "number": c.number,
        "tool": c.tool.name,
        "idempotency_key": c.idempotency_key,
        "state": c.state,
        "target": c.target,
        "expected_effect": c.expected_effect,
        "attempts_made": c.attempts_count,
        "max_attempts": c.max_attempts,
        "checks_made": c.checks_made,
        "provider_ref": c.provider_ref or None,
        "outcome": c.outcome or None,
        "state_changed_at": c.state_changed_at.isoformat(),
    }

"""Reads for the API and the pages, each a fixed number of queries whatever the size of the task or call."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from recovery import rows
from recovery.models import Call, Provider, Step, Task, TaskStatus, Tenant, Tool
from recovery.states import CallState

S = CallState


_CALL_JOINED = ((Call, "c"), (Tool, "t"), (Provider, "p"), (Task, "k"), (Tenant, "n"), (Step, "s"))


@cache
def _call_in_tenants_sql(tenants: int) -> str:
    columns = ", ".join(rows.select_list(model, alias) for model, alias in _CALL_JOINED)
    return (
        f"SELECT {columns} FROM {Call._meta.db_table} c "
        f"JOIN {Tool._meta.db_table} t ON c.tool_id = t.id JOIN {Provider._meta.db_table} p ON t.provider_id = p.id "
        f"JOIN {Task._meta.db_table} k ON c.task_id = k.id JOIN {Tenant._meta.db_table} n ON k.tenant_id = n.id "
        f"JOIN {Step._meta.db_table} s ON c.step_id = s.id "
        f"WHERE c.id = %s AND c.tenant_id IN ({', '.join(['%s'] * tenants)})"
    )


def call_in_tenants(call_id: int, tenant_ids: Collection[int]) -> Call | None:
    """The call if it belongs to one of `tenant_ids`, with its tool (and provider), task (and tenant) and step
    loaded as select_related() loads them: one statement, generated once (the API reads a call on every request)."""
    low, high = connection.ops.integer_field_range("BigAutoField")
    if not tenant_ids or not low <= call_id <= high:
        return None  # what the ORM answers for an id no column can hold: nothing, not an error
    with connection.cursor() as cursor:
        cursor.execute(_call_in_tenants_sql(len(tenant_ids)), [call_id, *sorted(tenant_ids)])
        row = cursor.fetchone()
    if row is None:
        return None
    call, at = rows.load(Call, row)
    tool, at = rows.load(Tool, row, at)
    provider, at = rows.load(Provider, row, at)
    task, at = rows.load(Task, row, at)
    tenant, at = rows.load(Tenant, row, at)
    step, _ = rows.load(Step, row, at)
    rows.attach(tool, "provider", provider)
    rows.attach(task, "tenant", tenant)
    for name, related in (("tool", tool), ("task", task), ("step", step)):
        rows.attach(call, name, related)
    return call


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


def task_summary(task: Task) -> dict:
    """SPEC §14: confirmed facts, unknown facts, what was not executed, blocked steps and the next action."""
    now = timezone.now()
    steps = list(Step.objects.filter(task=task).prefetch_related("depends_on").order_by("index"))
    calls = list(Call.objects.filter(task=task).select_related("tool", "step").order_by("pk"))
    states = step_states(steps, calls)
    steps_json, blocked = [], []
    for step in steps:
        deps = sorted(dep.index for dep in step.depends_on.all())
        waiting = sorted(dep.index for dep in step.depends_on.all() if states[dep.pk] != S.COMMITTED)
        if waiting and states[step.pk] != S.COMMITTED:
            blocked.append(step.index)
        steps_json.append(
            {
                "index": step.index,
                "name": step.name,
                "depends_on": deps,
                "state": states[step.pk],
                "blocked_by_steps": waiting,
                "calls": [c.pk for c in calls if c.step_id == step.pk],
            }
        )
    groups = {
        "done": [],
        "accepted_in_progress": [],
        "unknown": [],
        "needs_review": [],
        "not_executed": [],
        "in_flight": [],
        "pending": [],
        "compensated": [],
    }
    for call in calls:
        brief = _call_brief(call)
        if call.state == S.COMMITTED:
            groups["done"].append(brief)
        elif call.state == S.ACCEPTED:
            groups["accepted_in_progress"].append(brief)
        elif call.state in (S.UNKNOWN, S.STILL_UNKNOWN):
            groups["unknown"].append(brief)
        elif call.state == S.HUMAN_REVIEW:
            groups["needs_review"].append(brief)
        elif call.state in (S.FAILED_PERMANENT, S.NOT_COMMITTED):
            groups["not_executed"].append(brief)
        elif call.state == S.SENT:
            groups["in_flight"].append(brief)
        elif call.state in (S.READY, S.RETRYABLE):
            groups["pending"].append(brief)
        else:
            groups["compensated"].append(brief)
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
    }


def _next_action(task: Task, groups: dict, blocked: list[int], no_submission: bool) -> str:
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
    """GET /calls/{id}: the call with its attempts, decisions, gate answers and receipts (5 queries)."""
    attempts = list(call.attempts.select_related("tool").order_by("number"))
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
        "attempts_made": call.attempts_count,
        "max_attempts": call.max_attempts,
        "checks_made": call.checks_made,
        "next_check_at": call.next_check_at.isoformat() if call.next_check_at else None,
        "attempts": [
            {
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
            for a in attempts
        ],
        "latest_decision": latest.card if latest else None,
        "gate_decisions": [
            {
                "id": g.pk,
                "allowed": g.allowed,
                "reason": g.reason,
                "evidence_used": g.evidence_used,
                "dry_run": g.dry_run,
                "required_next": g.required_next or None,
                "created_at": g.created_at.isoformat(),
            }
            for g in gates
        ],
        "receipts": [
            {
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
            for r in receipts
        ],
    }


# Queues (SPEC §15.3) ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Queue:
    slug: str
    title: str
    states: tuple[str, ...]  # the states it shows; the "calls" queue shows the one state chosen


QUEUES = {
    "unknown": Queue(slug="unknown", title="Unknown outcome", states=(S.UNKNOWN, S.STILL_UNKNOWN)),
    "human-review": Queue(slug="human-review", title="Human review", states=(S.HUMAN_REVIEW,)),
    "calls": Queue(slug="calls", title="All calls", states=tuple(S.values)),
}
AGES = {"5m": timedelta(minutes=5), "1h": timedelta(hours=1), "24h": timedelta(hours=24)}
PAGE_SIZE = 50


@dataclass(frozen=True, kw_only=True)
class QueueFilters:
    """What a queue page shows, as the URL says it (every field optional except the queue's own states)."""

    states: tuple[str, ...]
    tool_id: int | None = None
    tenant_id: int | None = None
    risk: str = ""
    older_than: timedelta | None = None
    q: str = ""
    newest_first: bool = False
    after: tuple[datetime, int] | None = None  # keyset cursor: the last row of the previous page


@dataclass(frozen=True, kw_only=True)
class QueuePage:
    rows: list[dict]
    next_cursor: tuple[datetime, int] | None


# A queue row is a flat dict, not a model instance: 50 rows are drawn every few seconds for every reviewer, and the
# template engine reads a dict key in one step where a related instance's attribute costs a failed lookup first.
_QUEUE_COLUMNS = (
    "id", "state", "risk", "state_changed_at", "checks_made", "last_receipt_at", "last_receipt_status",
    "claim_until", "claimed_by_id", "task_id",
)  # fmt: skip


def _name_of(model, column: str, field: str) -> Subquery:
    return Subquery(model.objects.filter(pk=OuterRef(column)).values(field)[:1])


# The related names as scalar subqueries rather than joins: PostgreSQL then plans one single-table query (about
# 0.2 ms) instead of searching join orders over six tables and the call table's sixteen indexes (about 4 ms, more
# than running it), and runs each lookup only for the page's rows, by primary key, after the LIMIT.
_QUEUE_RELATED = {
    "task_external_id": _name_of(Task, "task_id", "external_id"),
    "step_index": _name_of(Step, "step_id", "index"),
    "tool_name": _name_of(Tool, "tool_id", "name"),
    "tenant_name": _name_of(Tenant, "tenant_id", "name"),
    "holder": _name_of(get_user_model(), "claimed_by_id", "username"),
}


def queue_page(filters: QueueFilters, *, now: datetime, size: int = PAGE_SIZE) -> QueuePage:
    """One page of a queue, oldest first (or newest), by keyset: the same statements whatever the page's depth —
    one for the rows, plus one to resolve a search by task id or external id."""
    calls = Call.objects.filter(state__in=filters.states)
    if filters.tool_id:
        calls = calls.filter(tool_id=filters.tool_id)
    if filters.tenant_id:
        calls = calls.filter(tenant_id=filters.tenant_id)
    if filters.risk:
        calls = calls.filter(risk=filters.risk)
    if filters.older_than:
        calls = calls.filter(state_changed_at__lte=now - filters.older_than)
    if filters.q:
        calls = calls.filter(_search(filters.q))
    if filters.after:
        at, pk = filters.after
        if filters.newest_first:
            calls = calls.filter(state_changed_at__lte=at).filter(Q(state_changed_at__lt=at) | Q(id__lt=pk))
        else:
            calls = calls.filter(state_changed_at__gte=at).filter(Q(state_changed_at__gt=at) | Q(id__gt=pk))
    order = ("-state_changed_at", "-id") if filters.newest_first else ("state_changed_at", "id")
    rows_ = list(calls.order_by(*order).values(*_QUEUE_COLUMNS, **_QUEUE_RELATED)[: size + 1])
    more = len(rows_) > size
    rows_ = rows_[:size]
    return QueuePage(rows=rows_, next_cursor=(rows_[-1]["state_changed_at"], rows_[-1]["id"]) if more else None)


def call_row(call_id: int) -> dict | None:
    """One call as a queue row (after a claim, the row is drawn again as it now stands)."""
    return Call.objects.filter(pk=call_id).values(*_QUEUE_COLUMNS, **_QUEUE_RELATED).first()


def _search(q: str) -> Q:
    """Exact matches on what a reviewer pastes: a task's id or external id, an idempotency key, a provider ref. Each
    side of the OR has its own index; task ids are looked up first so the OR never spans a join."""
    task_ids = list(Task.objects.filter(external_id=q).values_list("id", flat=True)[:100])
    if q.isdigit() and len(q) < 19:
        task_ids.append(int(q))
    return Q(task_id__in=task_ids) | Q(idempotency_key=q) | Q(provider_ref=q)


COUNT_CAP = 1000


def queue_counts(cap: int = COUNT_CAP) -> dict[str, int]:
    """Open items per queue for the navigation, each counted up to `cap` + 1 (a value above `cap` means "more than
    `cap`"): every reviewer's page polls these every few seconds, and an exact count is a scan of the whole backlog
    each time (the overview counts exactly). One statement; each count reads at most `cap` + 1 index entries."""
    unknown = Call.objects.filter(state__in=(S.UNKNOWN, S.STILL_UNKNOWN)).values("id")[: cap + 1]
    review = Call.objects.filter(state=S.HUMAN_REVIEW).values("id")[: cap + 1]
    (unknown_sql, unknown_params), (review_sql, review_params) = (q.query.sql_with_params() for q in (unknown, review))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT COUNT(*) FROM ({unknown_sql}) u), (SELECT COUNT(*) FROM ({review_sql}) r)",
            [*unknown_params, *review_params],
        )
        counted = cursor.fetchone()
    return {"unknown": counted[0], "human_review": counted[1]}

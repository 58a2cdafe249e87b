"""Reads of the review queues (SPEC §15.3): one page by keyset and the navigation's counts, each one statement."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import OuterRef, Q, Subquery

from recovery.models import Call, Step, Task, Tenant, Tool
from recovery.states import CallState

S = CallState


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
    return Subquery(model.objects.filter(pk=OuterRef(column)).order_by().values(field))


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

"""More of the protected call's reads as SQL written once from the models (docs/benchmarks.md, the protected
benchmark): the report's attempt, the registration's tool and the admission's earlier verdicts. The ORM builds each
of these statements anew on every request, and that building cost more CPU than PostgreSQL spends running them; rows
become model instances as recovery.statemachine.hot_path makes them, and the ORM twin reads when
RECOVERY_HOT_PATH_SQL is off.
"""

from __future__ import annotations

from collections.abc import Collection
from functools import cache

from django.db import connection
from django.db.models import Max, Subquery

from recovery.models import Attempt, Call, Provider, Task, Tenant, Tool
from recovery.registry import with_alternates
from recovery.selectors import tasks_calls
from recovery.statemachine.hot_path import _cache_related, _columns, _load, _sql

_ALTERNATES = f"EXISTS(SELECT 1 FROM {Tool.alternates.through._meta.db_table} x WHERE x.from_tool_id = t.id)"


@cache
def _attempt_sql(tenants: int) -> str:
    columns = ", ".join(
        [_columns(Attempt, "a"), _columns(Tool, "t"), _columns(Provider, "p"), _columns(Call, "c"), _columns(Task, "k")]
    )
    return (
        f"SELECT {columns}, {_ALTERNATES} FROM {Attempt._meta.db_table} a "
        f"JOIN {Call._meta.db_table} c ON a.call_id = c.id JOIN {Tool._meta.db_table} t ON a.tool_id = t.id "
        f"JOIN {Provider._meta.db_table} p ON t.provider_id = p.id JOIN {Task._meta.db_table} k ON c.task_id = k.id "
        f"WHERE a.call_id = %s AND a.attempt_id = %s AND c.tenant_id IN ({', '.join(['%s'] * tenants)})"
    )


def attempt_for_report(call_id: int, attempt_id: str, tenant_ids: Collection[int]) -> Attempt | None:
    """selectors.tasks_calls.attempt_in_tenants() in one statement written once: the attempt, its tool (with its
    provider) and its call (with its task), and whether the tool has alternates."""
    if not _sql():
        return tasks_calls.attempt_in_tenants(call_id, attempt_id, tenant_ids)
    low, high = connection.ops.integer_field_range("BigAutoField")
    if not tenant_ids or not low <= call_id <= high:
        return None
    with connection.cursor() as cursor:
        # raw SQL: it paid in a same-run alternating measurement (docs/benchmarks.md, the protected benchmark)
        cursor.execute(_attempt_sql(len(tenant_ids)), [call_id, attempt_id, *sorted(tenant_ids)])
        row = cursor.fetchone()
    if row is None:
        return None
    attempt, at = _load(Attempt, row, 0)
    tool, at = _load(Tool, row, at)
    provider, at = _load(Provider, row, at)
    call, at = _load(Call, row, at)
    task, at = _load(Task, row, at)
    _cache_related(tool, "provider", provider)
    _cache_related(attempt, "tool", tool)
    _cache_related(attempt, "call", call)
    _cache_related(call, "task", task)
    attempt.tool_has_alternates = bool(row[at])
    if not attempt.tool_has_alternates:
        with_alternates(tool, none=True)  # nothing to read for its policy
    return attempt


@cache
def _tool_and_key_sql(all_tools: bool) -> str:
    allowed = (
        "" if all_tools else f"JOIN {Tenant.tools.through._meta.db_table} g ON g.tool_id = t.id AND g.tenant_id = %s "
    )
    same_key = "c.tenant_id = %s AND c.tool_id = t.id AND c.idempotency_key = %s"
    return (
        f"SELECT {_columns(Tool, 't')}, {_columns(Provider, 'p')}, {_ALTERNATES}, {_columns(Call, 'c')}, ({same_key}) "
        f"FROM {Tool._meta.db_table} t JOIN {Provider._meta.db_table} p ON t.provider_id = p.id {allowed}"
        f"LEFT JOIN {Call._meta.db_table} c ON ({same_key}) OR (c.task_id = %s AND c.fingerprint = %s) "
        "WHERE t.name = %s ORDER BY c.id"
    )


def allowed_tool_and_key(
    task: Task, name: str, key: str, print_: str
) -> tuple[Tool | None, tuple[Call | None, list[Call]] | None]:
    """selectors.tasks_calls.allowed_tool() and key_and_intent() in one statement written once (a registration's two
    reads before it inserts): the tenant's capability `name` with its provider and whether it has alternates, and
    (the call registered under its key, the task's calls of the same intent).
    The second is None where the ORM twins read (RECOVERY_HOT_PATH_SQL off): key_and_intent() reads it then."""
    tenant = task.tenant
    if not _sql():
        return tasks_calls.allowed_tool(tenant, name), None
    keyed = [tenant.pk, key]
    params = [*keyed, *([] if tenant.all_tools else [tenant.pk]), *keyed, task.pk, print_, name]
    with connection.cursor() as cursor:
        # raw SQL: it paid in a same-run alternating measurement (docs/benchmarks.md, the protected benchmark)
        cursor.execute(_tool_and_key_sql(tenant.all_tools), params)
        rows = cursor.fetchall()
    if not rows:
        return None, None
    tool, at = _load(Tool, rows[0], 0)
    provider, at = _load(Provider, rows[0], at)
    _cache_related(tool, "provider", provider)
    tool.has_alternates = bool(rows[0][at])
    if not tool.has_alternates:
        with_alternates(tool, none=True)  # nothing to read for its policy
    existing, same_intent = None, []
    for row in rows:
        call, end = _load(Call, row, at + 1)
        if call.pk is None:  # no call of either kind: the tool's row alone
            continue
        if row[end] and existing is None:
            existing = call
        if call.task_id == task.pk and call.fingerprint == print_:
            same_intent.append(call)
    return tool, (existing, same_intent)


@cache
def _reported_sql() -> str:
    attempts, calls = Attempt._meta.db_table, Call._meta.db_table
    return (
        f"SELECT a.call_id, a.attempt_id, a.response, a.outcome_response FROM {attempts} a "
        f"JOIN {calls} c ON a.call_id = c.id WHERE c.task_id = %s AND a.http_status >= 200 AND a.http_status < 300 "
        "AND a.http_status <> 202 AND a.reported_at > "
        f"(SELECT MAX(b.admitted_at) FROM {attempts} b JOIN {calls} d ON b.call_id = d.id WHERE d.task_id = %s) "
        "ORDER BY a.reported_at, a.id"
    )


def reported_2xx_since_last_admission(task_id: int) -> list[tuple[int, str, dict | None, dict | None]]:
    """The task's attempts with a 2xx other than 202 reported after its latest admission: (call id, attempt id,
    stored admission answer, stored outcome answer), in the order they were reported."""
    if not _sql():
        latest = (
            Attempt.objects.filter(call__task_id=task_id)
            .order_by()
            .values("call__task_id")
            .annotate(latest=Max("admitted_at"))
            .values("latest")[:1]
        )
        rows = (
            Attempt.objects.filter(call__task_id=task_id, reported_at__gt=Subquery(latest))
            .filter(http_status__gte=200, http_status__lt=300)
            .exclude(http_status=202)
            .order_by("reported_at", "pk")
        )
        return list(rows.values_list("call_id", "attempt_id", "response", "outcome_response"))
    with connection.cursor() as cursor:
        # raw SQL: it paid in a same-run alternating measurement (docs/benchmarks.md, the protected benchmark)
        cursor.execute(_reported_sql(), [task_id, task_id])
        rows = cursor.fetchall()
    response, outcome = Attempt._meta.get_field("response"), Attempt._meta.get_field("outcome_response")
    return [
        (
            call_id,
            attempt_id,
            response.from_db_value(admitted, None, connection),
            outcome.from_db_value(answer, None, connection),
        )
        for call_id, attempt_id, admitted, answer in rows
    ]


@cache
def _call_row_sql(lock: str) -> str:
    return f"SELECT {_columns(Call, 'c')} FROM {Call._meta.db_table} c WHERE c.id = %s{lock}"


@cache
def _locked_call_sql(lock: str) -> str:
    columns = ", ".join([_columns(Call, "c"), _columns(Tool, "t"), _columns(Provider, "p"), _columns(Task, "k")])
    return (
        f"SELECT {columns} FROM {Call._meta.db_table} c JOIN {Tool._meta.db_table} t ON c.tool_id = t.id "
        f"JOIN {Provider._meta.db_table} p ON t.provider_id = p.id JOIN {Task._meta.db_table} k ON c.task_id = k.id "
        f"WHERE c.id = %s{lock}"
    )


def locked_call(call_id: int, *, tool: Tool | None = None, task: Task | None = None) -> Call:
    """The call locked for the rest of the transaction (FOR UPDATE of its row only, where the backend locks rows),
    with its tool (and provider) and task: what a report reads inside its transaction, in one statement written once.
    The ORM twin is select_for_update(of=("self",)) with select_related. `tool` and `task`: the call's, as the
    caller read them a moment before (neither row is locked either way): the call's own row alone is read again."""
    if not _sql():
        calls = Call.objects.select_for_update(of=("self",)).select_related("tool__provider", "task")
        return calls.get(pk=call_id)
    lock = " FOR UPDATE OF c" if connection.features.has_select_for_update_of else ""
    known = tool is not None and task is not None
    with connection.cursor() as cursor:
        # raw SQL: it paid in a same-run alternating measurement (docs/benchmarks.md, the protected benchmark)
        cursor.execute(_call_row_sql(lock) if known else _locked_call_sql(lock), [call_id])
        row = cursor.fetchone()
    if row is None:
        raise Call.DoesNotExist(f"no call {call_id}")
    call, at = _load(Call, row, 0)
    if known and call.tool_id == tool.pk and call.task_id == task.pk:
        _cache_related(call, "tool", tool)
        _cache_related(call, "task", task)
        return call
    if known:  # moved to another tool since (an approved alternate): read as a whole
        return locked_call(call_id)
    tool, at = _load(Tool, row, at)
    provider, at = _load(Provider, row, at)
    task, _ = _load(Task, row, at)
    _cache_related(tool, "provider", provider)
    _cache_related(call, "tool", tool)
    _cache_related(call, "task", task)
    return call


@cache
def _task_sql(tenants: int) -> str:
    return (
        f"SELECT {_columns(Task, 'k')}, {_columns(Tenant, 'n')} FROM {Task._meta.db_table} k "
        f"JOIN {Tenant._meta.db_table} n ON k.tenant_id = n.id "
        f"WHERE k.id = %s AND k.tenant_id IN ({', '.join(['%s'] * tenants)})"
    )


def task_in_tenants(task_id: int, tenant_ids: Collection[int]) -> Task | None:
    """The task with its tenant if it belongs to one of `tenant_ids` (every call registration reads it)."""
    if not _sql():
        return Task.objects.select_related("tenant").filter(pk=task_id, tenant_id__in=tenant_ids).first()
    low, high = connection.ops.integer_field_range("BigAutoField")
    if not tenant_ids or not low <= task_id <= high:
        return None
    with connection.cursor() as cursor:
        # raw SQL: it paid in a same-run alternating measurement (docs/benchmarks.md, the protected benchmark)
        cursor.execute(_task_sql(len(tenant_ids)), [task_id, *sorted(tenant_ids)])
        row = cursor.fetchone()
    if row is None:
        return None
    task, at = _load(Task, row, 0)
    _cache_related(task, "tenant", _load(Tenant, row, at)[0])
    return task


@cache
def _key_and_intent_sql() -> str:
    same_key = "c.tenant_id = %s AND c.tool_id = %s AND c.idempotency_key = %s"
    return (
        f"SELECT {_columns(Call, 'c')}, ({same_key}) FROM {Call._meta.db_table} c "
        f"WHERE ({same_key}) OR (c.task_id = %s AND c.fingerprint = %s) ORDER BY c.id"
    )


def key_and_intent(task: Task, tool: Tool, key: str, print_: str) -> tuple[Call | None, list[Call]]:
    """What a registration checks before it inserts, in one statement written once: the call already registered
    under this tenant, tool and key (the first, as `.first()` reads it), and the task's calls carrying the same
    intent (fingerprint). The ORM twin reads them in two queries."""
    if not _sql():
        existing = Call.objects.filter(tenant_id=task.tenant_id, tool=tool, idempotency_key=key).first()
        return existing, list(Call.objects.filter(task=task, fingerprint=print_).order_by("pk"))
    keyed = [task.tenant_id, tool.pk, key]
    with connection.cursor() as cursor:
        # raw SQL: it paid in a same-run alternating measurement (docs/benchmarks.md, the protected benchmark)
        cursor.execute(_key_and_intent_sql(), [*keyed, *keyed, task.pk, print_])
        rows = cursor.fetchall()
    existing, same_intent = None, []
    for row in rows:
        call, at = _load(Call, row, 0)
        if row[at] and existing is None:
            existing = call
        if call.task_id == task.pk and call.fingerprint == print_:
            same_intent.append(call)
    return existing, same_intent

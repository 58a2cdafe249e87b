"""The hot paths' statements as SQL written once from the models (docs/architecture.md, "The data layer"): the
admission read, the task's counters, a call's state UPDATE, the inserts and the token lookup, whose ORM versions
miss docs/design/quality-targets.md (docs/benchmarks.md: ingest's ORM twin). Rows read back become model instances
as the ORM makes them; each function reads through its ORM twin when RECOVERY_HOT_PATH_SQL is off.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import F, Model, signals

from recovery.engine.states import UNSETTLED, CallState
from recovery.models import ApiToken, Attempt, Breaker, Call, Provider, Receipt, Step, Task, Tenant, Tool
from recovery.registry import with_alternates
from recovery.selectors import tasks_calls
from recovery.selectors.context import AdmissionRead


def _sql() -> bool:
    return settings.RECOVERY_HOT_PATH_SQL


# --- rows into instances -------------------------------------------------------------------------------------------


def _q(column: str) -> str:
    return f'"{column}"'  # `index` and `key` are keywords: quoted as both backends read standard SQL


@cache
def _columns(model: type[Model], alias: str) -> str:
    return ", ".join(f"{alias}.{_q(field.column)}" for field in model._meta.concrete_fields)


@cache
def _loader(model: type[Model], vendor: str) -> tuple[list[str], tuple[tuple[int, Any, list], ...]]:
    """The attribute names in _columns' order, and (position, column, converters) of the fields the backend reads
    back in another form: what the ORM applies to a row before Model.from_db."""
    fields = model._meta.concrete_fields
    converting = []
    for position, field in enumerate(fields):
        col = field.get_col(model._meta.db_table)
        if functions := connection.ops.get_db_converters(col) + col.get_db_converters(connection):
            converting.append((position, col, functions))
    return [field.attname for field in fields], tuple(converting)


def _load(model: type[Model], row: Sequence, offset: int) -> tuple[Model, int]:
    """An instance of `model` from `row[offset:]`, and the offset after its columns."""
    attnames, converting = _loader(model, connection.vendor)
    values = list(row[offset : offset + len(attnames)])
    for position, col, functions in converting:
        for function in functions:
            values[position] = function(values[position], col, connection)
    return model.from_db(connection.alias, attnames, values), offset + len(attnames)


def _cache_related(instance: Model, name: str, related: Model | None) -> None:
    """`instance.<name>` answers `related` without a query, as after select_related()."""
    instance._meta.get_field(name).set_cached_value(instance, related)


# --- the admission read --------------------------------------------------------------------------------------------


@cache
def _call_sql(tenants: int) -> str:
    unsettled = ", ".join(f"'{state}'" for state in sorted(UNSETTLED))  # literals from the state table
    through = Step.depends_on.through._meta.db_table
    alternates = Tool.alternates.through._meta.db_table
    receipts = Receipt._meta.db_table
    annotations = [
        f"(SELECT a.id FROM {Attempt._meta.db_table} a WHERE a.call_id = c.id AND a.attempt_id = %s LIMIT 1)",
        f"(SELECT r.observed FROM {receipts} r WHERE r.call_id = c.id ORDER BY r.checked_at DESC LIMIT 1)",
        f"(SELECT r.checked_at FROM {receipts} r WHERE r.call_id = c.id ORDER BY r.checked_at DESC LIMIT 1)",
        f"EXISTS(SELECT 1 FROM {Call._meta.db_table} d WHERE d.step_id IN "
        f"(SELECT e.to_step_id FROM {through} e WHERE e.from_step_id = c.step_id))",
        f"(SELECT COUNT(*) FROM {Call._meta.db_table} u WHERE u.task_id = c.task_id AND u.state IN ({unsettled}))",
        f"EXISTS(SELECT 1 FROM {alternates} x WHERE x.from_tool_id = c.tool_id)",
        f"(SELECT COUNT(*) FROM {Call._meta.db_table} v WHERE v.task_id = c.task_id "
        f"AND v.state = '{CallState.COMPENSATING}')",
    ]
    columns = ", ".join(
        [_columns(Call, "c"), _columns(Tool, "t"), _columns(Provider, "p"), _columns(Task, "k"), _columns(Breaker, "b")]
    )
    return (
        f"SELECT {columns}, {', '.join(annotations)} FROM {Call._meta.db_table} c "
        f"JOIN {Tool._meta.db_table} t ON c.tool_id = t.id JOIN {Provider._meta.db_table} p ON t.provider_id = p.id "
        f"JOIN {Task._meta.db_table} k ON c.task_id = k.id LEFT JOIN {Breaker._meta.db_table} b ON b.tool_id = t.id "
        f"WHERE c.id = %s AND c.tenant_id IN ({', '.join(['%s'] * tenants)})"
    )


_ANNOTATIONS = (
    "stored_attempt_pk",
    "latest_receipt_observed",
    "latest_receipt_at",
    "has_dependency_calls",
    "unsettled_in_task",
    "tool_has_alternates",
    "compensating_in_task",
)


def call_for_attempt(
    call_id: int, tenant_ids: Collection[int], *, attempt_id: str
) -> tuple[Call, AdmissionRead] | None:
    """selectors.tasks_calls.call_for_attempt() in one statement written once: the call, its tool (with provider
    and breaker row), its task, and what admitting `attempt_id` reads besides (the AdmissionRead to hand to
    admission with the call)."""
    if not _sql():
        return _orm_call_for_attempt(call_id, tenant_ids, attempt_id=attempt_id)
    low, high = connection.ops.integer_field_range("BigAutoField")
    if not tenant_ids or not low <= call_id <= high:
        return None
    with connection.cursor() as cursor:
        cursor.execute(_call_sql(len(tenant_ids)), [attempt_id, call_id, *sorted(tenant_ids)])
        row = cursor.fetchone()
    if row is None:
        return None
    call, at = _load(Call, row, 0)
    tool, at = _load(Tool, row, at)
    provider, at = _load(Provider, row, at)
    task, at = _load(Task, row, at)
    breaker, at = _load(Breaker, row, at)
    breaker_row = breaker if breaker.pk is not None else None
    _cache_related(tool, "provider", provider)
    _cache_related(tool, "breaker_row", breaker_row)
    _cache_related(call, "tool", tool)
    _cache_related(call, "task", task)
    values = dict(zip(_ANNOTATIONS, row[at:], strict=True))
    if values["latest_receipt_at"] is not None:  # as the ORM reads the column (SQLite: text or a naive datetime)
        col = Receipt._meta.get_field("checked_at").get_col(Receipt._meta.db_table)
        for function in connection.ops.get_db_converters(col) + col.get_db_converters(connection):
            values["latest_receipt_at"] = function(values["latest_receipt_at"], col, connection)
    values["has_dependency_calls"] = bool(values["has_dependency_calls"])
    values["tool_has_alternates"] = bool(values["tool_has_alternates"])
    if not values["tool_has_alternates"]:
        with_alternates(tool, none=True)
    return call, AdmissionRead(**values, breaker_row=breaker_row)


def _orm_call_for_attempt(
    call_id: int, tenant_ids: Collection[int], *, attempt_id: str
) -> tuple[Call, AdmissionRead] | None:
    """The ORM twin: the selector's call, its annotations taken into the AdmissionRead."""
    call = tasks_calls.call_for_attempt(call_id, tenant_ids, attempt_id=attempt_id)
    if call is None:
        return None
    try:
        breaker_row = call.tool.breaker_row  # read with the call (select_related)
    except Breaker.DoesNotExist:  # a reverse one-to-one: a tool whose breaker never opened has no row
        breaker_row = None
    return call, AdmissionRead(**{name: getattr(call, name) for name in _ANNOTATIONS}, breaker_row=breaker_row)


# --- the task's counters -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    """A task's counters as the statement that moved them left them (in this transaction)."""

    rounds_used: int
    tokens_used: int
    write_retries_used: int


_COUNT = (
    f"UPDATE {Task._meta.db_table} SET rounds_used = rounds_used + %s, write_retries_used = write_retries_used + %s, "
    "tokens_used = tokens_used + %s WHERE id = %s RETURNING rounds_used, tokens_used, write_retries_used"
)


def count_on_task(task_id: int, *, rounds: int = 0, write_retries: int = 0, tokens: int = 0) -> Counters:
    """Add to a task's counters (rounds, write retries, tokens) and read all three back: UPDATE ... RETURNING, one
    statement where the ORM needs an UPDATE and a SELECT. The decision that follows reads them as this transaction
    left them (another call of the task may have moved them a moment before)."""
    if not _sql():
        tasks = Task.objects.filter(pk=task_id)
        tasks.update(
            rounds_used=F("rounds_used") + rounds,
            write_retries_used=F("write_retries_used") + write_retries,
            tokens_used=F("tokens_used") + tokens,
        )
        return Counters(*tasks.values_list("rounds_used", "tokens_used", "write_retries_used").get())
    with connection.cursor() as cursor:
        cursor.execute(_COUNT, [rounds, write_retries, tokens, task_id])
        return Counters(*cursor.fetchone())


# --- a call's state ------------------------------------------------------------------------------------------------


@cache
def _transition_sql(columns: tuple[str, ...]) -> str:
    sets = ", ".join(f"{_q(Call._meta.get_field(name).column)} = %s" for name in columns)
    return (
        f"UPDATE {Call._meta.db_table} SET {sets}, version = version + 1 WHERE id = %s AND state = %s AND version = %s"
    )


def update_call_state(call: Call, src: str, values: dict[str, Any]) -> int:
    """recovery.statemachine.transitions' conditional UPDATE on (id, state, version): `values` (the new state, its times
    and the other columns the transition writes, plain values) set and the version bumped by one; the rows it changed
    (0: someone else moved the call first). Every attempt runs it twice; the ORM twin is `update()` with
    F("version")."""
    if not _sql():
        where = Call.objects.filter(id=call.pk, state=src, version=call.version)
        return where.update(version=F("version") + 1, **values)
    names = tuple(values)
    params = [Call._meta.get_field(name).get_db_prep_save(_pk(values[name]), connection) for name in names]
    with connection.cursor() as cursor:
        cursor.execute(_transition_sql(names), [*params, call.pk, src, call.version])
        return cursor.rowcount


def _pk(value: Any) -> Any:
    """A related instance's key, as the ORM writes a foreign key assigned an instance."""
    return value.pk if isinstance(value, Model) else value


# --- the API token -------------------------------------------------------------------------------------------------


@cache
def _token_sql() -> str:
    through = ApiToken.tenants.through._meta.db_table
    return (
        f"SELECT {_columns(ApiToken, 'k')}, {_columns(Tenant, 'n')} FROM {through} a "
        f"JOIN {ApiToken._meta.db_table} k ON a.apitoken_id = k.id "
        f"JOIN {Tenant._meta.db_table} n ON a.tenant_id = n.id "
        "WHERE k.prefix = %s AND k.revoked_at IS NULL ORDER BY n.name"
    )


def token_links(prefix: str) -> list[tuple[Model, Model]]:
    """(token, tenant) for each tenant of the unrevoked token with this prefix, by tenant name, in one statement
    (every API request runs it): services.tokens' reading of its tenant links with select_related."""
    if not _sql():
        links = ApiToken.tenants.through.objects.select_related("apitoken", "tenant").filter(
            apitoken__prefix=prefix, apitoken__revoked_at__isnull=True
        )
        return [(link.apitoken, link.tenant) for link in links.order_by("tenant__name")]
    with connection.cursor() as cursor:
        cursor.execute(_token_sql(), [prefix])
        rows = cursor.fetchall()
    if not rows:
        return []
    token, at = _load(ApiToken, rows[0], 0)  # the same token on every row: one instance
    return [(token, _load(Tenant, row, at)[0]) for row in rows]


# --- the attempt's rows --------------------------------------------------------------------------------------------


@cache
def _insert_sql(model: type[Model], returning: bool) -> tuple[str, tuple]:
    fields = tuple(field for field in model._meta.concrete_fields if not field.primary_key)
    sql = (
        f"INSERT INTO {model._meta.db_table} ({', '.join(_q(field.column) for field in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    return (sql + f" RETURNING {_q(model._meta.pk.column)}" if returning else sql), fields


def insert(instance: Model) -> Model:
    """`instance.save(force_insert=True)` for the rows an attempt writes (the attempt, its gate answer, a runtime's
    receipt): one INSERT, the primary key set, each value prepared by its field as the ORM prepares it. Through the
    ORM when anyone listens to the model's saves."""
    model = type(instance)
    listened = signals.pre_save.has_listeners(model) or signals.post_save.has_listeners(model)
    if not _sql() or listened:
        instance.save(force_insert=True)
        return instance
    returning = connection.features.can_return_columns_from_insert
    sql, fields = _insert_sql(model, returning)
    values = [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        if returning:
            (instance.pk,) = cursor.fetchone()
        else:
            instance.pk = connection.ops.last_insert_id(cursor, model._meta.db_table, model._meta.pk.column)
    instance._state.adding, instance._state.db = False, connection.alias
    return instance

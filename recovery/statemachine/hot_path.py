"""The hot paths' statements as SQL written once from the models (docs/architecture.md, "The data layer"): the
admission read, the task's counters, a call's state UPDATE, the inserts and the token lookup, whose ORM versions
miss docs/design/quality-targets.md (docs/benchmarks.md: ingest's ORM twin). Rows read back become model instances
as the ORM makes them; each function reads through its ORM twin when RECOVERY_HOT_PATH_SQL is off.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import F, Model, signals
from django.utils import timezone

from recovery.engine.states import UNSETTLED, CallState
from recovery.models import ApiToken, Attempt, Breaker, Call, GateDecision, Provider, Receipt, Step, Task, Tenant, Tool
from recovery.registry import with_alternates
from recovery.selectors import tasks_calls
from recovery.selectors.context import AdmissionRead
from recovery.statemachine.field_values import from_row, pipeline, prepared


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
    db = _wrapper()
    attnames, converting = _loader(model, db.vendor)
    values = list(row[offset : offset + len(attnames)])
    for position, col, functions in converting:
        for function in functions:
            values[position] = function(values[position], col, db)
    return from_row(model, db.alias, attnames, values), offset + len(attnames)


def _wrapper():
    """This thread's connection itself: `connection` is a proxy that finds it again on every attribute read, which
    a row's many field conversions made a measurable part of a request (the protected benchmark's profile)."""
    return connections[DEFAULT_DB_ALIAS]


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


# --- a first admission, in the request that registered the call ----------------------------------------------------


@cache
def _first_columns(step: str) -> str:
    """What a first admission reads (first_admission_read), as a select list over the breaker `b`; `step`, the SQL of
    the call's step id. Its parameters: the task's id four times."""
    calls, attempts = Call._meta.db_table, Attempt._meta.db_table
    through = Step.depends_on.through._meta.db_table
    unsettled = ", ".join(f"'{state}'" for state in sorted(UNSETTLED))  # literals from the state table
    reported = (  # hot_reads.reported_2xx_since_last_admission, its rows as one JSON array
        "SELECT json_agg(json_build_array(r.call_id, r.attempt_id, r.response, r.outcome_response) "
        f"ORDER BY r.reported_at, r.id) FROM {attempts} r JOIN {calls} s ON r.call_id = s.id WHERE s.task_id = %s "
        "AND r.http_status >= 200 AND r.http_status < 300 AND r.http_status <> 202 AND r.reported_at > "
        f"(SELECT MAX(x.admitted_at) FROM {attempts} x JOIN {calls} y ON x.call_id = y.id WHERE y.task_id = %s)"
    )
    return (
        f"{_columns(Breaker, 'b')}, "
        f"(SELECT COUNT(*) FROM {calls} u WHERE u.task_id = %s AND u.state IN ({unsettled})), "
        f"(SELECT COUNT(*) FROM {calls} v WHERE v.task_id = %s AND v.state = '{CallState.COMPENSATING}'), "
        f"EXISTS(SELECT 1 FROM {calls} d WHERE d.step_id IN "
        f"(SELECT e.to_step_id FROM {through} e WHERE e.from_step_id = {step})), ({reported}), "
        f"nextval(pg_get_serial_sequence('{attempts}', 'id')), "
        f"nextval(pg_get_serial_sequence('{GateDecision._meta.db_table}', 'id'))"
    )


@cache
def _first_sql() -> str:
    return f"SELECT {_first_columns('%s')} FROM (SELECT 1) one LEFT JOIN {Breaker._meta.db_table} b ON b.tool_id = %s"


def first_admission_read(call: Call) -> AdmissionRead | None:
    """What the first admission of `call` reads, for a call this transaction just inserted with its tool (provider and
    alternates read: hot_reads.allowed_tool) and task: nothing of the call's own — no attempt, no receipt can exist
    yet — so in place of call_for_attempt's re-read of the call, one statement of what else the gate and the stored
    answer need (the breaker row, the task's unsettled and compensating calls, whether the step's dependencies have
    calls, the task's reports since its last admission) and the keys of the attempt and gate rows about to be
    inserted. PostgreSQL's sequences only: None elsewhere (the caller reads with call_for_attempt)."""
    if not _sql() or connection.vendor != "postgresql":
        return None
    task = call.task_id
    with connection.cursor() as cursor:
        # raw SQL: it paid in a same-run alternating measurement (docs/benchmarks.md, the protected benchmark)
        cursor.execute(_first_sql(), [task, task, call.step_id, task, task, call.tool_id])
        row = cursor.fetchone()
    return _admission_read(call, row, 0)


def _admission_read(call: Call, row: Sequence, offset: int) -> AdmissionRead:
    breaker, at = _load(Breaker, row, offset)
    unsettled, compensating, dependencies, reported, attempt_pk, gate_pk = row[at:]
    return AdmissionRead(
        stored_attempt_pk=None,
        latest_receipt_observed=None,
        latest_receipt_at=None,
        has_dependency_calls=bool(dependencies),
        unsettled_in_task=unsettled,
        tool_has_alternates=bool(getattr(call.tool, "has_alternates", True)),
        compensating_in_task=compensating,
        breaker_row=breaker if breaker.pk is not None else None,
        reported=[tuple(found) for found in reported or ()],
        reserved_ids=(attempt_pk, gate_pk),
    )


# --- a new call with its step --------------------------------------------------------------------------------------

# A new step's columns, in its inserts' parameter order (here and services.calls' own, for a step with more to record).
STEP_COLUMNS = ("task_id", "index", "name", "compensation", "created_at")


@cache
def _with_step_sql(read: bool) -> tuple[str, tuple, tuple]:
    """The step made or found (ON CONFLICT DO UPDATE returns the row either way, a concurrent insert's too once it
    commits; `xmax = 0` on a row this statement inserted), the call inserted in it unless its key is taken, and with
    `read` what its first admission reads; the step's fields and the call's other than its step, in their parameters'
    order."""
    steps = Step._meta.db_table
    step_columns = ", ".join(_q(Step._meta.get_field(name).column) for name in STEP_COLUMNS)
    fields = tuple(field for field in Call._meta.concrete_fields if not field.primary_key)
    values = ", ".join("(SELECT id FROM made_step)" if field.attname == "step_id" else "%s" for field in fields)
    sql = (
        f"WITH made_step AS (INSERT INTO {steps} ({step_columns}) VALUES (%s, %s, %s, %s, %s) ON CONFLICT "
        f"({_q('task_id')}, {_q('index')}) DO UPDATE SET {_q('name')} = {steps}.{_q('name')} RETURNING id, xmax = 0), "
        f"made_call AS (INSERT INTO {Call._meta.db_table} ({', '.join(_q(field.column) for field in fields)}) "
        f"VALUES ({values}) ON CONFLICT DO NOTHING RETURNING id) SELECT made_step.*, (SELECT id FROM made_call)"
    )
    breaker = Breaker._meta.db_table
    if read:
        sql += f", {_first_columns('made_step.id')} FROM made_step LEFT JOIN {breaker} b ON b.tool_id = %s"
    else:
        sql += " FROM made_step"
    step_fields = tuple(Step._meta.get_field(name) for name in STEP_COLUMNS)
    return sql, step_fields, tuple(field for field in fields if field.attname != "step_id")


def insert_with_step(call: Call, index: int, *, read: bool) -> tuple[Call | None, bool, AdmissionRead | None] | None:
    """`call` inserted in its task's step `index`, the step made when missing, in one statement where insert_new()
    after the step's own insert take two (PostgreSQL, with nothing listening to the saves of either): the call (None:
    the tenant already has a call of that tool and key), whether the step is new, and with `read` what the call's
    first admission reads (first_admission_read). None where this does not apply: the caller inserts one by one."""
    if not skips_conflicts(Call) or connection.vendor != "postgresql" or _listened(Step):
        return None
    db = _wrapper()
    step = Step(task_id=call.task_id, index=index, name="", compensation={}, created_at=timezone.now())
    sql, step_fields, fields = _with_step_sql(read)
    params = [*prepared(step, step_fields, db), *prepared(call, fields, db)]
    if read:
        params += [call.task_id] * 4 + [call.tool_id]
    with connection.cursor() as cursor:
        # raw SQL: the step, the call and the admission's read in one round trip (docs/benchmarks.md, the protected
        # benchmark's sixth round)
        cursor.execute(sql, params)
        row = cursor.fetchone()
    step.pk, made, call.pk = row[:3]
    if call.pk is None:
        return None, made, None
    call.step_id = step.pk
    if made:
        _cache_related(call, "step", _inserted(step))
    return _inserted(call), made, _admission_read(call, row, 3) if read else None


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


def count_on_task(
    task_id: int, *, rounds: int = 0, write_retries: int = 0, tokens: int = 0, read_back: bool = True
) -> Counters | None:
    """Add to a task's counters (rounds, write retries, tokens) and read all three back: UPDATE ... RETURNING, one
    statement where the ORM needs an UPDATE and a SELECT. The decision that follows reads them as this transaction
    left them (another call of the task may have moved them a moment before). `read_back=False`: nothing read back
    (None), so that inside pipelined() the statement waits for no answer of its own."""
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
        return Counters(*cursor.fetchone()) if read_back else None


# --- a call's state ------------------------------------------------------------------------------------------------


@cache
def _transition_sql(columns: tuple[str, ...]) -> str:
    sets = ", ".join(f"{_q(Call._meta.get_field(name).column)} = %s" for name in columns)
    return (
        f"UPDATE {Call._meta.db_table} SET {sets}, version = version + 1 WHERE id = %s AND state = %s AND version = %s "
        # read back, not counted: inside pipelined(), at the block's end (docs/benchmarks.md, the protected
        # benchmark's fifth and sixth rounds)
        "RETURNING version"
    )


def update_call_state(call: Call, src: str, values: dict[str, Any], conflict: Callable[[], Exception]) -> int:
    """recovery.statemachine.transitions' conditional UPDATE on (id, state, version): `values` (the new state, its times
    and the other columns the transition writes, plain values) set and the version bumped by one; the rows it changed
    (0: someone else moved the call first). Every attempt runs it twice; the ORM twin is `update()` with
    F("version"). Inside pipelined(), its answer is read when the block's statements have all been answered, in the
    block's one round trip: it answers 1 now, and the block raises `conflict()` at its end if the call had moved."""
    if not _sql():
        where = Call.objects.filter(id=call.pk, state=src, version=call.version)
        return where.update(version=F("version") + 1, **values)
    names = tuple(values)
    db = _wrapper()
    params = [Call._meta.get_field(name).get_db_prep_save(_pk(values[name]), db) for name in names]
    cursor = connection.cursor()
    # raw SQL: one statement where the ORM's update() and its version check take more, and inside pipelined() its
    # answer read with the block's others in one round trip (docs/benchmarks.md, the protected benchmark's fifth
    # and sixth rounds)
    cursor.execute(_transition_sql(names), [*params, call.pk, src, call.version])
    checks = _CHECKS.get()
    if checks is None:
        with cursor:
            return len(cursor.fetchall())

    def moved() -> None:  # at the block's end
        with cursor:
            if len(cursor.fetchall()) != 1:
                raise conflict()

    checks.append(moved)
    return 1


# The checks of the pipelined() block this context is in: what its statements answered, read at its end.
_CHECKS: ContextVar[list[Callable[[], None]] | None] = ContextVar("hot_path_pipelined_checks", default=None)


@contextmanager
def pipelined() -> Iterator[None]:
    """The statements inside sent without waiting for each one's answer (psycopg's pipeline mode, PostgreSQL and
    RECOVERY_HOT_PATH_SQL only), in one round trip at the block's end, where a failure is raised as Django's error;
    a statement whose rows are read inside waits for it and every one sent before it (one more round trip). A call's
    move (update_call_state) is checked at the end: the block raises the transition's conflict after the others'
    answers, and the caller's transaction, which it must be inside, is undone (docs/benchmarks.md, the protected
    benchmark's fifth and sixth rounds). For statements that need nothing from the ones before them but their
    success."""
    db = _wrapper()
    if not _sql() or db.vendor != "postgresql":
        yield
        return
    checks: list[Callable[[], None]] = []
    token = _CHECKS.set(checks)
    try:
        with pipeline(db):
            yield
    finally:
        _CHECKS.reset(token)
    for check in checks:
        check()


def _pk(value: Any) -> Any:
    """A related instance's key, as the ORM writes a foreign key assigned an instance."""
    return value.pk if isinstance(value, Model) else value


# --- the API token -------------------------------------------------------------------------------------------------


@cache
def _token_sql(with_task: bool) -> str:
    through = ApiToken.tenants.through._meta.db_table
    task, join = "", ""
    if with_task:  # on the row of its tenant, if it has one among the token's
        task = f", {_columns(Task, 't')}"
        join = f" LEFT JOIN {Task._meta.db_table} t ON t.id = %s AND t.tenant_id = n.id"
    return (
        f"SELECT {_columns(ApiToken, 'k')}, {_columns(Tenant, 'n')}{task} FROM {through} a "
        f"JOIN {ApiToken._meta.db_table} k ON a.apitoken_id = k.id "
        f"JOIN {Tenant._meta.db_table} n ON a.tenant_id = n.id{join} "
        "WHERE k.prefix = %s AND k.revoked_at IS NULL ORDER BY n.name"
    )


def token_links(prefix: str, task_id: int | None = None) -> tuple[list[tuple[Model, Model]], Task | None]:
    """(token, tenant) for each tenant of the unrevoked token with this prefix, by tenant name, in one statement
    (every API request runs it): services.tokens' reading of its tenant links with select_related. With `task_id`
    (the task a request's path names), that task with its tenant too, if one of the token's tenants has it
    (hot_reads.task_in_tenants' answer, read in the same statement: docs/benchmarks.md, the protected benchmark's
    sixth round)."""
    if not _sql():
        links = ApiToken.tenants.through.objects.select_related("apitoken", "tenant").filter(
            apitoken__prefix=prefix, apitoken__revoked_at__isnull=True
        )
        pairs = [(link.apitoken, link.tenant) for link in links.order_by("tenant__name")]
        tenants = {tenant.pk for _, tenant in pairs}
        named = Task.objects.select_related("tenant").filter(pk=task_id, tenant_id__in=tenants).first()
        return pairs, named if task_id is not None else None
    with connection.cursor() as cursor:
        # raw SQL: the token, its tenants and the task the path names in one round trip (docs/benchmarks.md, the
        # protected benchmark's sixth round)
        cursor.execute(_token_sql(task_id is not None), [task_id, prefix] if task_id is not None else [prefix])
        rows = cursor.fetchall()
    if not rows:
        return [], None
    token, at = _load(ApiToken, rows[0], 0)  # the same token on every row: one instance
    pairs, named = [], None
    for row in rows:
        tenant, after = _load(Tenant, row, at)
        pairs.append((token, tenant))
        if task_id is not None and row[after] is not None:
            named = _load(Task, row, after)[0]
            _cache_related(named, "tenant", tenant)
    return pairs, named


# --- the attempt's rows --------------------------------------------------------------------------------------------


@cache
def _insert_sql(model: type[Model], returning: bool, keyed: bool = False, new_only: bool = False) -> tuple[str, tuple]:
    """`keyed`: the primary key given (reserved beforehand); `new_only`: nothing inserted where a unique constraint
    finds the row already there (ON CONFLICT DO NOTHING), which RETURNING then says by returning no row."""
    fields = tuple(field for field in model._meta.concrete_fields if keyed or not field.primary_key)
    sql = (
        f"INSERT INTO {model._meta.db_table} ({', '.join(_q(field.column) for field in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    if new_only:
        sql += " ON CONFLICT DO NOTHING"
    return (sql + f" RETURNING {_q(model._meta.pk.column)}" if returning else sql), fields


def _listened(model: type[Model]) -> bool:
    return signals.pre_save.has_listeners(model) or signals.post_save.has_listeners(model)


def _values(instance: Model, fields: tuple) -> list:
    return prepared(instance, fields, _wrapper())


def _inserted(instance: Model) -> Model:
    instance._state.adding, instance._state.db = False, connection.alias
    return instance


def insert(instance: Model) -> Model:
    """`instance.save(force_insert=True)` for the rows an attempt writes (the attempt, its gate answer, a runtime's
    receipt): one INSERT, the primary key set, each value prepared by its field as the ORM prepares it. Through the
    ORM when anyone listens to the model's saves."""
    model = type(instance)
    if not _sql() or _listened(model):
        instance.save(force_insert=True)
        return instance
    returning = connection.features.can_return_columns_from_insert
    sql, fields = _insert_sql(model, returning, keyed=instance.pk is not None)
    with connection.cursor() as cursor:
        cursor.execute(sql, _values(instance, fields))
        if instance.pk is None:
            if returning:
                (instance.pk,) = cursor.fetchone()
            else:
                instance.pk = connection.ops.last_insert_id(cursor, model._meta.db_table, model._meta.pk.column)
    return _inserted(instance)


def skips_conflicts(model: type[Model]) -> bool:
    """Whether insert_new() inserts `model` in one statement that answers a unique conflict with no row: otherwise
    (the ORM twin, or anyone listening to its saves) the conflict is an IntegrityError, which the caller's savepoint
    must catch."""
    return _sql() and connection.features.can_return_columns_from_insert and not _listened(model)


def insert_new(instance: Model) -> Model | None:
    """Insert `instance` unless a unique constraint finds its row already there: the instance, or None for such a
    conflict, in one statement and without the savepoint (two statements) that catching an IntegrityError needs.
    Where skips_conflicts() is false, the conflict raises IntegrityError as save() does."""
    model = type(instance)
    if not skips_conflicts(model):
        instance.save(force_insert=True)
        return instance
    sql, fields = _insert_sql(model, True, new_only=True)
    with connection.cursor() as cursor:
        # raw SQL: no savepoint around the insert (docs/benchmarks.md, the protected benchmark's fourth round)
        cursor.execute(sql, _values(instance, fields))
        row = cursor.fetchone()
    if row is None:
        return None
    (instance.pk,) = row
    return _inserted(instance)


def insert_together(first: Model, second: Model) -> None:
    """Insert two rows whose keys were reserved (first_admission_read), the second referring to the first, in one
    statement on PostgreSQL (WITH inserted AS (INSERT ...) INSERT ...: its foreign keys are checked at the statement's
    end, when both rows are in); two inserts elsewhere."""
    if not _sql() or connection.vendor != "postgresql" or _listened(type(first)) or _listened(type(second)):
        insert(first)
        insert(second)
        return
    first_sql, first_fields = _insert_sql(type(first), False, keyed=True)
    second_sql, second_fields = _insert_sql(type(second), False, keyed=True)
    with connection.cursor() as cursor:
        # raw SQL: two rows in one statement (docs/benchmarks.md, the protected benchmark's fourth round)
        cursor.execute(
            f"WITH inserted AS ({first_sql}) {second_sql}",
            [*_values(first, first_fields), *_values(second, second_fields)],
        )
    _inserted(first)
    _inserted(second)

"""Statements of the hot path, generated once from the models instead of built by the ORM on every request.

Every attempt runs a few dozen statements (SPEC §19 measures the whole API against a bare psycopg endpoint making
the same ones). Building each through a QuerySet costs several times what executing it does, so the ingest path
uses these helpers: the SQL comes from the models' metadata (tables, columns) and is cached per shape; values go
through each field's `pre_save` / `get_db_prep_save`, and values read go through the same converters the ORM
applies, so a row written or read here is the row the ORM would have written or read. Model signals are honoured
by falling back to the ORM when anyone listens.

The SQL is portable between PostgreSQL and SQLite: `%s` parameters, double-quoted column names, `RETURNING` where
the backend has it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connections
from django.db.models import Field, Model, signals

M = TypeVar("M", bound=Model)


def _fields(model: type[Model]) -> tuple[Field, ...]:
    return tuple(model._meta.concrete_fields)


def _quoted(column: str) -> str:
    """A column name quoted as SQL's standard (and both backends) read it: `index` and `key` are keywords."""
    return f'"{column}"'


@cache
def select_list(model: type[Model], alias: str) -> str:
    """`alias.col1, alias.col2, ...` for every concrete field of `model`, in load()'s order."""
    return ", ".join(f'{alias}."{field.column}"' for field in _fields(model))


@cache
def _names(model: type[Model]) -> tuple[tuple[str, ...], list[str]]:
    """The concrete fields' names and attribute names, in select_list's order."""
    return tuple(field.name for field in _fields(model)), [field.attname for field in _fields(model)]


def load(model: type[M], row: Sequence, offset: int = 0, using: str = "default") -> tuple[M, int]:
    """An instance from `row[offset:]` (columns in select_list's order), and the offset after its columns."""
    names, attnames = _names(model)
    end = offset + len(names)
    (values,) = read(model, names, [row[offset:end]], using)
    return model.from_db(using, attnames, values), end


def convert(model: type[Model], names: Sequence[str], values: Sequence, using: str = "default") -> list:
    """Values of the fields `names` as read by raw SQL, converted as the ORM converts them (JSON decoded, SQLite's
    timestamps parsed)."""
    if len(names) != len(values):
        raise ValueError(f"{len(names)} field names for {len(values)} values")
    return read(model, tuple(names), [values], using)[0]


@cache
def _reader(model: type[Model], names: tuple[str, ...], vendor: str, using: str) -> tuple[tuple[int, Any, list], ...]:
    """(position, column, converters) of the fields among `names` that have from-db converters on this backend."""
    connection = connections[using]
    out = []
    for position, name in enumerate(names):
        col = model._meta.get_field(name).get_col(model._meta.db_table)
        if functions := connection.ops.get_db_converters(col) + col.get_db_converters(connection):
            out.append((position, col, functions))
    return tuple(out)


def read(model: type[Model], names: tuple[str, ...], rows: Iterable[Sequence], using: str = "default") -> list[list]:
    """Rows of raw SQL whose leading columns are the fields `names` of `model`, as lists, those fields' values
    converted as the ORM converts them (nothing to do on PostgreSQL for plain columns; SQLite's timestamps parsed);
    any columns after them are left as read."""
    connection = connections[using]
    converting = _reader(model, names, connection.vendor, using)
    out = []
    for row in rows:
        values = list(row)
        for position, col, functions in converting:
            for function in functions:
                values[position] = function(values[position], col, connection)
        out.append(values)
    return out


def fetch(model: type[M], sql: str, params: Iterable = (), using: str = "default") -> list[M]:
    """Instances of `model` from a SELECT whose columns are select_list(model, alias)."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql, list(params))
        rows = cursor.fetchall()
    return [load(model, row, 0, using)[0] for row in rows]


def attach(instance: Model, name: str, related: Model | None) -> None:
    """Set a loaded foreign object as select_related() would: `instance.<name>` answers without a query."""
    instance._meta.get_field(name).set_cached_value(instance, related)


def _listened(model: type[Model]) -> bool:
    return signals.pre_save.has_listeners(model) or signals.post_save.has_listeners(model)


@cache
def _insert_sql(model: type[Model], returning: bool) -> tuple[str, tuple[Field, ...]]:
    fields = tuple(field for field in _fields(model) if not field.primary_key)
    sql = (
        f"INSERT INTO {model._meta.db_table} ({', '.join(_quoted(field.column) for field in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    return (sql + f" RETURNING {model._meta.pk.column}" if returning else sql), fields


def insert(instance: M, using: str = "default") -> M:
    """instance.save(force_insert=True) for a model with an automatic primary key: one INSERT, pk set."""
    model = type(instance)
    if _listened(model):
        instance.save(using=using, force_insert=True)
        return instance
    connection = connections[using]
    returning = connection.features.can_return_columns_from_insert
    sql, fields = _insert_sql(model, returning)
    values = [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        if returning:
            (instance.pk,) = cursor.fetchone()
        else:
            instance.pk = connection.ops.last_insert_id(cursor, model._meta.db_table, model._meta.pk.column)
    instance._state.adding, instance._state.db = False, using
    return instance


def _pk(value: Any) -> Any:
    """A related object's key, as the ORM writes a foreign key assigned an instance."""
    return value.pk if isinstance(value, Model) else value


@cache
def _update_sql(model: type[Model], names: tuple[str, ...], where: tuple[str, ...], extra: str) -> str:
    meta = model._meta
    sets = [f"{_quoted(meta.get_field(name).column)} = %s" for name in names]
    if extra:
        sets.append(extra)
    conditions = " AND ".join(f"{_quoted(meta.get_field(name).column)} = %s" for name in where)
    return f"UPDATE {meta.db_table} SET {', '.join(sets)} WHERE {conditions}"


def update(
    model: type[Model], where: dict[str, Any], values: dict[str, Any], *, extra: str = "", using: str = "default"
) -> int:
    """`UPDATE model SET <values>[, <extra>] WHERE <where>` (each an equality); the number of rows it changed.

    QuerySet.filter(**where).update(**values) without the QuerySet: values are plain values (no expressions; put a
    column expression such as `version = version + 1` in `extra`, SQL written by the caller, never user input).
    """
    connection = connections[using]
    meta = model._meta
    sql = _update_sql(model, tuple(values), tuple(where), extra)
    params = [meta.get_field(name).get_db_prep_save(_pk(value), connection) for name, value in values.items()]
    params += [meta.get_field(name).get_db_prep_value(_pk(value), connection) for name, value in where.items()]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def save_fields(instance: Model, names: Sequence[str], using: str = "default") -> None:
    """instance.save(update_fields=names) as one UPDATE by primary key (auto_now fields included when named)."""
    model = type(instance)
    if _listened(model):
        instance.save(using=using, update_fields=list(names))
        return
    meta = model._meta
    values = {name: meta.get_field(name).pre_save(instance, False) for name in names}
    update(model, {meta.pk.name: instance.pk}, values, using=using)

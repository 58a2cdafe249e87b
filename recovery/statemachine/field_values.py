"""Rows in and out of the hot paths' own statements without the ORM's per-value detours (docs/benchmarks.md, the
protected benchmark's fifth round): a value that its field would hand to the driver unchanged goes as it is, and a
row read back becomes an instance as Model.from_db makes it. Anything else takes the ORM's own way. And statements
that need nothing from each other's answers sent together (pipeline()).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import cache
from typing import Any

from django.db import models
from django.db.models import Model, signals
from django.db.models.base import ModelState

# The field classes whose get_db_prep_save() hands a value of this exact type (or None) to the driver unchanged,
# but for the backend's adaptation of integers (psycopg's Int2/Int4/Int8 on PostgreSQL, so that a statement's
# parameter types do not change with the values): their get_prep_value() is to_python() or int() of it.
_UNCHANGED: dict[type, type] = {
    models.AutoField: int,
    models.BigAutoField: int,
    models.SmallAutoField: int,
    models.BooleanField: bool,
    models.CharField: str,
    models.TextField: str,
}
_INTEGERS = (
    models.IntegerField,
    models.BigIntegerField,
    models.SmallIntegerField,
    models.PositiveIntegerField,
    models.PositiveBigIntegerField,
    models.PositiveSmallIntegerField,
)


def _shortcut(field: models.Field, vendor: str) -> tuple[type | None, str]:
    """(the type its values take unchanged, or None; the internal type its integers are adapted as, or "")."""
    target = field.target_field if isinstance(field, models.ForeignKey) else field
    if type(target) in _INTEGERS:
        return int, target.get_internal_type()
    stamped = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
    if type(target) is models.DateTimeField and vendor == "postgresql" and not stamped:
        return datetime, ""  # an aware one: PostgreSQL's adapt_datetimefield_value() keeps it as it is
    return _UNCHANGED.get(type(target)), ""


@cache
def _plan(model: type[Model], fields: tuple[models.Field, ...], vendor: str) -> tuple[tuple[str, Any, str, Any], ...]:
    return tuple((field.attname, *_shortcut(field, vendor), field) for field in fields)


def prepared(instance: Model, fields: tuple[models.Field, ...], connection, *, pre_save: bool = True) -> list:
    """`[field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]` (`pre_save=False`:
    each field's value as the instance holds it), the values that would come out unchanged taken as they are."""
    out = []
    adapt = connection.ops.adapt_integerfield_value
    for attname, kind, integer, field in _plan(type(instance), fields, connection.vendor):
        if kind is not None:
            value = instance.__dict__.get(attname)
            if value is None or (type(value) is kind and (kind is not datetime or value.tzinfo is not None)):
                out.append(adapt(value, integer) if integer and value is not None else value)
                continue
        value = field.pre_save(instance, True) if pre_save else getattr(instance, attname)
        out.append(field.get_db_prep_save(value, connection))
    return out


def from_row(model: type[Model], alias: str, attnames: Sequence[str], values: Sequence) -> Model:
    """Model.from_db(alias, attnames, values) for a row of every concrete field in order: the instance's attributes
    set directly, as Model.__init__ sets them from positional values, where nobody listens to its init signals."""
    if signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model):
        return model.from_db(alias, attnames, values)
    instance = model.__new__(model)
    instance.__dict__.update(zip(attnames, values, strict=True))
    state = ModelState()
    state.adding, state.db = False, alias
    instance._state = state
    return instance


@contextmanager
def pipeline(connection) -> Iterator[None]:
    """psycopg's pipeline mode on `connection` (PostgreSQL) for the statements inside: sent without waiting for each
    one's answer; a statement whose rows are read waits for it and every one sent before it, in one round trip, and
    the rest are answered together when the block ends. A failure is raised there as Django's error."""
    connection.ensure_connection()
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield

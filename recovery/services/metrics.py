"""The metrics fold (docs/metrics.md, "How the figures are kept"): audit events past the watermark, folded into rollups.
Each batch is one transaction locking the watermark row: all or nothing, so a killed fold neither loses nor doubles
a count, and a second fold skips the run.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from recovery.engine.metrics import ALL_TOOLS, DAY, HOUR, CallMark, EventView, FoldState, Key, fold_event
from recovery.models import AuditEvent, MetricCallMark, MetricFold, MetricRollup, MetricTotal, Tool

WATERMARK = "audit"
BATCH = 2000
_MARK_FIELDS = (
    "cohort", "attempts", "unknown", "settled", "human", "duplicate", "committed", "queue", "queue_since", "claimed",
)  # fmt: skip
_EVENT_FIELDS = (
    "seq",
    "action",
    "from_state",
    "to_state",
    "actor_kind",
    "evidence",
    "created_at",
    "call_id",
    "call__tool_id",
    "call__tenant_id",
    "call__side_effect",
    "task__tenant_id",
)


def metrics_fold(*, batch: int = BATCH, seconds: float | None = None) -> int:
    """Fold the events past the watermark, `batch` at a time, until none is left (or `seconds` have passed, when
    given: a periodic run leaves the rest to the next); how many were folded. 0 when another fold holds the row."""
    started = time.monotonic()
    MetricFold.objects.get_or_create(key=WATERMARK)
    folded = 0
    while True:
        done = _fold_batch(batch)
        folded += max(done, 0)
        if done < batch or (seconds is not None and time.monotonic() - started >= seconds):
            return folded


def _fold_batch(batch: int) -> int:
    with transaction.atomic():
        fold = MetricFold.objects.select_for_update(skip_locked=True).filter(key=WATERMARK).first()
        if fold is None:
            return -1  # another fold is running: it holds the row, and the events
        rows = list(AuditEvent.objects.filter(seq__gt=fold.seq).order_by("seq").values_list(*_EVENT_FIELDS)[:batch])
        if not rows:
            return 0
        marks = _marks({row[7] for row in rows if row[7]})
        state = FoldState(open_breakers={int(tool): at for tool, at in (fold.open_breakers or {}).items()})
        tools = _breaker_tools(rows)
        counts: Counter[Key] = Counter()
        touched: set[int] = set()
        for row in rows:
            event = _view(row, tools)
            mark = marks.setdefault(event.call_id, CallMark()) if event.call_id else None
            fold_event(event, mark, state, counts)
            if event.call_id:
                touched.add(event.call_id)
        _add(counts)
        _store_marks({call_id: marks[call_id] for call_id in touched})
        MetricFold.objects.filter(pk=fold.pk).update(
            seq=rows[-1][0],
            open_breakers={str(tool): at for tool, at in state.open_breakers.items()},
            events=fold.events + len(rows),
            folded_at=timezone.now(),
        )
        return len(rows)


def _view(row: tuple, tools: dict[str, int]) -> EventView:
    seq, action, src, dst, actor_kind, evidence, at, call_id, tool_id, call_tenant, side_effect, task_tenant = row
    if action.startswith("breaker.") and isinstance(evidence, dict):
        tool_id = tools.get(str(evidence.get("tool", "")), 0)
    return EventView(
        seq=seq,
        action=action,
        at=at,
        actor_kind=actor_kind,
        from_state=src,
        to_state=dst,
        evidence=evidence,
        call_id=call_id,
        tool_id=tool_id or 0,
        tenant_id=call_tenant or task_tenant or 0,
        side_effect=side_effect or "",
    )


def _breaker_tools(rows: list[tuple]) -> dict[str, int]:
    """Breaker events name their tool in the evidence: its id, by name (one small query, when there are any)."""
    names = {str(row[5].get("tool")) for row in rows if row[1].startswith("breaker.") and isinstance(row[5], dict)}
    return dict(Tool.objects.filter(name__in=names).values_list("name", "id")) if names else {}


def _marks(call_ids: set[int]) -> dict[int, CallMark]:
    found = MetricCallMark.objects.filter(call_id__in=call_ids).values_list("call_id", *_MARK_FIELDS)
    return {row[0]: CallMark(**dict(zip(_MARK_FIELDS, row[1:], strict=True))) for row in found}


def _store_marks(marks: dict[int, CallMark]) -> None:
    rows = [
        MetricCallMark(call_id=call_id, **{f: getattr(mark, f) for f in _MARK_FIELDS})
        for call_id, mark in marks.items()
    ]
    MetricCallMark.objects.bulk_create(
        rows, batch_size=500, update_conflicts=True, unique_fields=["call"], update_fields=list(_MARK_FIELDS)
    )


# Raw SQL (docs/architecture.md, the data layer), the fold's one write path: an upsert that adds to a counter, which the
# ORM cannot say (its conflict update sets columns, it does not add to them). Held equal to the ORM's reading by
# tests/test_metrics_fold.py (the rollups against a recomputation from the raw rows).
_ROLLUP = MetricRollup._meta.db_table
_TOTAL = MetricTotal._meta.db_table
_ROLLUP_COLUMNS = ("period", "start", "tenant_id", "tool_id", "series", "label", "value")
_TOTAL_COLUMNS = ("tenant_id", "tool_id", "series", "label", "value")
_ADD_ROLLUP = (
    f"INSERT INTO {_ROLLUP} ({', '.join(_ROLLUP_COLUMNS)}) {{rows}} "
    f"ON CONFLICT (period, tenant_id, start, tool_id, series, label) "
    f"DO UPDATE SET value = {_ROLLUP}.value + excluded.value"
)
_ADD_TOTAL = (
    f"INSERT INTO {_TOTAL} ({', '.join(_TOTAL_COLUMNS)}) {{rows}} "
    f"ON CONFLICT (tenant_id, tool_id, series, label) DO UPDATE SET value = {_TOTAL}.value + excluded.value"
)


def _add(counts: Counter[Key]) -> None:
    """Add each count to its hour and its day, for its tenant and for every tenant (tenant 0), each for its tool and
    for every tool (ALL_TOOLS); and to the totals, per tool (what Prometheus exports)."""
    rollups: Counter[tuple[int, int, int, int, str, str]] = Counter()
    totals: Counter[tuple[int, int, str, str]] = Counter()
    for (hour, tenant, tool, series, label), n in counts.items():
        if not n:
            continue
        for scope in {0, tenant}:
            for level in (tool, ALL_TOOLS):
                rollups[(HOUR, hour, scope, level, series, label)] += n
                rollups[(DAY, hour // DAY * DAY, scope, level, series, label)] += n
            totals[(scope, tool, series, label)] += n
    _upsert(_ADD_ROLLUP, _ROLLUP_COLUMNS, [(*key, n) for key, n in sorted(rollups.items())])
    _upsert(_ADD_TOTAL, _TOTAL_COLUMNS, [(*key, n) for key, n in sorted(totals.items())])


def _upsert(sql: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    # One row per statement through executemany: parsed once, and psycopg pipelines the rows (a multi-row VALUES list
    # of a new length each time spent most of the fold's time in psycopg's query parser; an unnest of arrays on
    # PostgreSQL measured no faster). Each key once and in sorted order: two folds never run at once (the
    # watermark's lock), but a sorted order is the cheap guarantee that an upsert never deadlocks with another writer.
    if not rows:
        return
    values = "VALUES (" + ", ".join(["%s"] * len(columns)) + ")"
    with connection.cursor() as cursor:
        cursor.executemany(sql.format(rows=values), rows)


def metrics_watermark() -> tuple[int, datetime | None]:
    """How far the fold has read (the last folded seq) and when it last ran."""
    row = MetricFold.objects.filter(key=WATERMARK).values_list("seq", "folded_at").first()
    return row if row else (0, None)

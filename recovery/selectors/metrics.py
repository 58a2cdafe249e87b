"""Reads of the metrics (docs/metrics.md) for the metrics page, the overview, `GET /api/v1/metrics` and `/metrics`.
Only the fold's rollups, the queue sizes and breaker states, never the history: a fixed number of statements whatever
the data's size (tests/test_metrics_cost.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import BigIntegerField, Count, Exists, ExpressionWrapper, F, Q, QuerySet, Sum, Value

from recovery.engine import metrics as m
from recovery.models import AuditEvent, Breaker, Call, MetricFold, MetricRollup, MetricTotal, Tenant, Tool
from recovery.registry.policy import breaker_policy
from recovery.selectors.breakers import view_of_state
from recovery.selectors.mcp_metrics import Hold, exact_quantile, holds


@dataclass(frozen=True, kw_only=True)
class Window:
    key: str
    title: str
    period: int  # the rollups it reads: hourly or daily
    step: int  # seconds per point
    points: int


WINDOWS: dict[str, Window] = {
    "24h": Window(key="24h", title="24 hours", period=m.HOUR, step=m.HOUR, points=24),
    "7d": Window(key="7d", title="7 days", period=m.HOUR, step=6 * m.HOUR, points=28),
    "30d": Window(key="30d", title="30 days", period=m.DAY, step=m.DAY, points=30),
}
DEFAULT_WINDOW = "24h"


@dataclass(frozen=True, kw_only=True)
class Point:
    start: datetime
    value: float | None  # None: nothing to divide (a rate over no calls), or no sample


@dataclass(frozen=True, kw_only=True)
class FigureValue:
    figure: m.Figure
    value: float | None  # the window's figure: a count, a share (0..1), a mean, seconds, or the p95 (quantiles)
    numerator: int | None = None  # rate and ratio
    denominator: int | None = None
    median: float | None = None  # quantiles
    count: int | None = None  # quantiles: items resolved; duration: breaker openings
    by_label: tuple[tuple[str, float], ...] = ()  # counts per label (per queue: the p95)
    series: tuple[Point, ...] = ()


@dataclass(frozen=True, kw_only=True)
class MetricsReport:
    window: Window
    start: datetime
    end: datetime
    now: datetime
    figures: tuple[FigureValue, ...]
    queues: dict[str, int]  # items in each queue now
    folded_at: datetime | None  # the figures include every event up to then
    lag_s: float | None
    # The rollups read: series -> label -> count per point (the overview's flow chart draws two stored series that
    # are no figure of their own). Left out of equality and repr: it is the figures' input, not a result.
    grid: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict, compare=False, repr=False)

    def figure(self, key: str) -> FigureValue:
        return next(value for value in self.figures if value.figure.key == key)

    def points(self, series: str, labels: Callable[[str], bool] | None = None) -> tuple[int, ...]:
        """A stored series' count per point of the window, summed over its labels (those `labels` accepts)."""
        found = self.grid.get(series, {})
        accepted = [values for label, values in found.items() if labels is None or labels(label)]
        return tuple(sum(values[i] for values in accepted) for i in range(self.window.points))


def _scope(tool_id: int | None, tenant_ids: tuple[int, ...] | None) -> Q:
    """The rollup rows of one tool, or every tool's sum (ALL_TOOLS: a window's rows then do not grow with the number
    of tools), for every tenant (tenant 0) or some."""
    scope = Q(tenant_id=0) if tenant_ids is None else Q(tenant_id__in=tenant_ids)
    return scope & Q(tool_id=tool_id or m.ALL_TOOLS)


def metrics_report(
    *,
    now: datetime,
    window: str = DEFAULT_WINDOW,
    tool_id: int | None = None,
    tenant_ids: tuple[int, ...] | None = None,
    with_queues: bool = True,
) -> MetricsReport:
    """The figures of `window` up to `now`, for one tool or all, for the given tenants or all (tenant_ids None);
    `with_queues` False leaves out the current queue sizes (a reader that counts its queues itself)."""
    win = WINDOWS[window]
    now_s = int(now.timestamp())
    first = now_s // win.step * win.step - (win.points - 1) * win.step
    point = ExpressionWrapper((F("start") - Value(first)) / Value(win.step), output_field=BigIntegerField())
    scope, shared_tools = _scope(tool_id, tenant_ids), None
    if tenant_ids is not None:
        # Breakers are every tenant's (kept under tenant 0): some tenants see those of the tools they may use.
        shared_tools = set(_tools_of(tenant_ids).values_list("id", flat=True))
        if tool_id:
            shared_tools &= {tool_id}
        if every_tenant(tenant_ids):
            # Every tenant's sum is kept already (tenant 0): read it rather than add up each tenant's rows (a token
            # of all 20 tenants read 20 times the rows, 3.6 to 8.9 times slower at 1,000,000 calls).
            scope = _scope(tool_id, None) & ~Q(series__in=SHARED_SERIES)
        scope |= Q(tenant_id=0, series__in=SHARED_SERIES, tool_id__in=sorted(shared_tools))
    rows = (
        MetricRollup.objects.filter(scope, period=win.period, start__gte=first)
        .annotate(point=point)
        .values("point", "series", "label")
        .annotate(n=Sum("value"))
        .order_by()
    )
    grid: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0] * win.points))
    for row in rows:
        if 0 <= row["point"] < win.points:
            grid[row["series"]][row["label"]][row["point"]] += row["n"]
    fold = MetricFold.objects.filter(key="audit").values_list("open_breakers", "folded_at").first()
    open_breakers, folded_at = fold if fold else ({}, None)
    opened = {int(tool): since for tool, since in (open_breakers or {}).items()}
    if shared_tools is not None:
        opened = {tool: since for tool, since in opened.items() if tool in shared_tools}
    _add_open_breakers(grid, opened, tool_id, first, win, now_s)
    starts = [datetime.fromtimestamp(first + i * win.step, tz=UTC) for i in range(win.points)]
    figures = tuple(_figure(figure, grid, starts) for figure in m.FIGURES)
    held = holds(since=starts[0], tenant_ids=tenant_ids, tool_id=tool_id)
    figures += hold_figures([hold for hold in held if hold.held_at <= now], starts, win.step)
    return MetricsReport(
        window=win,
        start=starts[0],
        end=now,
        now=now,
        figures=figures,
        queues=queue_sizes(tool_id=tool_id, tenant_ids=tenant_ids) if with_queues else {},
        folded_at=folded_at,
        lag_s=(now - folded_at).total_seconds() if folded_at else None,
        grid={series: {label: tuple(v) for label, v in labels.items()} for series, labels in grid.items()},
    )


def _add_open_breakers(grid, open_breakers: dict, tool_id: int | None, first: int, win: Window, now_s: int) -> None:
    """A breaker still open (as of the fold) counts its open time up to now."""
    for tool, since in open_breakers.items():
        if tool_id and int(tool) != tool_id:
            continue
        for hour, ms in m.open_ms_by_hour(float(since), float(now_s)):
            index = (hour - first) // win.step
            if 0 <= index < win.points:
                grid[m.BREAKER_OPEN_MS][""][index] += ms


def _figure(figure: m.Figure, grid, starts: list[datetime]) -> FigureValue:
    if figure.kind in ("rate", "ratio"):
        return _rate(figure, grid, starts)
    if figure.kind == "quantiles":
        return _quantiles(figure, grid, starts)
    labels = grid.get(figure.series, {})
    per_point = [sum(values[i] for values in labels.values()) for i in range(len(starts))]
    if figure.kind == "duration":  # milliseconds stored, seconds shown
        seconds = [ms / 1000 for ms in per_point]
        openings = sum(sum(v) for v in grid.get(m.BREAKER_OPENINGS, {}).values())
        return FigureValue(
            figure=figure,
            value=sum(seconds),
            count=openings,
            series=tuple(Point(start=s, value=v) for s, v in zip(starts, seconds, strict=True)),
        )
    by_label = tuple(sorted(((label, sum(values)) for label, values in labels.items()), key=lambda p: (-p[1], p[0])))
    return FigureValue(
        figure=figure,
        value=sum(per_point),
        by_label=by_label,
        series=tuple(Point(start=s, value=v) for s, v in zip(starts, per_point, strict=True)),
    )


def _sum_labels(grid, series: str, labels: frozenset[str]) -> list[int]:
    found = grid.get(series, {})
    points = len(next(iter(found.values()))) if found else 0
    return [sum(v[i] for label, v in found.items() if not labels or label in labels) for i in range(points)]


def _rate(figure: m.Figure, grid, starts: list[datetime]) -> FigureValue:
    nums = _sum_labels(grid, figure.numerator, figure.numerator_labels) or [0] * len(starts)
    dens = _sum_labels(grid, figure.denominator, frozenset()) or [0] * len(starts)
    num, den = sum(nums), sum(dens)
    by_label = ()
    if figure.numerator == figure.denominator:  # task outcomes: list them all
        labels = grid.get(figure.denominator, {})
        by_label = tuple(sorted(((label, sum(v)) for label, v in labels.items()), key=lambda p: (-p[1], p[0])))
    return FigureValue(
        figure=figure,
        value=num / den if den else None,
        numerator=num,
        denominator=den,
        by_label=by_label,
        series=tuple(Point(start=s, value=(n / d if d else None)) for s, n, d in zip(starts, nums, dens, strict=True)),
    )


def histogram(labels: dict[str, list[int] | int], queue: str | None = None) -> list[tuple[float, int]]:
    """Cumulative (upper bound, count) pairs of the resolution buckets, for one queue or all."""
    exact = dict.fromkeys(m.RESOLUTION_BUCKETS_S, 0)
    for label, values in labels.items():
        name, le = m.split_bucket_label(label)
        if queue is not None and name != queue:
            continue
        bound = math.inf if le == "+Inf" else float(le)
        exact[bound] = exact.get(bound, 0) + (sum(values) if isinstance(values, list) else values)
    running, cumulative = 0, []
    for bound in m.RESOLUTION_BUCKETS_S:
        running += exact[bound]
        cumulative.append((bound, running))
    return cumulative


def _quantiles(figure: m.Figure, grid, starts: list[datetime]) -> FigureValue:
    labels = grid.get(m.RESOLUTIONS, {})
    whole = histogram(labels)
    per_point = []
    for i in range(len(starts)):
        point = histogram({label: values[i] for label, values in labels.items()})
        per_point.append(m.quantile(0.95, point))
    queues = sorted({m.split_bucket_label(label)[0] for label in labels})
    by_queue = tuple((queue, m.quantile(0.95, histogram(labels, queue)) or 0.0) for queue in queues)
    return FigureValue(
        figure=figure,
        value=m.quantile(0.95, whole),
        median=m.quantile(0.5, whole),
        count=whole[-1][1] if whole else 0,
        by_label=by_queue,
        series=tuple(Point(start=s, value=v) for s, v in zip(starts, per_point, strict=True)),
    )


QUEUE_STATES = {name: tuple(sorted(states)) for name, states in m.QUEUES.items()}


def queue_sizes(*, tool_id: int | None = None, tenant_ids: tuple[int, ...] | None = None) -> dict[str, int]:
    """Items in each queue now: one count of the open backlog by state (an index-only scan of call_backlog_idx),
    never of settled history."""
    calls = Call.objects.filter(state__in=[s for states in QUEUE_STATES.values() for s in states])
    if tool_id:
        calls = calls.filter(tool_id=tool_id)
    if tenant_ids is not None:
        calls = calls.filter(tenant_id__in=tenant_ids)
    by_state = dict(calls.values_list("state").annotate(n=Count("id")).order_by())
    return {name: sum(by_state.get(s, 0) for s in states) for name, states in QUEUE_STATES.items()}


# --- totals, for Prometheus -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Totals:
    counts: dict[str, list[tuple[int, str, int]]]  # series -> [(tool id, label, value)]
    tools: dict[int, str]  # tool id -> name, for every tool counted or with a breaker
    queues: dict[str, int]
    breakers: dict[int, str]  # tool id -> its breaker's state as admission reads it now
    folded_seq: int
    folded_at: datetime | None
    unfolded_since: datetime | None = None  # when the oldest audit event not folded yet was written (None: none)


# Series about a tool's breaker, which every tenant shares: the fold keeps them for all tenants (tenant 0) only, and a
# read for some tenants' totals (a token's) takes them from there.
SHARED_SERIES = (m.BREAKER_OPEN_MS, m.BREAKER_OPENINGS)


def metrics_totals(*, now: datetime, tenant_ids: tuple[int, ...] | None = None) -> Totals:
    """Every series' count since the beginning, per tool and label (summed over `tenant_ids`, or every tenant)."""
    scope = Q(tenant_id=0) if tenant_ids is None else Q(tenant_id__in=tenant_ids)  # totals are per tool only
    if tenant_ids is not None and every_tenant(tenant_ids):
        scope = Q(tenant_id=0)  # every tenant's sum, kept as such (see metrics_report)
    elif tenant_ids is not None:
        scope |= Q(tenant_id=0, series__in=SHARED_SERIES)
    rows = (
        MetricTotal.objects.filter(scope)
        .values_list("tool_id", "series", "label")
        .annotate(n=Sum("value"))
        .order_by("series", "tool_id", "label")
    )
    counts: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for tool_id, series, label, n in rows:
        counts[series].append((tool_id, label, n))
    breakers, names = {}, {}
    for row in Breaker.objects.select_related("tool").only(
        "tool__name", "tool__breaker", "state", "opened_at", "probes_reserved", "probe_lease_until"
    ):
        names[row.tool_id] = row.tool.name
        state = (row.state, row.opened_at, row.probes_reserved, row.probe_lease_until)
        breakers[row.tool_id] = view_of_state(state, breaker_policy(row.tool), now).state
    counted = {tool_id for values in counts.values() for tool_id, _, _ in values if tool_id}
    if missing := counted - set(names):
        names.update(dict(Tool.objects.filter(pk__in=missing).values_list("id", "name")))
    fold = MetricFold.objects.filter(key="audit").values_list("seq", "folded_at").first() or (0, None)
    # How far behind the counts are: the oldest event past the watermark (the unique index on seq finds it at once).
    unfolded = AuditEvent.objects.filter(seq__gt=fold[0]).order_by("seq").values_list("created_at", flat=True)[:1]
    return Totals(
        counts=dict(counts),
        tools=names,
        queues=queue_sizes(tenant_ids=tenant_ids),
        breakers=breakers,
        folded_seq=fold[0],
        folded_at=fold[1],
        unfolded_since=next(iter(unfolded), None),
    )


def every_tenant(tenant_ids: tuple[int, ...]) -> bool:
    """Whether the tenants are all there are (a scraper's token, say): their sum is the tenant-0 rollups'."""
    return not Tenant.objects.exclude(pk__in=tenant_ids).exists()


def _tools_of(tenant_ids: tuple[int, ...]) -> QuerySet[Tool]:
    """The tools any of the tenants may use, by their ids."""
    every_tool = Exists(Tenant.objects.filter(pk__in=tenant_ids, all_tools=True))
    return Tool.objects.filter(Q(tenants__in=tenant_ids) | Q(every_tool)).distinct()


def tools_of_tenants(tenants: list[Tenant]) -> QuerySet[Tool]:
    """The tools any of `tenants` may use (their capabilities): the tools a token's metrics may name."""
    if any(tenant.all_tools for tenant in tenants):
        return Tool.objects.all()
    return Tool.objects.filter(tenants__in=[tenant.pk for tenant in tenants]).distinct()


def hold_figures(found: list[Hold], starts: list[datetime], step_s: int) -> tuple[FigureValue, FigureValue]:
    """The hold figures (recovery.engine.metrics.HOLD_FIGURES) of a window whose points begin at `starts`."""
    count_figure, wait_figure = m.HOLD_FIGURES
    step = timedelta(seconds=step_s)

    def point_of(at: datetime) -> int:
        return next((i for i, start in enumerate(starts) if start <= at < start + step), len(starts) - 1)

    counts = [0] * len(starts)
    waits: list[list[float]] = [[] for _ in starts]
    servers: dict[str, int] = {}
    for hold in found:
        counts[point_of(hold.held_at)] += 1
        servers[hold.server] = servers.get(hold.server, 0) + 1
        if hold.wait_s is not None:
            waits[point_of(hold.held_at)].append(hold.wait_s)
    every_wait = [w for point in waits for w in point]
    return (
        FigureValue(
            figure=count_figure,
            value=len(found),
            by_label=tuple(sorted(servers.items(), key=lambda p: (-p[1], p[0]))),
            series=tuple(Point(start=s, value=n) for s, n in zip(starts, counts, strict=True)),
        ),
        FigureValue(
            figure=wait_figure,
            value=exact_quantile(0.95, every_wait),
            median=exact_quantile(0.5, every_wait),
            count=len(every_wait),
            series=tuple(Point(start=s, value=exact_quantile(0.95, w)) for s, w in zip(starts, waits, strict=True)),
        ),
    )

"""The metrics of docs/metrics.md as Prometheus text: counters from the fold's totals, gauges read now.
No metric carries a tenant, a call or a task id; `scrape()` builds a fresh registry per request, nothing global.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from recovery.engine import metrics as m
from recovery.models import BreakerState
from recovery.selectors.mcp_metrics import Hold, holds
from recovery.selectors.metrics import SHARED_SERIES, Totals, metrics_totals
from recovery.selectors.notifications import NotificationFigures, notification_figures

PREFIX = "recovery_"
# The breaker gauge's values, in the order of how little gets through.
BREAKER_STATE_VALUES = {
    BreakerState.CLOSED: 0,
    BreakerState.HALF_OPEN: 1,
    BreakerState.OPEN: 2,
    BreakerState.FORCED_OPEN: 3,
}


@dataclass(frozen=True, kw_only=True)
class CounterSpec:
    """One stored series exported as a counter: its name (without `_total`), its label, what it counts."""

    name: str
    series: str
    label: str = ""  # the name of the series' label in Prometheus ("" for none)
    help: str
    per_tool: bool = True
    scale: float = 1  # stored milliseconds exported as seconds: 0.001
    zero: str = ""  # "calls": 0 for every tool with calls; "breakers": 0 for every tool shown a breaker state


COUNTERS: tuple[CounterSpec, ...] = (
    CounterSpec(
        name="attempts",
        series=m.ATTEMPTS,
        label="outcome",
        help="Attempts whose outcome is known, by the call state it led to (committed, unknown, retryable...), "
        "no_outcome when none arrived in time, reconcile_replay for replay reconciliation's same-key replay.",
    ),
    CounterSpec(
        name="failures",
        series=m.FAILURES,
        label="class",
        help="Failed attempts by failure class (transient, outcome_unknown, invalid_arguments, ...).",
    ),
    CounterSpec(
        name="decisions",
        series=m.DECISIONS,
        label="route",
        help="Recovery decision cards for failed attempts, by route (retry, reconcile, repair, escalate, ...).",
    ),
    CounterSpec(
        name="actions",
        series=m.ACTIONS,
        label="action",
        help="Operator action requests executed after their approval, by kind (replay, reconcile_now, ...).",
    ),
    CounterSpec(
        name="calls",
        zero="calls",
        series=m.CALLS,
        help="Calls that made their first attempt.",
    ),
    CounterSpec(
        name="write_calls",
        zero="calls",
        series=m.WRITE_CALLS,
        help="Write calls that made their first attempt: the unknown-outcome and duplicate rates' denominator.",
    ),
    CounterSpec(
        name="unknown_outcomes",
        zero="calls",
        series=m.UNKNOWN_CALLS,
        help="Write calls that entered UNKNOWN (each call once, however often), counted when it first did.",
    ),
    CounterSpec(
        name="unknown_settled",
        zero="calls",
        series=m.UNKNOWN_SETTLED,
        help="Unknown write calls that reconciliation settled (COMMITTED or NOT_COMMITTED) with no person "
        "taking part, each call once.",
    ),
    CounterSpec(
        name="reconcile_checks",
        series=m.RECONCILE_CHECKS,
        label="result",
        help="Reconcile receipts (status queries, signed callbacks, idempotent replays) by what they observed.",
    ),
    CounterSpec(
        name="duplicate_side_effects",
        zero="calls",
        series=m.DUPLICATE_CALLS,
        help="Write calls (keys) for which a receipt saw more business effects than the key allows, each once.",
    ),
    CounterSpec(
        name="committed_calls",
        zero="calls",
        series=m.COMMITTED_CALLS,
        help="Calls that committed, each once.",
    ),
    CounterSpec(
        name="committed_retries",
        zero="calls",
        series=m.COMMITTED_RETRIES,
        help="Attempts beyond the first that committed calls took, counted when they committed (divided by "
        "recovery_committed_calls_total: retries per successful call).",
    ),
    CounterSpec(
        name="human_takeovers",
        series=m.HUMAN_TAKEOVERS,
        label="reason",
        help="Calls moved to HUMAN_REVIEW, by why (poll_budget_exhausted, duplicate_effect, escalated, ...).",
    ),
    CounterSpec(
        name="budget_exhausted",
        series=m.BUDGET_EXHAUSTED,
        label="reason",
        help="Calls that ended on an exhausted budget, by the outcome (retry_exhausted, deadline_exceeded, ...).",
    ),
    CounterSpec(
        name="task_outcomes",
        series=m.TASK_OUTCOMES,
        label="outcome",
        per_tool=False,
        help="Tasks submitted or abandoned, by outcome (completed is a success).",
    ),
    CounterSpec(
        name="queue_entries",
        series=m.QUEUE_ENTRIES,
        label="queue",
        help="Calls that entered a queue (unknown, human_review, compensation).",
    ),
    CounterSpec(
        name="breaker_open_seconds",
        zero="breakers",
        series=m.BREAKER_OPEN_MS,
        scale=0.001,
        help="Seconds the tool's breaker spent open, half-open or forced open, added when it closes again (a "
        "breaker open now is recovery_breaker_state; closed periods only, so the counter never goes back).",
    ),
    CounterSpec(
        name="breaker_openings",
        zero="breakers",
        series=m.BREAKER_OPENINGS,
        help="Times the tool's breaker opened or was forced open.",
    ),
    CounterSpec(
        name="compensations",
        series=m.COMPENSATIONS,
        label="result",
        help="Compensation ledger entries started, and those that committed or failed.",
    ),
    CounterSpec(
        name="probes",
        series=m.PROBES,
        label="decision",
        help="Duplicate probes recorded, by decision (safe: the provider deduplicated; unsafe: a second effect).",
    ),
    CounterSpec(
        name="mcp_gateway_calls",
        series=m.MCP_CALLS,
        label="server",
        help="Calls registered through the MCP gateway, by MCP server (a re-issue answered from its call is none).",
    ),
    CounterSpec(
        name="mcp_reissues_absorbed",
        series=m.MCP_REISSUES,
        label="server",
        help="Duplicates prevented: re-issues of a gateway write answered from the call they repeat, never sent.",
    ),
)


class RecoveryCollector(Collector):
    """The metrics of one scrape, from totals read once (`totals`), as of `now`.

    `tools`: the tool ids whose breakers the scraper may see besides those of the tools it has calls of (None: all).
    """

    def __init__(self, totals: Totals, *, now: datetime, tools: set[int] | None = None):
        self.totals, self.now, self.tools = totals, now, tools
        # A series Prometheus has not seen before starts at its first value, and increase() misses that first step:
        # the counters without a label of their own start at 0 for every tool they can count (a first duplicate
        # side effect is one to see), and every tool with calls gets a breaker state (no breaker row: closed).
        with_calls = {tool_id for tool_id, _, _ in totals.counts.get(m.CALLS, []) if tool_id}
        self.visible = None if tools is None else tools | with_calls  # whose breakers this scrape shows
        shown = {tool_id: state for tool_id, state in totals.breakers.items() if self._shows(tool_id)}
        self.breaker_states = {tool_id: BreakerState.CLOSED for tool_id in with_calls} | shown
        self.zero = {"calls": with_calls, "breakers": set(self.breaker_states)}

    def _shows(self, tool_id: int) -> bool:
        return self.visible is None or tool_id in self.visible

    def _tool(self, tool_id: int) -> str:
        return self.totals.tools.get(tool_id, str(tool_id)) if tool_id else ""

    def _rows(self, series: str) -> list[tuple[int, str, int]]:
        rows = self.totals.counts.get(series, [])
        if series in SHARED_SERIES:
            rows = [row for row in rows if self._shows(row[0])]
        return rows

    def collect(self) -> Iterator[Metric]:
        for spec in COUNTERS:
            yield self._counter(spec)
        yield self._resolution()
        yield self._first_claim()
        yield self._queues()
        yield self._breakers()
        yield from self._fold()

    def _counter(self, spec: CounterSpec) -> CounterMetricFamily:
        labels = (["tool"] if spec.per_tool else []) + ([spec.label] if spec.label else [])
        family = CounterMetricFamily(PREFIX + spec.name, spec.help, labels=labels)
        summed: dict[tuple[str, ...], int] = defaultdict(int)
        for tool_id in self.zero.get(spec.zero, ()):
            summed[(self._tool(tool_id),)] += 0
        for tool_id, label, n in self._rows(spec.series):
            key = ((self._tool(tool_id),) if spec.per_tool else ()) + ((label,) if spec.label else ())
            summed[key] += n
        for key, n in sorted(summed.items()):
            family.add_metric(list(key), n * spec.scale)
        return family

    def _resolution(self) -> HistogramMetricFamily:
        return self._waits(
            "time_to_resolution_seconds",
            "How long queue items waited, from entering the queue's states to leaving them, counted when they "
            "left (every tool); use histogram_quantile for the median and the 95th percentile.",
            m.RESOLUTIONS,
            m.RESOLUTION_MS,
        )

    def _first_claim(self) -> HistogramMetricFamily:
        return self._waits(
            "time_to_first_claim_seconds",
            "How long queue items waited, from entering the queue's states to a reviewer's first claim on them "
            "there, counted at that claim (every tool; docs/notifications.md#due-times).",
            m.FIRST_CLAIMS,
            m.FIRST_CLAIM_MS,
        )

    def _waits(self, name: str, doc: str, series: str, ms_series: str) -> HistogramMetricFamily:
        family = HistogramMetricFamily(PREFIX + name, doc, labels=["queue"])
        exact: dict[str, dict[float, int]] = {queue: defaultdict(int) for queue in m.QUEUES}
        for _, label, n in self._rows(series):
            queue, le = m.split_bucket_label(label)
            exact.setdefault(queue, defaultdict(int))[math.inf if le == "+Inf" else float(le)] += n
        waited_ms: dict[str, int] = defaultdict(int)
        for _, queue, ms in self._rows(ms_series):
            waited_ms[queue] += ms
        for queue, counts in sorted(exact.items()):
            running, buckets = 0, []
            for bound in m.RESOLUTION_BUCKETS_S:
                running += counts.get(bound, 0)
                buckets.append((floatToGoString(bound), running))
            family.add_metric([queue], buckets, sum_value=waited_ms[queue] / 1000)
        return family

    def _queues(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            PREFIX + "queue_items",
            "Calls in each queue now (unknown: UNKNOWN and STILL_UNKNOWN; human_review; compensation: partly "
            "compensated or compensation failed).",
            labels=["queue"],
        )
        for queue, n in sorted(self.totals.queues.items()):
            family.add_metric([queue], n)
        return family

    def _breakers(self) -> GaugeMetricFamily:
        encoding = ", ".join(f"{value} {state}" for state, value in BREAKER_STATE_VALUES.items())
        family = GaugeMetricFamily(
            PREFIX + "breaker_state",
            f"Each tool's circuit breaker now, as admission reads it: {encoding}.",
            labels=["tool"],
        )
        for tool_id, state in sorted(self.breaker_states.items(), key=lambda item: self._tool(item[0])):
            family.add_metric([self._tool(tool_id)], BREAKER_STATE_VALUES.get(state, 0))
        return family

    def _fold(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            PREFIX + "metrics_fold_seq",
            "The last audit event (its seq) the metrics fold has counted: it stands still when the fold does.",
            value=self.totals.folded_seq,
        )
        since = self.totals.unfolded_since
        behind = max((self.now - since).total_seconds(), 0.0) if since else 0.0
        yield GaugeMetricFamily(
            PREFIX + "metrics_fold_age_seconds",
            "How far behind the counters are: seconds since the oldest audit event the metrics fold has not "
            "counted yet was written (0 when it has counted every one). Alert when it stays above a few fold "
            "periods (RECOVERY_METRICS_FOLD_EVERY_S): the fold has stalled.",
            value=behind,
        )


class NotificationCollector(Collector):
    """Notifications (docs/notifications.md): deliveries by status, tries by outcome, items past their due times."""

    def __init__(self, figures: NotificationFigures):
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        deliveries = GaugeMetricFamily(
            PREFIX + "notification_deliveries",
            "Notification deliveries by status now (pending, sending, sent, failed after their last try).",
            labels=["status"],
        )
        for status in ("pending", "sending", "sent", "failed"):
            deliveries.add_metric([status], self.figures.deliveries.get(status, 0))
        yield deliveries
        tries = CounterMetricFamily(
            PREFIX + "notification_tries",
            "Tries of notification deliveries by outcome (sent; failed: refused or an error answer; unknown: the "
            "receiver may have it, re-sent under the same delivery id).",
            labels=["outcome"],
        )
        for outcome in ("sent", "failed", "unknown"):
            tries.add_metric([outcome], self.figures.tries.get(outcome, 0))
        yield tries
        overdue = GaugeMetricFamily(
            PREFIX + "overdue_items",
            "Items waiting for a person past a due time now: claim (nobody holds it past RECOVERY_CLAIM_DUE_S) and "
            "resolution (past RECOVERY_SLA_S).",
            labels=["due"],
        )
        for due in ("claim", "resolution"):
            overdue.add_metric([due], self.figures.overdue.get(due, 0))
        yield overdue


class HoldCollector(Collector):
    """The MCP gateway's holds (docs/mcp-gateway.md): read from the holds themselves (recovery.selectors.mcp_metrics),
    each a gateway call whose admission was denied with approval_required."""

    def __init__(self, found: list[Hold]):
        self.found = found

    def collect(self) -> Iterator[Metric]:
        held = CounterMetricFamily(
            PREFIX + "mcp_holds",
            "Gateway calls held for approval (their admission denied with approval_required), each once, by MCP "
            "server.",
            labels=["server"],
        )
        servers: dict[str, int] = defaultdict(int)
        for hold in self.found:
            servers[hold.server] += 1
        for server, n in sorted(servers.items()):
            held.add_metric([server], n)
        yield held
        yield GaugeMetricFamily(
            PREFIX + "mcp_holds_waiting",
            "Gateway calls held for approval whose action request nobody has decided yet.",
            value=sum(1 for hold in self.found if hold.decided_at is None),
        )
        waits = [hold.wait_s for hold in self.found if hold.wait_s is not None]
        buckets, running = [], 0
        for bound in m.RESOLUTION_BUCKETS_S:
            running = sum(1 for w in waits if w <= bound)
            buckets.append((floatToGoString(bound), running))
        wait = HistogramMetricFamily(
            PREFIX + "mcp_approval_wait_seconds",
            "From a hold (the first approval_required denial) to the decision of the call's action request; use "
            "histogram_quantile for the median and the 95th percentile.",
        )
        wait.add_metric([], buckets, sum_value=sum(waits))
        yield wait


def scrape(*, now: datetime, tenant_ids: tuple[int, ...] | None = None, tools: set[int] | None = None) -> bytes:
    """The Prometheus text of the metrics, summed over `tenant_ids` (None: every tenant), showing the breakers of
    `tools` (None: every tool)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RecoveryCollector(metrics_totals(now=now, tenant_ids=tenant_ids), now=now, tools=tools))
    registry.register(HoldCollector(holds(tenant_ids=tenant_ids)))
    if tenant_ids is None:  # deliveries and due times span tenants: only an unscoped scrape shows them
        registry.register(NotificationCollector(notification_figures(now=now)))
    return generate_latest(registry)

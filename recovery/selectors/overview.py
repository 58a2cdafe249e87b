"""Reads of the overview (docs/console.md, "The overview"): open items, SLA breaches, open breakers, pending approvals,
and the last day's metrics. Seven statements whatever the history's size: the day's figures come from the metrics
rollups (recovery.selectors.metrics), never from the attempts or the audit trail.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Min, Q

from recovery.engine import breaker as rules
from recovery.engine import metrics as m
from recovery.engine.due import DUE_QUEUES, due_seconds
from recovery.engine.states import CallState
from recovery.engine.types import CLOSED, FAILURE_CLASSES
from recovery.models import Breaker, Call, StatusBreaker
from recovery.registry.policy import breaker_policy, status_breaker_policy
from recovery.selectors.approvals import pending_approvals_count
from recovery.selectors.due import late_q
from recovery.selectors.facts import status_breaker_state
from recovery.selectors.metrics import FigureValue, MetricsReport, metrics_report
from recovery.selectors.queues import queue_counts

S = CallState
UNKNOWN_STATES = (S.UNKNOWN, S.STILL_UNKNOWN)  # the UNKNOWN queue (states.UNSETTLED), in the index's order
QUEUE_STATES = {"unknown": UNKNOWN_STATES, "human-review": (S.HUMAN_REVIEW,)}
COMPENSATION = "compensation-problems"
EXACT = 10**12  # a count cap no backlog reaches: the overview counts exactly
DUE_SOON = timedelta(hours=1)  # "due soon" on the overview: resolution due within the next hour
WINDOW = "24h"  # recovery.selectors.metrics.WINDOWS: 24 hourly points, the current (partial) hour last
# The figures of docs/metrics.md the overview heads with, each a link to its section of the metrics page.
HEADLINES = (
    "unknown_outcome_rate",
    "reconcile_success_rate",
    "duplicate_effect_rate",
    "human_takeovers",
    "time_to_resolution",
)
# The MCP gateway's traffic over the day (docs/mcp-gateway.md, "The console's view").
GATEWAY = ("gateway_calls", "reissues_absorbed", "mcp_holds", "approval_wait")


@dataclass(frozen=True, kw_only=True)
class QueueLoad:
    slug: str  # console:queue's slug
    open: int  # exact
    oldest_at: datetime | None  # when the oldest open item entered its state
    # Of the open items, those past their due time (docs/notifications.md#due-times: the claim's while unclaimed,
    # the resolution's always) and those due within DUE_SOON. Compensation problems: of its PARTIAL_COMPENSATED and
    # COMPENSATION_FAILED calls, the states due times are set for (its other members wait on an entry, not a due time).
    overdue: int | None = None
    due_soon: int | None = None


@dataclass(frozen=True, kw_only=True)
class SlaBreaches:
    """One risk's SLA and, per queue, how many open items it has and how many are older than the SLA."""

    risk: str
    sla_s: int
    open: dict[str, int]  # queue slug -> open items of this risk
    breaches: dict[str, int]  # queue slug -> of those, older than sla_s


@dataclass(frozen=True, kw_only=True)
class OpenBreaker:
    kind: str  # "tool" or "status" (a provider's status endpoint)
    name: str  # the tool's or the provider's
    state: str  # as admission reads it now: open past its cooldown reads half_open
    stored: str
    since: datetime | None  # opened_at


@dataclass(frozen=True, kw_only=True)
class HourFlow:
    start: datetime
    entered: int  # calls that moved into UNKNOWN or STILL_UNKNOWN from another state
    settled: int  # calls that moved out of them (committed, not committed, human review, approved replay)


@dataclass(frozen=True, kw_only=True)
class Overview:
    now: datetime
    queues: list[QueueLoad]
    sla: list[SlaBreaches]
    breakers: list[OpenBreaker]
    # Every failure class of docs/design/classification.md with its count, in the table's order.
    failures: list[tuple[str, int]]
    attempts: int  # attempts whose outcome came over the same day, failed or not
    flow: list[HourFlow]  # 24 hours, oldest first, the current (partial) hour last
    pending_approvals: int  # action requests waiting for a second person (recovery.selectors.approvals)
    headlines: tuple[FigureValue, ...]  # the HEADLINES figures over the day
    gateway: tuple[FigureValue, ...] = ()  # the GATEWAY figures over the day
    since: datetime  # the start of the day's first hour: what "the last 24 hours" counts from
    folded_at: datetime | None  # the day's figures include every event up to then (None: never folded)


def overview(*, now: datetime, sla: dict[str, int]) -> Overview:
    """The overview at `now`; `sla` is the seconds an open item of each risk may wait (settings.RECOVERY_SLA_S)."""
    queues, breaches = _queues(now, sla)
    # The compensation problems queue as the navigation counts it (its COMPENSATING calls only while an entry needs a
    # person): the same membership, uncapped. Its SLA is not the unknown outcomes' (no risk column to split by).
    # Its overdue and due-soon counts are those of its PARTIAL_COMPENSATED and COMPENSATION_FAILED calls, the states
    # due times are set for (recovery.engine.due), read in _queues' statement.
    problems = queue_counts(EXACT, now=now)["compensation_problems"]
    queues[-1] = dataclasses.replace(queues[-1], open=problems)
    report = metrics_report(now=now, window=WINDOW, with_queues=False)
    return Overview(
        now=now,
        queues=queues,
        sla=breaches,
        breakers=_open_breakers(now),
        failures=_failures(report),
        attempts=int(report.figure("attempts").value or 0),
        flow=_flow(report),
        pending_approvals=pending_approvals_count(now=now),
        headlines=tuple(report.figure(key) for key in HEADLINES),
        gateway=tuple(report.figure(key) for key in GATEWAY),
        since=report.start,
        folded_at=report.folded_at,
    )


def _queues(now: datetime, sla: dict[str, int]) -> tuple[list[QueueLoad], list[SlaBreaches]]:
    """Open items per queue and risk, the oldest, and the SLA breaches, in one statement.

    Exact counts, unlike the navigation's capped ones: the overview is opened, not polled every few seconds. The
    rows are the open backlog only, never the settled history, counted from `call_backlog_idx` alone (an index-only
    scan: 25,000 open items among 1,000,000 calls in 13 ms, against 85 ms reading each open call's row).
    """
    risks = [key for key in sla if "." not in key]  # "<queue>.<risk>" keys refine a risk's SLA in one queue
    late = Q(pk__in=[])
    for slug, states in QUEUE_STATES.items():
        for risk in risks:
            limit = now - timedelta(seconds=due_seconds(sla, slug, risk))
            late |= Q(state__in=states, risk=risk, state_changed_at__lt=limit)
    overdue_q, soon = _due_filters(now)
    rows = (
        Call.objects.filter(state__in=[*UNKNOWN_STATES, S.HUMAN_REVIEW, *DUE_QUEUES[COMPENSATION]])
        .values("state", "risk")
        .annotate(
            n=Count("id"),
            oldest=Min("state_changed_at"),
            late=Count("id", filter=late),
            overdue=Count("id", filter=overdue_q),
            soon=Count("id", filter=soon),
        )
        .order_by()
    )
    due_states = {**QUEUE_STATES, COMPENSATION: DUE_QUEUES[COMPENSATION]}
    slug_of = {state: slug for slug, states in due_states.items() for state in states}
    counts: dict[str, int] = dict.fromkeys(QUEUE_STATES, 0)
    overdue: dict[str, int] = dict.fromkeys(due_states, 0)
    due_soon: dict[str, int] = dict.fromkeys(due_states, 0)
    oldest: dict[str, datetime | None] = dict.fromkeys(QUEUE_STATES)
    by_risk: dict[str, dict[str, list[int]]] = {}
    for row in rows:
        slug = slug_of[row["state"]]
        overdue[slug] += row["overdue"]
        due_soon[slug] += row["soon"]
        if slug == COMPENSATION:  # due times only: its members are counted as the queue lists them (overview())
            continue
        counts[slug] += row["n"]
        if oldest[slug] is None or row["oldest"] < oldest[slug]:
            oldest[slug] = row["oldest"]
        tally = by_risk.setdefault(row["risk"], {}).setdefault(slug, [0, 0])
        tally[0] += row["n"]
        tally[1] += row["late"]
    queues = [
        QueueLoad(
            slug=slug,
            open=counts.get(slug, 0),
            oldest_at=oldest.get(slug),
            overdue=overdue[slug],
            due_soon=due_soon[slug],
        )
        for slug in due_states
    ]
    return queues, _breaches(risks, sla, by_risk)


def _breaches(risks: list[str], sla: dict[str, int], by_risk: dict[str, dict[str, list[int]]]) -> list[SlaBreaches]:
    """Per risk, the strictest SLA first: each queue's open items and those older than the SLA."""
    breaches = []
    for risk in sorted(risks, key=sla.__getitem__):
        tallies = by_risk.get(risk, {})
        breaches.append(
            SlaBreaches(
                risk=risk,
                sla_s=sla[risk],
                open={slug: tallies.get(slug, [0, 0])[0] for slug in QUEUE_STATES},
                breaches={slug: tallies.get(slug, [0, 0])[1] for slug in QUEUE_STATES},
            )
        )
    return breaches


def _due_filters(now: datetime) -> tuple[Q, Q]:
    """Due times as a row and the call page write them (recovery.selectors.due): overdue is past the claim's while
    nobody holds the item, past the resolution's always; due soon is the same test DUE_SOON ahead, not overdue yet."""
    unclaimed = Q(claimed_by__isnull=True) | Q(claim_until__lte=now)
    overdue = late_q(now, claim=False) | (late_q(now, claim=True) & unclaimed)
    soon = late_q(now + DUE_SOON, claim=False) | (late_q(now + DUE_SOON, claim=True) & unclaimed)
    return overdue, soon & ~overdue


_BREAKER_FIELDS = ("tool__name", "tool__breaker", "state", "opened_at", "probes_reserved", "probe_lease_until")
_STATUS_FIELDS = ("provider__name", "provider__status_breaker", "state", "opened_at")


def _open_breakers(now: datetime) -> list[OpenBreaker]:
    """Tool breakers and status-endpoint breakers that are not closed: two small statements (a breaker row exists
    only once a breaker has opened)."""
    found = []
    now_s = now.timestamp()
    tools = Breaker.objects.exclude(state=CLOSED).select_related("tool").only(*_BREAKER_FIELDS)
    for row in tools:
        live = 0 if rules.probe_lease_expired(_epoch(row.probe_lease_until), now_s) else row.probes_reserved
        view = rules.effective_state(
            row.state, _epoch(row.opened_at), breaker_policy(row.tool), now_s, live_probes=live
        )
        found.append(
            OpenBreaker(kind="tool", name=row.tool.name, state=view.state, stored=row.state, since=row.opened_at)
        )
    endpoints = StatusBreaker.objects.exclude(state=CLOSED).select_related("provider").only(*_STATUS_FIELDS)
    for row in endpoints:
        state = status_breaker_state(row.state, row.opened_at, status_breaker_policy(row.provider).cooldown_s, now)
        found.append(
            OpenBreaker(kind="status", name=row.provider.name, state=state, stored=row.state, since=row.opened_at)
        )
    return sorted(found, key=lambda b: (b.since is None, b.since or now, b.kind, b.name))


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _failures(report: MetricsReport) -> list[tuple[str, int]]:
    """The day's failed attempts by failure class: every class of docs/design/classification.md in its order (0 when
    none failed so), then any other class the rollups hold, by name."""
    counted = {label: int(n) for label, n in report.figure("failures").by_label}
    known = [(name, counted.get(name, 0)) for name in FAILURE_CLASSES]
    return known + sorted((name, n) for name, n in counted.items() if name not in FAILURE_CLASSES)


def _flow(report: MetricsReport) -> list[HourFlow]:
    """Per hour of the day, the calls that entered the UNKNOWN queue (from a state outside it) and those that left it
    (to any state outside it: committed, not committed, human review, approved replay); a move between UNKNOWN and
    STILL_UNKNOWN stays in the queue and counts as neither. The fold's queue entries and its resolutions of the
    "unknown" queue (every histogram bucket: each resolution is in exactly one)."""
    entered = report.points(m.QUEUE_ENTRIES, lambda label: label == "unknown")
    settled = report.points(m.RESOLUTIONS, lambda label: m.split_bucket_label(label)[0] == "unknown")
    starts = [point.start for point in report.figure("attempts").series]
    return [HourFlow(start=h, entered=e, settled=s) for h, e, s in zip(starts, entered, settled, strict=True)]

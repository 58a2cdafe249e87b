"""The metrics of recovery (docs/metrics.md), each defined once, and the fold that turns audit events into their counts
per (hour, tenant, tool, series, label): by event time, or by cohort (the hour of the call's first attempt, each
numerator counting a call at most once, so no rate passes 100 %). recovery.services.metrics feeds `fold_event` the
audit sequence past its watermark; tests/test_metrics_fold.py holds it equal to a recomputation from the raw rows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from recovery.engine.states import CallState

S = CallState
HOUR = 3600
DAY = 86_400
# The rollups' tool id of every tool's sum (a read without a tool filter); 0 is "about no tool" (tasks).
ALL_TOOLS = -1

# --- the stored series -----------------------------------------------------------------------------------------------
# Counted by event time (label in brackets)
ATTEMPTS = "attempts"  # [outcome] an attempt's outcome, once per attempt
FAILURES = "failures"  # [failure class] a failed attempt
DECISIONS = "decisions"  # [route] the recovery engine's decision card for a failed attempt
ACTIONS = "actions"  # [action] an operator's action request executed
RECONCILE_CHECKS = "reconcile_checks"  # [observed] a reconcile receipt (status query, callback, idempotent replay)
HUMAN_TAKEOVERS = "human_takeovers"  # [reason] a call moved to HUMAN_REVIEW
BUDGET_EXHAUSTED = "budget_exhausted"  # [outcome] a call ended on an exhausted budget
TASK_OUTCOMES = "task_outcomes"  # [outcome] a task submitted or abandoned
QUEUE_ENTRIES = "queue_entries"  # [queue] a call entered a queue's states (the overview's flow chart)
RESOLUTIONS = "resolutions"  # [queue|le] a queue item resolved, in the one bucket it falls in (readers add them up)
RESOLUTION_MS = "resolution_ms"  # [queue] the milliseconds those items waited, summed
FIRST_CLAIMS = "first_claims"  # [queue|le] a queue item's first claim since it entered the queue, in its bucket
FIRST_CLAIM_MS = "first_claim_ms"  # [queue] the milliseconds those items waited for it, summed
BREAKER_OPEN_MS = "breaker_open_ms"  # [] milliseconds the tool's breaker was not closed within the hour
BREAKER_OPENINGS = "breaker_openings"  # [] times the tool's breaker opened (or was forced open)
COMPENSATIONS = "compensations"  # [started | committed | failed] compensation ledger entries
PROBES = "probes"  # [decision] duplicate probes recorded
MCP_CALLS = "mcp_calls"  # [server] a call registered through the MCP gateway
MCP_REISSUES = "mcp_reissues"  # [server] a re-issue the MCP gateway answered from the call it repeats, never sent
# Counted by cohort: the hour of the call's first attempt
CALLS = "calls"  # calls whose first attempt fell in the hour
WRITE_CALLS = "write_calls"  # of those, writes
UNKNOWN_CALLS = "unknown_calls"  # of those writes, the ones that ever entered UNKNOWN
UNKNOWN_SETTLED = "unknown_settled"  # of those, settled by reconciliation with no person (first time)
DUPLICATE_CALLS = "duplicate_calls"  # of the writes, the keys a receipt saw with more effects than allowed
COMMITTED_CALLS = "committed_calls"  # of the calls, the ones that committed
COMMITTED_RETRIES = "committed_retries"  # their attempts beyond the first, counted when they committed

# The queues whose items' time to resolution is measured: a call enters one with its state and leaves it when its
# state leaves the queue's states (recovery.selectors.queues; the compensation problems queue's lasting states).
QUEUES: dict[str, frozenset[str]] = {
    "unknown": frozenset({S.UNKNOWN, S.STILL_UNKNOWN}),
    "human_review": frozenset({S.HUMAN_REVIEW}),
    "compensation": frozenset({S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED}),
}
# Fixed histogram buckets of the time to resolution, in seconds (upper bounds; the last one is +Inf): from a
# receipt's seconds to a week-end's days, the same for every queue, so buckets add across tools and hours.
RESOLUTION_BUCKETS_S: tuple[float, ...] = (
    1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14_400, 28_800, 86_400, 259_200, 604_800, math.inf,
)  # fmt: skip
# A call outcome that means a budget ran out (docs/design/budgets.md), counted as budget exhaustion by that outcome.
BUDGET_OUTCOMES = frozenset(
    {"retry_exhausted", "poll_budget_exhausted", "deadline_exceeded", "degraded_read_only", "no_budget"}
)
# Receipt sources whose receipts are reconcile checks (an operator's receipt is a person's evidence, not a check).
CHECK_SOURCES = frozenset({"poll", "callback", "idempotent_replay"})
# Task outcomes that count as success.
TASK_SUCCESS = frozenset({"completed"})

_UNKNOWN = QUEUES["unknown"]
_SETTLED = frozenset({S.COMMITTED, S.NOT_COMMITTED})


def le_label(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else f"{bound:g}"


def bucket_label(queue: str, bound: float) -> str:
    return f"{queue}|{le_label(bound)}"


def split_bucket_label(label: str) -> tuple[str, str]:
    queue, _, le = label.partition("|")
    return queue, le


def hour_of(at: datetime) -> int:
    """The epoch second starting `at`'s hour (UTC)."""
    return int(at.timestamp()) // HOUR * HOUR


# --- the fold --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EventView:
    """One audit event as the fold reads it, with the facts of its call (or task) that the counts are keyed by."""

    seq: int
    action: str
    at: datetime
    actor_kind: str
    from_state: str = ""
    to_state: str = ""
    evidence: Any = None
    call_id: int | None = None
    tool_id: int = 0  # the call's tool; a breaker event's tool (resolved from its evidence); 0 for none
    tenant_id: int = 0  # the call's or the task's tenant; 0 for none
    side_effect: str = ""  # the call's


@dataclass(kw_only=True)
class CallMark:
    """What the fold remembers about one call between events: its cohort and what it has already counted."""

    cohort: int | None = None  # epoch hour of the first attempt
    attempts: int = 0
    unknown: bool = False  # entered UNKNOWN (counted in UNKNOWN_CALLS)
    settled: bool = False  # settled by reconciliation with no person (counted in UNKNOWN_SETTLED)
    human: bool = False  # a person took part since the current unknown episode began
    duplicate: bool = False
    committed: bool = False
    queue: str = ""  # the queue the call is in now ("" for none)
    queue_since: datetime | None = None
    claimed: bool = False  # claimed since it entered its queue (its first claim counted in FIRST_CLAIMS)


@dataclass(kw_only=True)
class FoldState:
    """The fold's memory besides the marks: each tool's breaker open since (epoch seconds), while not closed."""

    open_breakers: dict[int, float] = field(default_factory=dict)


Key = tuple[int, int, int, str, str]  # (hour, tenant, tool, series, label)


def _evidence(event: EventView) -> Mapping[str, Any]:
    return event.evidence if isinstance(event.evidence, Mapping) else {}


def _by_person(event: EventView, evidence: Mapping[str, Any]) -> bool:
    return event.actor_kind == "user" or "action_request" in evidence or "action_request" in str(event.evidence)


def fold_event(event: EventView, mark: CallMark | None, state: FoldState, counts: Counter[Key]) -> None:
    """Add what `event` counts to `counts`, updating its call's `mark` (None for an event about no call) and the
    breaker memory in `state`. Events must come in their audit order (`seq`), each exactly once."""
    ev = _evidence(event)
    hour = hour_of(event.at)

    def add(series: str, label: str = "", n: int = 1, at: int = hour) -> None:
        counts[(at, event.tenant_id, event.tool_id, series, label)] += n

    if event.action.startswith("breaker."):
        _fold_breaker(event, state, counts)
    elif event.action in _CALLLESS:
        if counted := _callless_count(event, ev):
            add(*counted)
    elif mark is not None:
        _fold_call_event(event, ev, mark, add)


# Events that count something without moving a call (a task's end, a probe, a compensation entry, an action).
_CALLLESS = frozenset(
    {
        "task.submitted",
        "task.abandoned",
        "probe.recorded",
        "compensation.started",
        "compensation.transition",
        "action.executed",
    }
)


def _callless_count(event: EventView, ev: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (series, label) one of the _CALLLESS events adds to; None when it counts nothing."""
    action = event.action
    if action in ("task.submitted", "task.abandoned"):
        return TASK_OUTCOMES, str(ev.get("outcome") or "abandoned")
    if action == "probe.recorded":
        return PROBES, str(ev.get("decision", ""))
    if action == "compensation.started":
        return COMPENSATIONS, "started"
    if action == "compensation.transition":
        return (COMPENSATIONS, event.to_state) if event.to_state in ("committed", "failed") else None
    return ACTIONS, str(ev.get("action", ""))  # action.executed


def _fold_call_event(event: EventView, ev: Mapping[str, Any], mark: CallMark, add) -> None:
    """An event about a call: a replay reconciliation's attempt, a status check, or a move of its state."""
    if event.action == "call.replayed":  # replay reconciliation's one same-key replay: an attempt
        _first_attempt(event, mark, add)
        mark.attempts += 1
        add(ATTEMPTS, "reconcile_replay")
    elif event.action == "call.claimed":
        _fold_first_claim(event, mark, add)
    elif event.action == "call.added" and isinstance(ev.get("mcp"), Mapping):
        add(MCP_CALLS, str(ev["mcp"].get("server", "")))
    elif event.action == "mcp.reissue_absorbed":
        add(MCP_REISSUES, str(ev.get("server", "")))
    elif event.action == "call.checked":
        if ev.get("source") in CHECK_SOURCES:
            add(RECONCILE_CHECKS, str(ev.get("observed", "")))
    elif event.action == "call.transition":
        _fold_transition(event, ev, mark, add)


def _first_attempt(event: EventView, mark: CallMark, add) -> int:
    """The call's cohort: the hour of its first attempt, counted in CALLS (and WRITE_CALLS) when first seen. A call
    counted in a cohort's numerator is always in its denominator: a numerator seen first opens the cohort."""
    if mark.cohort is None:
        mark.cohort = hour_of(event.at)
        add(CALLS, at=mark.cohort)
        if event.side_effect == "write":
            add(WRITE_CALLS, at=mark.cohort)
    return mark.cohort


def _fold_transition(event: EventView, ev: Mapping[str, Any], mark: CallMark, add) -> None:
    """A call's move: its attempt, a receipt, an exhausted budget, an unknown episode, a person taking over, the
    ends a cohort counts (settled, duplicate, committed), and its queues."""
    _fold_attempt(event, ev, mark, add)
    if ev.get("source") in CHECK_SOURCES:  # a receipt that moved the call (its first step only carries the source)
        add(RECONCILE_CHECKS, str(ev.get("observed", "")))
    outcome = str(ev.get("outcome") or "")
    if outcome in BUDGET_OUTCOMES:
        add(BUDGET_EXHAUSTED, outcome)
    _fold_unknown_episode(event, ev, outcome, mark, add)
    write = event.side_effect == "write"
    if outcome == "duplicate_effect" and not mark.duplicate and write:
        mark.duplicate = True
        add(DUPLICATE_CALLS, at=_first_attempt(event, mark, add))
    if event.to_state == S.COMMITTED and not mark.committed:
        mark.committed = True
        cohort = _first_attempt(event, mark, add)
        add(COMMITTED_CALLS, at=cohort)
        add(COMMITTED_RETRIES, n=max(mark.attempts - 1, 0), at=cohort)
    _fold_queues(event, mark, add)


def _fold_attempt(event: EventView, ev: Mapping[str, Any], mark: CallMark, add) -> None:
    """An attempt: admitted (into SENT) or its outcome reported (a "row" of the classification table; the sweeper's
    "no outcome in time")."""
    src, dst = event.from_state, event.to_state
    outcome_row = "row" in ev and dst != S.SENT
    swept = "outcome_timeout_s" in ev and src == S.SENT
    if dst == S.SENT or outcome_row or swept:
        _first_attempt(event, mark, add)
    if outcome_row or swept:
        mark.attempts += 1
        add(ATTEMPTS, "no_outcome" if swept else dst.lower())
        if ev.get("class"):
            add(FAILURES, str(ev["class"]))
        if ev.get("route") and not swept:
            add(DECISIONS, str(ev["route"]))


def _fold_unknown_episode(event: EventView, ev: Mapping[str, Any], outcome: str, mark: CallMark, add) -> None:
    """An unknown episode: counted once per call; a person taking part in it makes its settlement a person's."""
    src, dst = event.from_state, event.to_state
    by_person = _by_person(event, ev)
    if dst in _UNKNOWN and src not in _UNKNOWN and event.side_effect == "write":
        mark.human = False
        if not mark.unknown:
            mark.unknown = True
            add(UNKNOWN_CALLS, at=_first_attempt(event, mark, add))
    if dst == S.HUMAN_REVIEW:
        mark.human = True
        add(HUMAN_TAKEOVERS, takeover_reason(outcome, by_person, ev))
    elif by_person:
        mark.human = True
    if src in _UNKNOWN and dst in _SETTLED and mark.unknown and not mark.settled and not mark.human:
        mark.settled = True
        add(UNKNOWN_SETTLED, at=_first_attempt(event, mark, add))


def takeover_reason(outcome: str, by_person: bool, evidence: Mapping[str, Any]) -> str:
    """Why a call went to HUMAN_REVIEW: the outcome its move set; an operator's escalation; else the failure class
    of the attempt that sent it there (a hard stop, an approvable authorization); "other" when nothing says."""
    if outcome:
        return outcome
    if by_person:
        return "escalated"
    return str(evidence.get("class") or "other")


def queue_of(state: str) -> str:
    return next((name for name, states in QUEUES.items() if state in states), "")


def _fold_queues(event: EventView, mark: CallMark, add) -> None:
    left, entered = queue_of(event.from_state), queue_of(event.to_state)
    if left == entered:
        return
    if entered:
        add(QUEUE_ENTRIES, entered)
    if left and mark.queue == left and mark.queue_since is not None:
        waited_s = max((event.at - mark.queue_since).total_seconds(), 0.0)
        bound = next(b for b in RESOLUTION_BUCKETS_S if waited_s <= b)
        add(RESOLUTIONS, bucket_label(left, bound))
        add(RESOLUTION_MS, left, n=round(waited_s * 1000))
    mark.queue, mark.queue_since, mark.claimed = entered, (event.at if entered else None), False


def _fold_first_claim(event: EventView, mark: CallMark, add) -> None:
    """Time to first claim: from entering a queue to a reviewer's first claim on the item there."""
    if not mark.queue or mark.queue_since is None or mark.claimed:
        return
    mark.claimed = True
    waited_s = max((event.at - mark.queue_since).total_seconds(), 0.0)
    bound = next(b for b in RESOLUTION_BUCKETS_S if waited_s <= b)
    add(FIRST_CLAIMS, bucket_label(mark.queue, bound))
    add(FIRST_CLAIM_MS, mark.queue, n=round(waited_s * 1000))


_OPENS = ("breaker.opened", "breaker.reopened", "breaker.forced_open")
_CLOSES = ("breaker.closed", "breaker.reset")


def _fold_breaker(event: EventView, state: FoldState, counts: Counter[Key]) -> None:
    """A tool breaker's time not closed, split across the hours it spans, added when it closes (an open one is
    added by the reader up to now, from the same memory)."""
    tool = event.tool_id
    if not tool:
        return
    at = event.at.timestamp()
    if event.action in _OPENS and tool not in state.open_breakers:
        state.open_breakers[tool] = at
        counts[(hour_of(event.at), 0, tool, BREAKER_OPENINGS, "")] += 1
    elif event.action in _CLOSES and tool in state.open_breakers:
        since = state.open_breakers.pop(tool)
        for hour, ms in open_ms_by_hour(since, at):
            counts[(hour, 0, tool, BREAKER_OPEN_MS, "")] += ms


def open_ms_by_hour(since: float, until: float) -> list[tuple[int, int]]:
    """The milliseconds of [since, until) in each hour it touches, rounded so that the parts add up to the whole."""
    parts, start, done = [], since, 0
    total = round((until - since) * 1000)
    while start < until:
        hour = int(start) // HOUR * HOUR
        end = min(until, hour + HOUR)
        upto = round((end - since) * 1000)
        if upto > done:
            parts.append((hour, upto - done))
            done = upto
        start = end
    if done < total and parts:
        parts[-1] = (parts[-1][0], parts[-1][1] + total - done)
    return parts


# --- the figures the console, the JSON and Prometheus show -----------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One figure of docs/metrics.md: how it is computed from the stored series, and what it means (its `doc`)."""

    key: str
    title: str
    kind: str  # count (a sum, by label), rate (numerator / denominator, a share), ratio (a mean), quantiles, duration
    doc: str
    series: str = ""  # count, duration and quantiles: the stored series
    numerator: str = ""  # rate, ratio
    denominator: str = ""  # rate, ratio
    numerator_labels: frozenset[str] = frozenset()  # rate: the labels of `numerator` that count (all when empty)
    unit: str = ""


# recovery.selectors.metrics reads the rollups back through these; the console shows each one's `doc` by its chart.
FIGURES: tuple[Figure, ...] = (
    Figure(
        key="attempts",
        title="Attempts",
        kind="count",
        series=ATTEMPTS,
        doc="Attempts by their outcome, counted when the outcome is known: the call state it led to, `no_outcome` "
        "when none arrived within the tool's outcome timeout (the sweeper), `reconcile_replay` for replay "
        "reconciliation's one same-key replay. Hour of the outcome.",
    ),
    Figure(
        key="failures",
        title="Failures by class",
        kind="count",
        series=FAILURES,
        doc="Failed attempts by failure class (docs/design/classification.md), hour of the outcome. A write swept with "
        "no outcome counts as outcome_unknown, a read as transient.",
    ),
    Figure(
        key="decisions",
        title="Recovery decisions by route",
        kind="count",
        series=DECISIONS,
        doc="The engine's decision card for each failed attempt, by route (repair, retry, reconcile, escalate, "
        "degrade, stop...), hour of the outcome.",
    ),
    Figure(
        key="actions",
        title="Operator actions executed",
        kind="count",
        series=ACTIONS,
        doc="Operator action requests executed by a worker after their approval, by kind (replay, reconcile now, "
        "mark committed, escalate...), hour of the execution.",
    ),
    Figure(
        key="unknown_outcome_rate",
        title="Unknown-outcome rate",
        kind="rate",
        numerator=UNKNOWN_CALLS,
        denominator=WRITE_CALLS,
        doc="Of the write calls whose first attempt fell in the window, the share that ever entered UNKNOWN "
        "(ACCEPTED is in progress, not unknown). Each call counts once however often it turned unknown.",
    ),
    Figure(
        key="reconcile_success_rate",
        title="Reconcile success rate",
        kind="rate",
        numerator=UNKNOWN_SETTLED,
        denominator=UNKNOWN_CALLS,
        doc="Of those unknown writes (same cohort), the share that reconciliation settled (COMMITTED or "
        "NOT_COMMITTED on a receipt, a callback or a runtime's late reply) with no person taking part: no "
        "HUMAN_REVIEW, no approved action in the episode. Calls still being checked count in the denominator.",
    ),
    Figure(
        key="duplicate_effect_rate",
        title="Duplicate side-effect rate",
        kind="rate",
        numerator=DUPLICATE_CALLS,
        denominator=WRITE_CALLS,
        doc="Of the write calls (keys) whose first attempt fell in the window, the share for which a receipt saw more "
        "business effects than the key allows. A duplicate probe's deliberate second effect is its evidence, not "
        "a duplicate: it is not counted.",
    ),
    Figure(
        key="retries_per_success",
        title="Retries per successful call",
        kind="ratio",
        numerator=COMMITTED_RETRIES,
        denominator=COMMITTED_CALLS,
        doc="Of the calls whose first attempt fell in the window and that committed, the mean number of attempts "
        "beyond the first they took to commit.",
    ),
    Figure(
        key="reconcile_checks",
        title="Reconcile checks",
        kind="count",
        series=RECONCILE_CHECKS,
        doc="Reconcile receipts of unsettled calls (UNKNOWN, STILL_UNKNOWN, ACCEPTED) by what they observed "
        "(committed, not_committed, pending, failed...): status queries, signed callbacks and idempotent replays. "
        "Hour of the check. A late callback for a call settled already is kept as a receipt, not counted here.",
    ),
    Figure(
        key="human_takeovers",
        title="Human takeovers",
        kind="count",
        series=HUMAN_TAKEOVERS,
        doc="Calls moved to HUMAN_REVIEW, by why (poll budget exhausted, deadline exceeded, duplicate effect, "
        "approval required, escalated by an operator...). Hour of the move.",
    ),
    Figure(
        key="budget_exhausted",
        title="Budget exhaustion",
        kind="count",
        series=BUDGET_EXHAUSTED,
        doc="Calls that ended on an exhausted budget, by the explicit outcome (docs/design/budgets.md): "
        "retry_exhausted, poll_budget_exhausted, deadline_exceeded, degraded_read_only. Hour it ended.",
    ),
    Figure(
        key="task_success_rate",
        title="Task success",
        kind="rate",
        numerator=TASK_OUTCOMES,
        numerator_labels=TASK_SUCCESS,
        denominator=TASK_OUTCOMES,
        doc="Of the tasks submitted or abandoned in the window, the share that completed (every call settled and "
        "the deliverable submitted). The outcomes are listed beside it.",
    ),
    Figure(
        key="time_to_resolution",
        title="Time to resolution of queue items",
        kind="quantiles",
        series=RESOLUTIONS,
        unit="s",
        doc="How long items waited in the UNKNOWN, HUMAN_REVIEW and compensation problems queues, from entering "
        "the queue's states to leaving them, counted when they left: the median and the 95th percentile, "
        "estimated from fixed histogram buckets (1 s, 5 s, 15 s, 30 s, 1, 2, 5, 10 and 30 min, 1, 2, 4 and 8 h, "
        "1, 3 and 7 days) by linear interpolation inside the bucket, as Prometheus' histogram_quantile does.",
    ),
    Figure(
        key="breaker_open_time",
        title="Breaker open time",
        kind="duration",
        series=BREAKER_OPEN_MS,
        unit="s",
        doc="Seconds tool breakers spent open, half-open or forced open within the window (a breaker still open "
        "counts up to now), and how many times they opened. Breakers are shared by every tenant: a view of some "
        "tenants shows those of the tools they may use.",
    ),
    Figure(
        key="compensations",
        title="Compensations",
        kind="count",
        series=COMPENSATIONS,
        doc="Compensation ledger entries (docs/compensation.md) started, and those that committed or failed, by the "
        "hour of each.",
    ),
    Figure(
        key="probes",
        title="Duplicate probes",
        kind="count",
        series=PROBES,
        doc="Duplicate probes recorded (docs/replay.md), by decision: safe (the provider deduplicated: one effect) or "
        "unsafe (a second effect, a new business id or a forgotten key).",
    ),
    Figure(
        key="gateway_calls",
        title="MCP gateway calls",
        kind="count",
        series=MCP_CALLS,
        doc="Calls registered through the MCP gateway (docs/mcp-gateway.md), by server, in the hour each was "
        "registered. A re-issue answered from the call it repeats is no new call.",
    ),
    Figure(
        key="reissues_absorbed",
        title="MCP re-issues absorbed",
        kind="count",
        series=MCP_REISSUES,
        doc="Duplicates prevented: re-issues of a gateway write within the server's reissue_window_s, answered from "
        "the call they repeat and never sent upstream, by server, in the hour each came.",
    ),
)

# Read from the holds themselves (recovery.selectors.mcp_metrics), not the rollups: a hold is a gate decision.
HOLD_FIGURES: tuple[Figure, ...] = (
    Figure(
        key="mcp_holds",
        title="MCP approval holds",
        kind="count",
        doc="Gateway calls whose admission was denied with approval_required (docs/mcp-gateway.md): each call "
        "counted once, in the hour of its first such denial, by server.",
    ),
    Figure(
        key="approval_wait",
        title="MCP approval wait",
        kind="quantiles",
        unit="s",
        doc="For the holds of the window that were decided, the time from the hold (the first approval_required "
        "denial) to the decision of the call's action request (approved or rejected): the median and the 95th "
        "percentile, computed exactly from the holds. Holds not decided yet are counted apart (waiting).",
    ),
)


def quantile(q: float, buckets: list[tuple[float, int]]) -> float | None:
    """The q-quantile of a histogram given as cumulative (upper bound, count) pairs in bound order, interpolated
    linearly inside its bucket (the first bucket starts at 0); the highest finite bound when it falls in +Inf; None
    for an empty histogram."""
    total = buckets[-1][1] if buckets else 0
    if not total:
        return None
    rank = q * total
    lower, below = 0.0, 0
    for bound, cumulative in buckets:
        if cumulative >= rank and cumulative > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (cumulative - below)
        lower, below = (bound if not math.isinf(bound) else lower), cumulative
    return lower

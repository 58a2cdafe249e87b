"""The metrics fold (docs/metrics.md): audit events past a watermark into rollups, each figure defined once.

Random histories written through the one transition function are folded in random batches and compared with an
independent recomputation from the raw rows (every call's events read whole, in order); the fold's own rules are
held by small stories (a cohort's numerator counted in its first attempt's hour, no rate above 100 %, a breaker's
open time split across hours, a second fold skipping while the first holds the watermark).
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event, audit_maintenance
from recovery.engine import metrics as m
from recovery.engine.states import EDGES, CallState
from recovery.models import AuditEvent, Call, MetricFold, MetricRollup, MetricTotal, Task, Tenant
from recovery.selectors.metrics import metrics_report, metrics_totals
from recovery.services.metrics import metrics_fold
from recovery.statemachine.transitions import transition_call

S = CallState
JOB, TOKEN, USER = (
    Actor.job("reconcile"),
    Actor(kind="token", label="token:runtime"),
    Actor(kind="user", label="user:x"),
)
CLASSES = ("", "transient", "outcome_unknown", "invalid_arguments")
ROUTES = ("", "retry", "reconcile", "repair", "escalate")
OUTCOMES = ("", "", "poll_budget_exhausted", "duplicate_effect", "retry_exhausted", "human_review_required")
OBSERVED = ("committed", "not_committed", "pending", "failed")
SOURCES = ("poll", "callback", "idempotent_replay", "operator")
_tasks = itertools.count()


# --- the pure fold ---------------------------------------------------------------------------------------------------


def _event(action="call.transition", *, at, src="", dst="", evidence=None, actor="job", side_effect="write", tool=1):
    return m.EventView(
        seq=0,
        action=action,
        at=at,
        actor_kind=actor,
        from_state=src,
        to_state=dst,
        evidence=evidence or {},
        call_id=7,
        tool_id=tool,
        tenant_id=3,
        side_effect=side_effect,
    )


def _fold(events, mark=None, state=None) -> Counter:
    counts: Counter = Counter()
    mark = mark if mark is not None else m.CallMark()
    state = state or m.FoldState()
    for event in events:
        m.fold_event(event, mark, state, counts)
    return counts


T0 = datetime(2026, 11, 30, 9, 50, tzinfo=UTC)
H0 = m.hour_of(T0)


def test_it_counts_an_unknown_that_settles_an_hour_later_in_its_first_attempts_hour():
    counts = _fold(
        [
            _event(at=T0, src=S.READY, dst=S.SENT, evidence={"attempt_id": "a1"}),
            _event(
                at=T0,
                src=S.SENT,
                dst=S.UNKNOWN,
                evidence={"row": "8", "class": "outcome_unknown", "route": "reconcile"},
            ),
            _event(
                at=T0 + timedelta(minutes=75),
                src=S.UNKNOWN,
                dst=S.COMMITTED,
                evidence={"receipt": 1, "observed": "committed", "source": "poll"},
            ),
        ]
    )
    later = H0 + 2 * m.HOUR
    assert counts[(H0, 3, 1, m.WRITE_CALLS, "")] == 1
    assert counts[(H0, 3, 1, m.UNKNOWN_CALLS, "")] == 1
    assert counts[(H0, 3, 1, m.UNKNOWN_SETTLED, "")] == 1  # in the cohort's hour, not the hour it settled
    assert counts[(later, 3, 1, m.RECONCILE_CHECKS, "committed")] == 1  # a check counts when it happened
    assert counts[(H0, 3, 1, m.ATTEMPTS, "unknown")] == 1
    assert counts[(H0, 3, 1, m.FAILURES, "outcome_unknown")] == 1
    assert counts[(H0, 3, 1, m.DECISIONS, "reconcile")] == 1
    # 75 minutes in the UNKNOWN queue: the 7200 s bucket, and its milliseconds
    assert counts[(later, 3, 1, m.RESOLUTIONS, "unknown|7200")] == 1
    assert counts[(later, 3, 1, m.RESOLUTION_MS, "unknown")] == 75 * 60 * 1000


def test_a_call_that_turns_unknown_twice_counts_once_and_a_persons_settlement_is_not_reconciliations():
    unknown = {"row": "8", "class": "outcome_unknown"}
    counts = _fold(
        [
            _event(at=T0, src=S.READY, dst=S.SENT),
            _event(at=T0, src=S.SENT, dst=S.UNKNOWN, evidence=unknown),
            _event(at=T0, src=S.UNKNOWN, dst=S.HUMAN_REVIEW, evidence={"outcome": "poll_budget_exhausted"}),
            _event(at=T0, src=S.HUMAN_REVIEW, dst=S.SENT, evidence={"action_request": 4}),
            _event(at=T0, src=S.SENT, dst=S.UNKNOWN, evidence=unknown),
            _event(at=T0, src=S.UNKNOWN, dst=S.NOT_COMMITTED, evidence={"action_request": 5}, actor="user"),
        ]
    )
    assert counts[(H0, 3, 1, m.UNKNOWN_CALLS, "")] == 1
    assert counts[(H0, 3, 1, m.UNKNOWN_SETTLED, "")] == 0
    assert counts[(H0, 3, 1, m.HUMAN_TAKEOVERS, "poll_budget_exhausted")] == 1
    assert counts[(H0, 3, 1, m.BUDGET_EXHAUSTED, "poll_budget_exhausted")] == 1
    assert counts[(H0, 3, 1, m.ATTEMPTS, "unknown")] == 2
    assert counts[(H0, 3, 1, m.WRITE_CALLS, "")] == 1


def test_it_counts_retries_of_a_committed_call_and_a_read_is_no_write():
    counts = _fold(
        [
            _event(at=T0, src=S.READY, dst=S.SENT, side_effect="read"),
            _event(at=T0, src=S.SENT, dst=S.RETRYABLE, evidence={"row": "3", "class": "transient"}, side_effect="read"),
            _event(at=T0, src=S.RETRYABLE, dst=S.SENT, side_effect="read"),
            _event(at=T0, src=S.SENT, dst=S.COMMITTED, evidence={"row": "10"}, side_effect="read"),
        ]
    )
    assert counts[(H0, 3, 1, m.CALLS, "")] == 1 and counts[(H0, 3, 1, m.WRITE_CALLS, "")] == 0
    assert counts[(H0, 3, 1, m.COMMITTED_CALLS, "")] == 1 and counts[(H0, 3, 1, m.COMMITTED_RETRIES, "")] == 1
    assert counts[(H0, 3, 1, m.ATTEMPTS, "retryable")] == 1 and counts[(H0, 3, 1, m.ATTEMPTS, "committed")] == 1


def test_a_breakers_open_time_is_split_across_the_hours_it_spans_and_counted_when_it_closes():
    state = m.FoldState()
    opened = datetime(2026, 11, 30, 9, 59, 30, tzinfo=UTC)
    closed = opened + timedelta(minutes=2)
    counts = _fold([_event("breaker.opened", at=opened, tool=9)], state=state)
    assert counts[(H0, 3, 9, m.BREAKER_OPENINGS, "")] == 0  # breakers are every tenant's: tenant 0
    assert counts[(H0, 0, 9, m.BREAKER_OPENINGS, "")] == 1 and 9 in state.open_breakers
    counts = _fold(
        [
            _event("breaker.reopened", at=opened + timedelta(seconds=50), tool=9),
            _event("breaker.closed", at=closed, tool=9),
        ],
        state=state,
    )
    assert counts[(H0, 0, 9, m.BREAKER_OPEN_MS, "")] == 30_000
    assert counts[(H0 + m.HOUR, 0, 9, m.BREAKER_OPEN_MS, "")] == 90_000
    assert counts[(H0, 0, 9, m.BREAKER_OPENINGS, "")] == 0 and not state.open_breakers  # a reopening is not new


@given(st.floats(0, 10 * m.HOUR), st.floats(0, 30 * m.HOUR))
def test_open_time_parts_add_up_to_the_whole(offset, length):
    since = H0 + offset
    parts = m.open_ms_by_hour(since, since + length)
    assert sum(ms for _, ms in parts) == round(length * 1000)
    assert all(hour % m.HOUR == 0 for hour, _ in parts)


def test_quantiles_interpolate_inside_the_bucket_as_histogram_quantile_does():
    buckets = [(1, 0), (5, 10), (15, 10), (math_inf := float("inf"), 12)]
    assert m.quantile(0.5, buckets) == pytest.approx(1 + 4 * 6 / 10)
    assert m.quantile(0.95, buckets) == 15  # in +Inf: the highest finite bound
    assert m.quantile(0.5, [(1, 0), (math_inf, 0)]) is None


# --- random histories against a recomputation from the raw rows ------------------------------------------------------

STEP = st.fixed_dictionaries(
    {
        "choice": st.integers(0, 10_000),
        "hours": st.integers(0, 2),
        "minutes": st.integers(0, 59),
        "actor": st.sampled_from(("job", "token", "user")),
        "class": st.sampled_from(CLASSES),
        "route": st.sampled_from(ROUTES),
        "outcome": st.sampled_from(OUTCOMES),
        "observed": st.sampled_from(OBSERVED),
        "source": st.sampled_from(SOURCES),
        "swept": st.booleans(),
        "approved": st.integers(0, 3),
        "extra": st.sampled_from(("", "", "", "checked", "replayed")),
    }
)
HISTORY = st.lists(
    st.tuples(st.sampled_from(("write", "write", "read")), st.integers(0, 1), st.lists(STEP, max_size=9))
)


def _write(make_call, registry, tenants, side_effect: str, tenant: int, steps: list[dict]) -> Call:
    tool = registry["refund"] if side_effect == "write" else registry["lookup"]
    owner = tenants[tenant]
    task = Task.objects.create(tenant=owner, external_id=f"h-{next(_tasks)}", agent="t", goal="g")
    call = make_call(tool=tool, on_task=task)
    actors = {"job": JOB, "token": TOKEN, "user": USER}
    for step in steps:
        targets = sorted(EDGES[S(call.state)])
        if not targets:
            break
        dst = targets[step["choice"] % len(targets)]
        evidence: dict = {}
        if call.state == S.SENT:
            evidence = (
                {"outcome_timeout_s": 30, "class": step["class"]}
                if step["swept"]
                else {"row": "8", "class": step["class"], "route": step["route"]}
            )
        elif call.state in (S.UNKNOWN, S.STILL_UNKNOWN, S.ACCEPTED):
            evidence = {"receipt": 1, "observed": step["observed"], "source": step["source"]}
        if step["approved"] == 0:
            evidence["action_request"] = 1
        changes = {"outcome": step["outcome"]} if step["outcome"] else {}
        with transaction.atomic():
            transition_call(call, dst, actor=actors[step["actor"]], reason="r", evidence=evidence, changes=changes)
        if step["extra"]:
            with transaction.atomic():
                action = AuditAction.CALL_CHECKED if step["extra"] == "checked" else AuditAction.CALL_REPLAYED
                evidence = (
                    {"observed": step["observed"], "source": step["source"]} if step["extra"] == "checked" else {}
                )
                append_event(
                    action=action,
                    actor=JOB,
                    task_id=call.task_id,
                    call_id=call.pk,
                    from_state=call.state,
                    to_state=call.state,
                    reason="r",
                    evidence=evidence,
                )
    _spread(call, steps)
    return call


def _spread(call: Call, steps: list[dict]) -> None:
    """Spread the call's events over hours, in order (the test's own clock: the maintenance switch it documents)."""
    events = list(AuditEvent.objects.filter(call_id=call.pk).order_by("seq"))
    at = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)
    with (
        transaction.atomic(),
        audit_maintenance(actor=Actor.system("tests"), reason="tests: a history over several hours"),
    ):
        for index, event in enumerate(events):
            step = steps[min(index, len(steps) - 1)] if steps else {"hours": 0, "minutes": 0}
            at += timedelta(hours=step["hours"], minutes=step["minutes"])
            AuditEvent.objects.filter(pk=event.pk).update(created_at=at)


def _evidence(e: dict) -> dict:
    return e["evidence"] if isinstance(e["evidence"], dict) else {}


def _first_settlement(transitions: list[dict], entries: list[int]) -> dict | None:
    """The first unknown episode settled (COMMITTED / NOT_COMMITTED out of UNKNOWN) with no person in it: no user,
    no approved action, no HUMAN_REVIEW from its entry on."""
    unknown, settled = {S.UNKNOWN, S.STILL_UNKNOWN}, {S.COMMITTED, S.NOT_COMMITTED}
    for start, end in zip(entries, [*entries[1:], len(transitions)][: len(entries)], strict=True):
        for e in transitions[start:end]:
            if e["actor_kind"] == "user" or "action_request" in str(e["evidence"]) or e["to_state"] == S.HUMAN_REVIEW:
                break
            if e["from_state"] in unknown and e["to_state"] in settled:
                return e
    return None


def _is_attempt_outcome(e: dict) -> bool:
    ev = _evidence(e)
    return ("row" in ev and e["to_state"] != S.SENT) or ("outcome_timeout_s" in ev and e["from_state"] == S.SENT)


def recompute() -> Counter:
    """Every call's series from its whole story, read at once: the definitions of recovery.engine.metrics's FIGURES,
    written per call instead of per event."""
    calls = {c["id"]: c for c in Call.objects.values("id", "tool_id", "tenant_id", "side_effect")}
    stories = defaultdict(list)
    rows = AuditEvent.objects.filter(call_id__isnull=False).order_by("seq")
    for e in rows.values("seq", "call_id", "action", "from_state", "to_state", "actor_kind", "evidence", "created_at"):
        stories[e["call_id"]].append(e)
    out: Counter = Counter()
    for call_id, story in stories.items():
        c = calls[call_id]

        def put(series, label="", n=1, at=None, c=c):
            out[(at, c["tenant_id"], c["tool_id"], series, label)] += n

        _recount_cohort(story, c["side_effect"] == "write", put)
        queue_since = {}
        for e in story:
            _recount_event(e, put)
            if e["action"] == "call.transition":
                _recount_queues(e, queue_since, put)
    return +out


def _recount_cohort(story: list[dict], write: bool, put) -> None:
    """The series counted once per call, in its cohort: the hour of the first attempt — or of the first fact a cohort
    counts, if that came first."""
    unknown = {S.UNKNOWN, S.STILL_UNKNOWN}
    transitions = [e for e in story if e["action"] == "call.transition"]
    entries = [i for i, e in enumerate(transitions) if e["to_state"] in unknown and e["from_state"] not in unknown]
    duplicate = next((e for e in transitions if _evidence(e).get("outcome") == "duplicate_effect"), None)
    committed = next((i for i, e in enumerate(story) if e["to_state"] == S.COMMITTED), None)
    settles = _first_settlement(transitions, entries) if write else None
    counted = {
        m.UNKNOWN_CALLS: transitions[entries[0]] if write and entries else None,
        m.UNKNOWN_SETTLED: settles,
        m.DUPLICATE_CALLS: duplicate if write else None,
        m.COMMITTED_CALLS: story[committed] if committed is not None else None,
    }
    opening = [e for e in story if e["action"] == "call.replayed" or _is_attempt_event(e)]
    opening += [e for e in counted.values() if e is not None]
    if not opening:
        return
    cohort = m.hour_of(min(opening, key=lambda e: e["seq"])["created_at"])
    put(m.CALLS, at=cohort)
    if write:
        put(m.WRITE_CALLS, at=cohort)
    for series, e in counted.items():
        if e is not None:
            put(series, at=cohort)
    if committed is not None:
        before = [e for e in story[: committed + 1] if e["action"] == "call.replayed" or _is_attempt_outcome(e)]
        put(m.COMMITTED_RETRIES, n=max(len(before) - 1, 0), at=cohort)


def _is_attempt_event(e: dict) -> bool:
    """A transition that admits an attempt (into SENT) or reports its outcome."""
    return e["action"] == "call.transition" and (e["to_state"] == S.SENT or _is_attempt_outcome(e))


def _recount_event(e: dict, put) -> None:
    """The series counted by event time, in the hour of the event."""
    hour, ev = m.hour_of(e["created_at"]), _evidence(e)
    if e["action"] == "call.replayed":
        put(m.ATTEMPTS, "reconcile_replay", at=hour)
    if e["action"] == "call.checked" and ev.get("source") in m.CHECK_SOURCES:
        put(m.RECONCILE_CHECKS, ev["observed"], at=hour)
    if e["action"] != "call.transition":
        return
    if _is_attempt_outcome(e):
        swept = "outcome_timeout_s" in ev
        put(m.ATTEMPTS, "no_outcome" if swept else e["to_state"].lower(), at=hour)
        if ev.get("class"):
            put(m.FAILURES, ev["class"], at=hour)
        if ev.get("route") and not swept:
            put(m.DECISIONS, ev["route"], at=hour)
    if ev.get("source") in m.CHECK_SOURCES:
        put(m.RECONCILE_CHECKS, ev["observed"], at=hour)
    if ev.get("outcome") in m.BUDGET_OUTCOMES:
        put(m.BUDGET_EXHAUSTED, ev["outcome"], at=hour)
    if e["to_state"] == S.HUMAN_REVIEW:
        person = e["actor_kind"] == "user" or "action_request" in ev
        why = ev.get("outcome") or ("escalated" if person else ev.get("class") or "other")
        put(m.HUMAN_TAKEOVERS, why, at=hour)


def _recount_queues(e: dict, queue_since: dict, put) -> None:
    """A transition between queues: an entry, and the resolution of the queue left with the time it waited."""
    hour = m.hour_of(e["created_at"])
    was = next((q for q, states in m.QUEUES.items() if e["from_state"] in states), "")
    now = next((q for q, states in m.QUEUES.items() if e["to_state"] in states), "")
    if was == now:
        return
    if was and was in queue_since:
        waited = (e["created_at"] - queue_since.pop(was)).total_seconds()
        bound = next(b for b in m.RESOLUTION_BUCKETS_S if max(waited, 0) <= b)
        put(m.RESOLUTIONS, m.bucket_label(was, bound), at=hour)
        put(m.RESOLUTION_MS, was, n=round(max(waited, 0) * 1000), at=hour)
    queue_since.clear()
    if now:
        queue_since[now] = e["created_at"]
        put(m.QUEUE_ENTRIES, now, at=hour)


def _stored() -> Counter:
    rows = MetricRollup.objects.filter(period=m.HOUR).exclude(tenant_id=0).exclude(tool_id=m.ALL_TOOLS)
    return +Counter(
        {(r.start, r.tenant_id, r.tool_id, r.series, r.label): r.value for r in rows if r.series not in _NOT_CALLS}
    )


_NOT_CALLS = {m.TASK_OUTCOMES, m.PROBES, m.COMPENSATIONS, m.ACTIONS, m.BREAKER_OPEN_MS, m.BREAKER_OPENINGS}


def _levels_add_up() -> None:
    """Tenant 0 is the sum of every tenant; ALL_TOOLS the sum of every tool; a day the sum of its hours; a total the
    sum of everything."""
    tools: Counter = Counter()
    all_tools: Counter = Counter()
    for r in MetricRollup.objects.all():
        if r.tool_id == m.ALL_TOOLS:
            all_tools[(r.period, r.start, r.tenant_id, r.series, r.label)] += r.value
        else:
            tools[(r.period, r.start, r.tenant_id, r.series, r.label)] += r.value
    assert +all_tools == +tools
    hourly: Counter = Counter()
    by_all: Counter = Counter()
    daily: Counter = Counter()
    totals: Counter = Counter()
    for r in MetricRollup.objects.exclude(tool_id=m.ALL_TOOLS):
        if r.period == m.HOUR and r.tenant_id:
            hourly[(r.start, r.tool_id, r.series, r.label)] += r.value
            daily[(r.start // m.DAY * m.DAY, r.tenant_id, r.tool_id, r.series, r.label)] += r.value
            totals[(r.tenant_id, r.tool_id, r.series, r.label)] += r.value
        elif r.period == m.HOUR:
            by_all[(r.start, r.tool_id, r.series, r.label)] += r.value
    stored_days = Counter(
        {
            (r.start, r.tenant_id, r.tool_id, r.series, r.label): r.value
            for r in MetricRollup.objects.filter(period=m.DAY).exclude(tenant_id=0).exclude(tool_id=m.ALL_TOOLS)
        }
    )
    stored_totals = Counter(
        {(r.tenant_id, r.tool_id, r.series, r.label): r.value for r in MetricTotal.objects.exclude(tenant_id=0)}
    )
    assert +by_all == +hourly
    assert +stored_days == +daily
    assert +stored_totals == +totals


@pytest.fixture
def tenants(registry):
    return [registry["tenant"], Tenant.objects.create(name="other", all_tools=True)]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(histories=HISTORY, batches=st.lists(st.integers(1, 9), min_size=1, max_size=3))
def test_the_rollups_equal_a_recomputation_from_the_raw_rows(make_call, registry, tenants, histories, batches):
    half = len(histories) // 2
    for side_effect, tenant, steps in histories[:half]:
        _write(make_call, registry, tenants, side_effect, tenant, steps)
    metrics_fold(batch=batches[0])  # a fold between two writers: the watermark carries the rest
    for side_effect, tenant, steps in histories[half:]:
        _write(make_call, registry, tenants, side_effect, tenant, steps)
    for size in batches:
        metrics_fold(batch=size)

    assert _stored() == recompute()
    _levels_add_up()
    last = AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0
    assert MetricFold.objects.get(key="audit").seq == last


def test_no_rate_passes_one_hundred_percent_after_random_histories(make_call, registry, tenants):
    rng = random.Random(25)
    for _ in range(40):
        steps = [
            {**dict.fromkeys(("hours", "minutes", "approved"), 1), "choice": rng.randrange(100), "actor": "job",
             "class": "", "route": "", "outcome": rng.choice(OUTCOMES), "observed": rng.choice(OBSERVED),
             "source": "poll", "swept": False, "extra": rng.choice(("", "replayed"))}
            for _ in range(rng.randrange(8))
        ]  # fmt: skip
        _write(make_call, registry, tenants, rng.choice(("write", "read")), rng.randrange(2), steps)
    metrics_fold()
    for window in ("24h", "7d", "30d"):
        report = metrics_report(now=datetime(2026, 12, 1, tzinfo=UTC), window=window)
        for figure in report.figures:
            if figure.figure.kind == "rate" and figure.value is not None:
                assert 0 <= figure.value <= 1, figure
                assert all(p.value is None or 0 <= p.value <= 1 for p in figure.series)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_second_fold_skips_while_the_first_holds_the_watermark(make_call, registry):
    call = make_call()
    with transaction.atomic():
        transition_call(call, S.SENT, actor=JOB, reason="admitted")
    metrics_fold()
    with transaction.atomic():
        transition_call(call, S.COMMITTED, actor=JOB, reason="committed", evidence={"row": "10"})
    held, release = threading.Event(), threading.Event()
    seen: list[int] = []

    def holder():
        with transaction.atomic():
            MetricFold.objects.select_for_update().get(key="audit")
            held.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    seen.append(metrics_fold())  # skips: the row is held
    release.set()
    thread.join()
    seen.append(metrics_fold())
    assert seen == [0, 1]
    totals = metrics_totals(now=datetime.now(UTC))
    assert totals.counts[m.ATTEMPTS] == [(registry["refund"].pk, "committed", 1)]

"""Running the fault drills of SPEC §18 on a stage, and judging them against the pinned table (drills/table.py).

    with drill_stage() as stage:
        result = run_drill(stage, "timeout-after-send", log=print)
        result.passed, result.keys, result.checks

Each drill drives the demo agent (recovery/agent/runtime.py) through the real API, background jobs and sandbox
process, then reads back what happened from two places that share nothing: the sandbox's ledger and request log
(the provider's evidence) and the database's audit trail, attempts and receipts (the console's). One row per key
compares the call's observed end — the states the audit trail shows it passing through after READY — and the
ledger's effects for its key with the table's; the drill's checks compare the rest (request times, receipts,
breaker events, leases). A drill passes only when every row and every check the table names holds.

Drills run one after another on one stage and do not lean on each other: each starts and ends by clearing the
sandbox's faults and turning its callbacks off (only the duplicate-callbacks drill turns them on), and uses keys,
tasks and order ids unique to the run. `expect=` runs a drill against another expectation than the table's (the
tests use it to prove that a mismatch fails).
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import count, pairwise

from django.db import connection
from django.utils import timezone

from recovery.agent.runtime import HUMAN_REVIEW, Agent, CallResult
from recovery.audit import Actor
from recovery.client import RecoveryError
from recovery.drills.results import CheckRow, DrillResult, KeyRow
from recovery.drills.stage import Stage, callback_url, drill_people, parent_pid
from recovery.drills.table import ARROW, BACKLOG_DEFAULT, DRILLS, ROUNDS_DEFAULT, Drill
from recovery.models import (
    ActionRequest,
    ActionStatus,
    Attempt,
    AuditEvent,
    Breaker,
    Call,
    Decision,
    GateDecision,
    Receipt,
    Tool,
)
from recovery.registry.policy import breaker_policy
from recovery.sandbox.process import SandboxProcess
from recovery.services.actions import ActionRefused, action_approve, action_preview, action_request
from recovery.states import RECONCILABLE, CallState

S = CallState
Log = Callable[[str], None]

PATIENCE_S = 60.0  # how long the drill agent waits for reconciliation before it calls a call unsettled
BACKLOG_THREADS = 16  # refunds made at once by the backlog drill
# One backlog runtime in this many asks for an immediate check of its call (POST .../reconcile): a job of its own,
# racing the periodic reconciliation on another worker for the same calls. (Not every one: on RQ each such job is a
# forked work horse, which would double the drill's cost.)
IMMEDIATE_EVERY = 10
ROWS_LOGGED = 12  # per-key rows printed one by one; beyond, only the ones that failed
UNSETTLED_STATES = (S.SENT, *sorted(RECONCILABLE), S.NOT_COMMITTED)
SETUP_THREADS = 8  # refunds made at once while the two-approvers drill sets its rounds up
EXECUTION_WAIT_S = 120  # how long a drill waits for approved replays to be executed
# The worker-killed drill: how long the sandbox holds the replay's reply (the worker is killed well inside it, and
# inside the drill provider's 2 s read timeout), and how long the drill waits for the execution lease to lapse (14 s
# on the drill provider), the sweeper (10 s outcome timeout) and a receipt.
HOLD_REPLY_MS = 8000
KILL_AFTER_S = 0.3  # after the admission: the request leaves at once and is at the sandbox well before this
SETTLE_WAIT_S = 90


# Running ------------------------------------------------------------------------------------------------------------


def run_drills(
    stage: Stage,
    slugs: Iterable[str] | None = None,
    *,
    log: Log = print,
    backlog: int = BACKLOG_DEFAULT,
    rounds: int = ROUNDS_DEFAULT,
) -> list[DrillResult]:
    """The named drills (all by default), in the table's order, one after another on `stage`."""
    wanted = set(slugs) if slugs is not None else set(DRILLS)
    return [run_drill(stage, slug, log=log, backlog=backlog, rounds=rounds) for slug in DRILLS if slug in wanted]


def missing_service(stage: Stage, drill: Drill) -> str:
    """Why `drill` cannot run on `stage` ("" when it can)."""
    if drill.needs == "redis" and stage.workers is None:
        return "needs REDIS_URL: RQ worker processes to kill -9 (the in-process runner's jobs run inside this process)"
    return ""


def run_drill(
    stage: Stage,
    slug: str,
    *,
    log: Log = print,
    backlog: int = BACKLOG_DEFAULT,
    rounds: int = ROUNDS_DEFAULT,
    expect: Drill | None = None,
) -> DrillResult:
    """Run one drill and judge it against `expect` (the table's row by default). Never raises for a failing drill:
    an exception inside it is a FAIL with the error in the result; a drill whose service is missing is skipped
    (`skipped` says why, `passed` is False)."""
    drill = expect or DRILLS[slug]
    run = _Run(stage, drill, log)
    log(f"== {drill.name} ({slug}) ==")
    if why := missing_service(stage, drill):
        log(f"  skipped: {why}")
        return DrillResult(
            slug=slug,
            name=drill.name,
            injected=drill.injected,
            expected=drill.expected_summary(),
            observed=f"skipped: {why}",
            passed=False,
            seconds=0.0,
            skipped=why,
        )
    log(f"  injected: {drill.injected}")
    log(f"  expected: {drill.expected_end}")
    began, error = time.monotonic(), ""
    try:
        _reset_sandbox(stage)
        body = RUNNERS[slug]
        if slug == "queue-backlog":
            body(run, count=backlog)
        elif slug == "two-approvers":
            body(run, rounds=rounds)
        else:
            body(run)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        log(f"  the drill stopped: {error}")
        log("  " + "".join(traceback.format_exception(exc)[-3:]).strip().replace("\n", "\n  "))
    finally:
        try:
            _reset_sandbox(stage)
        except Exception as exc:  # the result still counts; the next drill's own reset will say what is wrong
            log(f"  could not reset the sandbox: {exc}")
    result = _judge(run, slug, error, time.monotonic() - began)
    _log_result(result, log)
    return result


class _Run:
    """One drill in progress: the calls it made (each one a key row) and the checks it reported."""

    def __init__(self, stage: Stage, drill: Drill, log: Log) -> None:
        self.stage, self.drill, self.log = stage, drill, log
        self.calls: list[tuple[str, int | None]] = []
        self.checks: list[CheckRow] = []
        self.started = timezone.now()
        self.steps = count(1)
        self.tag = uuid.uuid4().hex[:6]  # this drill run's: the same drill may run again on the same stage
        self._lock = threading.Lock()

    @property
    def sandbox(self):
        return self.stage.sandbox

    def agent(self, **options) -> Agent:
        options.setdefault("log", self.log)
        options.setdefault("patience_s", PATIENCE_S)
        return self.stage.agent(**options)

    def call(self, result: CallResult) -> CallResult:
        with self._lock:
            self.calls.append((result.key, result.call_id))
        return result

    def check(self, name: str, *, expected: str, observed: str, passed: bool) -> None:
        self.checks.append(CheckRow(name=name, expected=expected, observed=observed, passed=bool(passed)))

    def key(self, name: str) -> str:
        """An idempotency key or task id unique to this drill run (it ends in the stage's run id)."""
        return self.stage.key(f"{name}-{self.tag}")

    def order_id(self, n: int) -> str:
        """An order id (O-<digits>) unique to this drill run."""
        return f"O-{int(self.tag, 16):08d}{n:04d}"


def _reset_sandbox(stage: Stage) -> None:
    sandbox = stage.sandbox
    if isinstance(sandbox, SandboxProcess) and (sandbox.process is None or sandbox.process.poll() is not None):
        sandbox.start()  # a drill that stopped it and failed before starting it again
    sandbox.clear_faults()
    sandbox.configure(callback_url=None)


# Judging ------------------------------------------------------------------------------------------------------------


def _judge(run: _Run, slug: str, error: str, seconds: float) -> DrillResult:
    drill = run.drill
    ids = [call_id for _, call_id in run.calls if call_id is not None]
    paths, told = call_paths(ids), last_word(ids)
    try:
        effects = run.sandbox.ledger()["by_key"]
    except Exception as exc:
        effects, error = {}, error or f"the sandbox ledger could not be read: {exc}"
    rows = []
    for key, call_id in run.calls:
        path = paths.get(call_id, ())
        said = told.get(call_id, "")
        ended = any(end.matches(path, said) for end in drill.ends)
        observed_effects = effects.get(key, 0)
        rows.append(
            KeyRow(
                key=key,
                call_id=call_id,
                expected_end=drill.describe_end(),
                observed_end=describe_path(path, said),
                expected_effects=drill.effects,
                observed_effects=observed_effects,
                passed=ended and observed_effects == drill.effects,
            )
        )
    checks = list(run.checks)
    reported = {check.name for check in checks}
    for name in drill.checks:
        if name not in reported:
            checks.append(CheckRow(name=name, expected="made", observed="not made: the drill stopped", passed=False))
    passed = not error and bool(rows) and all(row.passed for row in rows) and all(check.passed for check in checks)
    return DrillResult(
        slug=slug,
        name=drill.name,
        injected=drill.injected,
        expected=drill.expected_summary(),
        observed=_observed_summary(rows, checks, error),
        passed=passed,
        seconds=round(seconds, 2),
        keys=rows,
        checks=checks,
        error=error,
    )


def rejudge(stage: Stage, result: DrillResult, expect: Drill) -> DrillResult:
    """Judge a finished drill's calls and checks again against another expectation, from the audit trail and the
    sandbox's ledger as they are now: the same evidence, another table (tests prove a wrong one fails)."""
    run = _Run(stage, expect, lambda line: None)
    run.calls = [(row.key, row.call_id) for row in result.keys]
    run.checks = list(result.checks)
    return _judge(run, result.slug, result.error, result.seconds)


def _chunks(ids: list[int], size: int = 500) -> Iterator[list[int]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def call_paths(ids: list[int]) -> dict[int, tuple[str, ...]]:
    """Each call's states after READY, in order, from its audit trail (the transitions, not the call row)."""
    paths: dict[int, list[str]] = {}
    for chunk in _chunks(ids):
        events = (
            AuditEvent.objects.filter(call_id__in=chunk)
            .exclude(from_state="")
            .exclude(to_state="")
            .order_by("seq")
            .values_list("call_id", "to_state")
        )
        for call_id, state in events:
            paths.setdefault(call_id, []).append(state)
    return {call_id: tuple(path) for call_id, path in paths.items()}


def last_word(ids: list[int]) -> dict[int, str]:
    """What the console last told the runtime about each call: its latest admission answer ("admitted", or the
    denial's required_next action, e.g. "degrade") or decision card (its required_next action), whichever came last.
    Dry-run gate answers are left out: they are never acted on."""
    latest: dict[int, tuple[datetime, int, str]] = {}

    def heard(call_id: int, at: datetime, rank: int, said: str) -> None:
        # At the same instant a decision card (rank 1) follows the admission (rank 0) it answers.
        if call_id not in latest or (at, rank) >= latest[call_id][:2]:
            latest[call_id] = (at, rank, said)

    for chunk in _chunks(ids):
        gates = GateDecision.objects.filter(call_id__in=chunk, dry_run=False).order_by("id")
        for call_id, at, allowed, required_next, reason in gates.values_list(
            "call_id", "created_at", "allowed", "required_next", "reason"
        ):
            heard(call_id, at, 0, "admitted" if allowed else (required_next or {}).get("action") or reason)
        cards = Decision.objects.filter(call_id__in=chunk).order_by("id")
        for call_id, at, required_next, route in cards.values_list("call_id", "created_at", "required_next", "route"):
            heard(call_id, at, 1, (required_next or {}).get("action") or route)
    return {call_id: word[2] for call_id, word in latest.items()}


def describe_path(path: tuple[str, ...], told: str) -> str:
    final = path[-1] if path else S.READY
    text = ARROW.join(path) if path else S.READY
    return f"{text}, told: {told}" if final in (S.READY, S.RETRYABLE) and told else text


def _observed_summary(rows: list[KeyRow], checks: list[CheckRow], error: str) -> str:
    if error:
        return f"error: {error}"
    if not rows:
        return "no call was made"
    ends = Counter(row.observed_end for row in rows)
    effects = Counter(row.observed_effects for row in rows)
    if len(rows) == 1:
        effect = rows[0].observed_effects
        text = f"{rows[0].observed_end}; {effect} effect{'s' if effect != 1 else ''}"
    else:
        text = " | ".join(f"{n} x {end}" for end, n in ends.items())
        text += "; effects " + ", ".join(f"{n} x {e}" for e, n in sorted(effects.items()))
    failed = [check for check in checks if not check.passed]
    if failed:
        return f"{text}; check failed: {failed[0].name}: {failed[0].observed}"
    return f"{text}; checks {len(checks)}/{len(checks)}"


def _log_result(result: DrillResult, log: Log) -> None:
    shown = result.keys if len(result.keys) <= ROWS_LOGGED else [row for row in result.keys if not row.passed]
    if len(result.keys) > ROWS_LOGGED:
        good, first = sum(row.passed for row in result.keys), result.keys[0]
        log(
            f"  keys: {good} of {len(result.keys)} as expected"
            f" ({first.expected_end}; {first.expected_effects} effect(s) each)"
        )
    for row in shown[:ROWS_LOGGED]:
        seen = f"  key {row.key} (call {row.call_id}): {row.observed_end}, {row.observed_effects} effect(s)"
        log(f"{seen} ok" if row.passed else f"{seen} MISMATCH: expected {row.expected_end}, {row.expected_effects}")
    for check in result.checks:
        seen = f"  check: {check.name}: {check.observed}"
        log(f"{seen} ok" if check.passed else f"{seen} FAIL: expected {check.expected}")
    log(f"  {'PASS' if result.passed else 'FAIL'} in {result.seconds:.1f} s")


# Evidence helpers ---------------------------------------------------------------------------------------------------


def _at(entry: dict) -> datetime:
    """A sandbox log entry's time (ISO 8601, UTC)."""
    return datetime.fromisoformat(entry["at"].replace("Z", "+00:00"))


def _attempts(call_id: int | None) -> list[Attempt]:
    return list(Attempt.objects.filter(call_id=call_id).order_by("number"))


def _posts_since(run: _Run, path: str) -> list[dict]:
    return [entry for entry in run.sandbox.requests(path_prefix=path, method="POST") if _at(entry) >= run.started]


def _wait(condition: Callable[[], bool], timeout_s: float, every_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


def _refund(run: _Run, label: str, n: int) -> tuple[str, dict]:
    key = run.key(f"refund-{label}")
    return key, {"order_id": run.order_id(n), "amount_cents": 1250 + n}


# The drills ---------------------------------------------------------------------------------------------------------


def refused_before_send(run: _Run) -> None:
    """The provider's port is closed for the first attempt (the sandbox process is stopped just before it is sent,
    and started again on the same port before the second)."""
    stage, sandbox = run.stage, run.sandbox
    if not isinstance(sandbox, SandboxProcess):
        raise RuntimeError("this drill stops and starts the sandbox process: run it on drill_stage()")
    key, arguments = _refund(run, "refused", 1)

    def before_send(tool: str, sent_key: str, number: int) -> None:
        if sent_key != key:
            return
        if number == 1:
            sandbox.stop()
            run.log(f"  the sandbox is stopped: {sandbox.url} refuses connections")
        elif sandbox.process is None:
            sandbox.start()
            sandbox.configure(callback_url=None)
            run.log(f"  the sandbox is back on {sandbox.url}")

    agent = run.agent(before_send=before_send)
    task = agent.start_task(run.key("drill-refused"), goal="refund an order while the provider is down")
    result = run.call(agent.run_call(task.id, step=1, tool=stage.tool("refund.create"), key=key, arguments=arguments))
    agent.submit(task.id, f"refund {result.state}")

    attempts = _attempts(result.call_id)
    first = attempts[0] if attempts else None
    seen = f"{first.error_kind or first.http_status}, connection opened: {first.connection_opened}" if first else "none"
    run.check(
        "the first attempt's facts come from the real exception",
        expected="connection_refused, connection opened: False",
        observed=seen,
        passed=first is not None and first.error_kind == "connection_refused" and first.connection_opened is False,
    )
    posts = sandbox.requests(key=key, method="POST")
    first_sent = result.sent[0].sent_at if result.sent else None
    after_first = all(_at(post).timestamp() > first_sent for post in posts) if first_sent else False
    run.check(
        "the sandbox logged no request for the first attempt",
        expected="2 attempts, 1 request logged, made after the first attempt",
        observed=f"{len(attempts)} attempts, {len(posts)} request(s) logged"
        + (", after the first attempt" if posts and after_first else ""),
        passed=len(attempts) == 2 and len(posts) == 1 and after_first,
    )
    keys = sorted({post["key"] for post in _posts_since(run, "/refunds")})
    run.check(
        "the retry carried the same key",
        expected=f"every refund request under {key}",
        observed=f"refund requests under {', '.join(map(str, keys)) or 'no key'}",
        passed=keys == [key],
    )


def timeout_after_send(run: _Run) -> None:
    """The refund commits and its reply is dropped: UNKNOWN, settled by a status query, never sent again."""
    stage, sandbox = run.stage, run.sandbox
    key, arguments = _refund(run, "reply-lost", 1)
    sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    agent = run.agent()
    task = agent.start_task(run.key("drill-reply-lost"), goal="refund an order whose reply is lost")
    result = run.call(agent.run_call(task.id, step=1, tool=stage.tool("refund.create"), key=key, arguments=arguments))
    agent.submit(task.id, f"refund {result.state}")

    applied = list(Receipt.objects.filter(call_id=result.call_id, applied=True).order_by("id"))
    _check_settled_by_one_receipt(run, applied, "one applied receipt: committed, UNKNOWN → COMMITTED")
    _one_request(run, key)


def _one_request(run: _Run, key: str) -> None:
    posts = run.sandbox.requests(key=key, method="POST")
    run.check(
        "no second request",
        expected="1 refund request under the key",
        observed=f"{len(posts)} ({', '.join(post['outcome'] for post in posts)})",
        passed=len(posts) == 1,
    )


def lost_before_commit(run: _Run) -> None:
    """The request is held past the client's read timeout and then dropped unexecuted: UNKNOWN, a receipt proves
    nothing happened, and the same-key retry commits once."""
    stage, sandbox = run.stage, run.sandbox
    key, arguments = _refund(run, "lost", 1)
    read_timeout_s = float(stage.registry["providers"][0].get("read_timeout_s", 5))
    sandbox.fault(route="/refunds", key=key, kind="latency", ms=int(read_timeout_s * 1000) + 500, times=1)
    sandbox.fault(route="/refunds", key=key, kind="drop_before_commit", times=1)
    agent = run.agent()
    task = agent.start_task(run.key("drill-lost"), goal="refund an order whose request is lost")
    result = run.call(agent.run_call(task.id, step=1, tool=stage.tool("refund.create"), key=key, arguments=arguments))
    agent.submit(task.id, f"refund {result.state}")

    attempts = _attempts(result.call_id)
    first = attempts[0] if attempts else None
    run.check(
        "the client timed out",
        expected="read_timeout on the first attempt",
        observed=(first.error_kind or str(first.http_status)) if first else "no attempt",
        passed=first is not None and first.error_kind == "read_timeout",
    )
    posts = sandbox.requests(key=key, method="POST")
    run.check(
        "the provider executed nothing for the first request",
        expected="the first request dropped before commit",
        observed=posts[0]["outcome"] if posts else "no request logged",
        passed=bool(posts) and posts[0]["outcome"] == "dropped_before_commit",
    )
    proof = Receipt.objects.filter(call_id=result.call_id, applied=True, observed="not_committed").first()
    second = attempts[1] if len(attempts) > 1 else None
    in_time = proof is not None and second is not None and proof.checked_at < second.admitted_at
    run.check(
        "a receipt proved it not committed before the retry",
        expected="a not_committed receipt, then the retry admitted with state_verified",
        observed=(
            f"receipt {proof.pk} ({proof.provider_status}) at {proof.checked_at:%H:%M:%S.%f}"[:-3]
            if proof
            else "no not_committed receipt"
        )
        + (f"; retry admitted with {second.evidence} at {second.admitted_at:%H:%M:%S.%f}"[:-3] if second else ""),
        passed=in_time and "state_verified" in (second.evidence or []),
    )
    keys = [post["key"] for post in _posts_since(run, "/refunds")]
    run.check(
        "the retry carried the same key",
        expected=f"2 refund requests, both under {key}",
        observed=f"{len(keys)} refund request(s) under {', '.join(sorted(set(map(str, keys))))}",
        passed=keys == [key, key],
    )


def duplicate_callbacks(run: _Run) -> None:
    """An UNKNOWN refund (accepted as pending, reply dropped) completes at the provider while the agent waits, and
    the provider delivers its signed callback three times: one receipt applies, the copies change nothing."""
    stage, sandbox = run.stage, run.sandbox
    key, arguments = _refund(run, "callbacks", 1)
    sandbox.configure(callback_url=callback_url(stage.api_url))
    sandbox.fault(route="/refunds", key=key, kind="pending", checks=0, times=1)
    sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    sandbox.fault(route="/refunds", key=key, kind="duplicate_callbacks", copies=3, times=1)
    finished = []

    def sleep(seconds: float) -> None:
        if not finished:  # the agent has just been told to wait for reconciliation: the call is UNKNOWN
            finished.append(True)
            # The provider finishes the pending refund (one status read of the sandbox's own, standing for time
            # passing there), which sends its callback, three copies of one signed event.
            sandbox.call("GET", f"/refunds/by-key/{key}", timeout=5)
            run.log("  the provider completes the refund and calls back (3 copies of one event)")
        time.sleep(seconds)

    agent = run.agent(sleep=sleep)
    task = agent.start_task(run.key("drill-callbacks"), goal="refund an order the provider confirms by callback")
    result = run.call(agent.run_call(task.id, step=1, tool=stage.tool("refund.create"), key=key, arguments=arguments))
    agent.submit(task.id, f"refund {result.state}")

    def deliveries() -> list[dict]:
        return [entry for entry in sandbox.callbacks() if entry["idempotency_key"] == key]

    _wait(lambda: len(deliveries()) >= 3, 10)
    delivered = deliveries()
    events = sorted({entry["event_id"] for entry in delivered})
    answered = [entry["status"] for entry in delivered]
    run.check(
        "the provider delivered one event 3 times",
        expected="3 deliveries of one event id, each answered 2xx",
        observed=f"{len(delivered)} deliveries of {len(events)} event(s), answered {answered}",
        passed=len(delivered) == 3
        and len(events) == 1
        and all(isinstance(status, int) and 200 <= status < 300 for status in answered),
    )
    stored = Receipt.objects.filter(call_id=result.call_id, event_id__in=events).count()
    applied = list(Receipt.objects.filter(call_id=result.call_id, applied=True).values_list("source", flat=True))
    path = call_paths([result.call_id]).get(result.call_id, ())
    out_of_unknown = sum(1 for before, after in pairwise(path) if before == S.UNKNOWN and after)
    run.check(
        "one receipt applied, one transition",
        expected="1 receipt stored for the event; 1 receipt applied; 1 transition out of UNKNOWN",
        observed=f"{stored} receipt(s) stored for the event; {len(applied)} applied ({', '.join(applied)});"
        f" {out_of_unknown} transition(s) out of UNKNOWN",
        passed=stored == 1 and len(applied) == 1 and out_of_unknown == 1,
    )


def rate_limit(run: _Run) -> None:
    """A lookup answered 429 with Retry-After: 2 twice, then the answer: the agent waits out each Retry-After."""
    stage, sandbox = run.stage, run.sandbox
    order = run.order_id(1)
    route = f"/replica/orders/{order}"
    sandbox.fault(route=route, kind="rate_limit", retry_after_s=2, times=2)
    agent = run.agent()
    task = agent.start_task(run.key("drill-rate-limit"), goal="look up an order at a rate-limited provider")
    key = run.key("lookup-rate-limited")
    tool = stage.tool("order.lookup_replica")
    result = run.call(agent.run_call(task.id, step=1, tool=tool, key=key, arguments={"order_id": order}))
    agent.submit(task.id, f"lookup {result.state}")

    cards = Decision.objects.filter(call_id=result.call_id).order_by("id")
    waits = [(row.get("action"), row.get("after_ms")) for row in cards.values_list("required_next", flat=True)]
    run.check(
        "the decision cards named the Retry-After",
        expected="retry_after ≥ 2000 ms, twice",
        observed=", ".join(f"{action} {after} ms" for action, after in waits) or "no decision card",
        passed=len(waits) == 2 and all(action == "retry_after" and (after or 0) >= 2000 for action, after in waits),
    )
    logged = sandbox.requests(path_prefix=route)
    gaps = [
        (_at(later) - _at(earlier)).total_seconds() for earlier, later in pairwise(logged) if earlier["status"] == 429
    ]
    run.check(
        "no attempt before its Retry-After",
        expected="3 requests; after each 429 the next ≥ 2.0 s later",
        observed=f"{len(logged)} requests ({', '.join(str(entry['status']) for entry in logged)}); "
        f"gaps after a 429: {', '.join(f'{gap:.2f} s' for gap in gaps) or 'none'}",
        passed=len(logged) == 3 and len(gaps) == 2 and all(gap >= 2.0 for gap in gaps),
    )


def dependency_5xx(run: _Run) -> None:
    """Every lookup answered 503: calls spend their attempts until the breaker opens, then are denied at admission
    with `degrade`; after the cooldown, of four runtimes asking at once exactly one probe reaches the provider. The
    fault is then cleared and the breaker closed again by a probe that succeeds (so later drills find it closed)."""
    stage, sandbox = run.stage, run.sandbox
    tool_name = stage.tool("order.lookup")
    tool = Tool.objects.get(name=tool_name)
    cooldown_s = breaker_policy(tool).cooldown_s
    left = _close_breaker(run, tool, cooldown_s)  # an earlier run may have left it open
    if not left.startswith("already closed"):
        run.log(f"  the breaker was left open by an earlier run: {left}")
    sandbox.fault(route="/orders", method="GET", kind="error", status=503)
    agent = run.agent()
    task = agent.start_task(run.key("drill-5xx"), goal="look up orders while the order service fails")

    def lookup(runtime: Agent, label: str) -> CallResult:
        n = next(run.steps)
        result = run.call(
            runtime.run_call(
                task.id, step=n, tool=tool_name, key=run.key(f"lookup-5xx-{label}"),
                arguments={"order_id": run.order_id(n)},
            )
        )  # fmt: skip
        return result

    denied_fresh = []
    for n in range(1, 9):
        result = lookup(agent, f"{n}")
        if result.attempts and not result.attempts[0].admitted:
            denied_fresh.append(result)
            break
    opened = list(
        AuditEvent.objects.filter(action="breaker.opened", created_at__gte=run.started, evidence__tool=tool_name)
    )
    run.check(
        "the breaker opened",
        expected="breaker.opened for the tool",
        observed="; ".join(f"opened: {event.reason}" for event in opened) or "never opened",
        passed=bool(opened),
    )
    if not opened:
        return
    opened_at = opened[0].created_at
    cool_until = opened_at + timedelta(seconds=cooldown_s)
    # Until the cooldown of its latest opening is over (on a slow machine a probe may already have reopened it).
    latest = Breaker.objects.get(tool=tool).opened_at or opened_at
    _sleep_until(max(cool_until, latest + timedelta(seconds=cooldown_s)) + timedelta(seconds=0.3))
    while_open = [
        entry for entry in sandbox.requests(path_prefix="/orders/", method="GET") if opened_at < _at(entry) < cool_until
    ]
    run.check(
        "while open, admission refused before anything was sent",
        expected="a fresh call denied with degrade; no request reached the provider during the cooldown",
        observed=f"{len(denied_fresh)} fresh call(s) denied ({', '.join(r.attempts[0].denied for r in denied_fresh)});"
        f" {len(while_open)} request(s) during the cooldown",
        passed=bool(denied_fresh) and not while_open,
    )

    # After the cooldown: four runtimes at once, one half-open probe.
    probe_from = timezone.now()
    runtimes = [run.agent() for _ in range(4)]
    with ThreadPoolExecutor(len(runtimes), thread_name_prefix="drill-prober") as pool:
        list(pool.map(lambda n: lookup(runtimes[n - 1], f"probe-{n}"), range(1, 5)))
    probe_until = timezone.now()
    reached = [
        entry
        for entry in sandbox.requests(path_prefix="/orders/", method="GET")
        if probe_from <= _at(entry) <= probe_until
    ]
    probe_keys = [run.key(f"lookup-5xx-probe-{n}") for n in range(1, 5)]
    probes = Attempt.objects.filter(call__idempotency_key__in=probe_keys, breaker_probe=True).count()
    run.check(
        "after cooldown exactly one half-open probe reaches the provider",
        expected="4 runtimes at once: 1 admitted as the probe, 1 request reaches the provider",
        observed=f"{probes} admitted as the probe; {len(reached)} request(s) reached the provider",
        passed=probes == 1 and len(reached) == 1,
    )

    # The dependency recovers: the next probe after the cooldown closes the breaker (and clears its counts).
    sandbox.clear_faults()
    recovered = _close_breaker(run, tool, cooldown_s)
    run.log(f"  the service is back, after the cooldown: {recovered}")
    run.check(
        "once the fault is gone, the next probe closes the breaker",
        expected="the probe COMMITTED, the breaker closed",
        observed=recovered,
        passed=recovered.endswith("breaker closed") and "COMMITTED" in recovered,
    )


def _sleep_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - timezone.now()).total_seconds()))


def _close_breaker(run: _Run, tool: Tool, cooldown_s: float) -> str:
    """Bring the tool's breaker back to closed with one successful lookup after its cooldown (a half-open probe
    that succeeds closes it and clears its counts). What happened, for a check."""
    row = Breaker.objects.filter(tool=tool).first()
    if row is None or row.state == "closed":
        return "already closed: breaker closed"
    if row.state == "forced_open":
        raise RuntimeError(f"the breaker of {tool.name} was forced open by an operator; close it in the console")
    _sleep_until((row.opened_at or timezone.now()) + timedelta(seconds=cooldown_s + 0.3))
    agent = run.agent(log=lambda line: None)
    task = agent.start_task(run.key(f"drill-breaker-{next(run.steps)}"), goal="probe the recovered service")
    n = next(run.steps)
    result = agent.run_call(
        task.id, step=1, tool=tool.name, key=run.key(f"lookup-recovered-{n}"),
        arguments={"order_id": run.order_id(n)},
    )  # fmt: skip
    agent.submit(task.id, f"lookup {result.state}")
    state = Breaker.objects.get(tool=tool).state
    return f"probe {result.state}, breaker {state}"


def status_api_down(run: _Run) -> None:
    """The refund commits, its reply is dropped, and the status endpoint answers 503: every check fails and counts,
    and the poll budget sends the call to a person."""
    stage, sandbox = run.stage, run.sandbox
    key, arguments = _refund(run, "status-down", 1)
    sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    sandbox.fault(route="/refunds/by-key", key=key, kind="status_down", status=503)
    agent = run.agent()
    task = agent.start_task(run.key("drill-status-down"), goal="refund an order the provider cannot confirm")
    result = run.call(agent.run_call(task.id, step=1, tool=stage.tool("refund.create"), key=key, arguments=arguments))

    _one_request(run, key)
    call = Call.objects.select_related("tool").get(pk=result.call_id)
    max_checks = (call.tool.reconcile or {}).get("max_checks")
    receipts = list(Receipt.objects.filter(call=call, source="poll").order_by("id").values_list("observed", flat=True))
    queries = sandbox.requests(key=key, path_prefix="/refunds/by-key/")
    run.check(
        "every check failed and counted toward the poll budget",
        expected=f"{max_checks} checks (the poll budget), none answered; outcome poll_budget_exhausted",
        observed=f"{call.checks_made} checks: receipts {receipts}; {len(queries)} status queries answered"
        f" {sorted({entry['status'] for entry in queries})}; outcome {call.outcome or '-'}",
        passed=call.checks_made == max_checks == len(receipts)
        and all(observed in ("failed", "unreachable") for observed in receipts)
        and all(entry["status"] == 503 for entry in queries)
        and call.outcome == "poll_budget_exhausted",
    )


def queue_backlog(run: _Run, *, count: int = BACKLOG_DEFAULT) -> None:
    """`count` refunds, each committed with its reply dropped, made by agents on BACKLOG_THREADS threads while the
    periodic reconciliation drains them; one runtime in IMMEDIATE_EVERY also asks for an immediate check, a job
    that races the periodic one on another worker. All must be COMMITTED by one receipt each, with one status query
    per key: two workers checking one call at once would show as two."""
    stage, sandbox = run.stage, run.sandbox
    tool_name = stage.tool("refund.create")
    tool = Tool.objects.get(name=tool_name)
    deadline_s = (tool.reconcile or {}).get("deadline_s")
    local = threading.local()
    asked, already = Counter(), Counter()
    made: list[tuple[str, CallResult]] = []
    began = time.monotonic()
    lease_samples: list[set[str]] = []
    stop_sampling = threading.Event()

    def sample_leases() -> None:
        reconcilable = sorted(RECONCILABLE)
        try:
            while not stop_sampling.is_set():
                owners = set(
                    Call.objects.filter(tool_id=tool.pk, state__in=reconcilable)
                    .exclude(check_lease_owner="")
                    .values_list("check_lease_owner", flat=True)
                )
                if owners:
                    lease_samples.append(owners)
                stop_sampling.wait(0.02)
        finally:
            connection.close()

    def one(n: int) -> None:
        if not hasattr(local, "agent"):
            local.agent = run.agent(log=lambda line: None, patience_s=0)
        agent = local.agent
        key, arguments = _refund(run, f"backlog-{n:04d}", n)
        sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
        task = agent.start_task(run.key(f"drill-backlog-{n:04d}"), goal=f"refund {arguments['order_id']}")
        result = agent.run_call(task.id, step=1, tool=tool_name, key=key, arguments=arguments)
        if n % IMMEDIATE_EVERY == 0:
            try:
                agent.client.reconcile(result.call_id)  # this runtime asks for an immediate check
                asked["yes"] += 1
            except RecoveryError as exc:
                if exc.code != "not_reconcilable":
                    raise
                already["settled"] += 1  # reconciliation got there first
        with run._lock:
            made.append((key, result))
            done = len(made)
        if done % max(1, count // 10) == 0:
            run.log(f"  {done} of {count} refunds made ({time.monotonic() - began:.1f} s)")

    sampler = threading.Thread(target=sample_leases, name="drill-lease-sampler", daemon=True)
    sampler.start()
    try:
        with ThreadPoolExecutor(BACKLOG_THREADS, thread_name_prefix="drill-backlog") as pool:
            list(pool.map(one, range(1, count + 1)))
        made.sort(key=lambda pair: pair[0])
        for _, result in made:
            run.call(result)
        ids = [result.call_id for _, result in made]
        run.log(
            f"  {count} refunds made in {time.monotonic() - began:.1f} s; immediate checks asked for"
            f" {asked['yes']} (and for {already['settled']} settled already); waiting for reconciliation"
        )

        def unsettled() -> int:
            return sum(Call.objects.filter(pk__in=chunk, state__in=UNSETTLED_STATES).count() for chunk in _chunks(ids))

        _wait(lambda: unsettled() == 0, 120 + count * 0.1, every_s=0.25)
        run.log(f"  reconciliation done after {time.monotonic() - began:.1f} s ({unsettled()} unsettled)")
    finally:
        stop_sampling.set()
        sampler.join()

    # All COMMITTED by receipts.
    applied: dict[int, list[tuple[str, str]]] = {}
    polls: Counter = Counter()
    for chunk in _chunks(ids):
        for call_id, observed, source, was_applied in Receipt.objects.filter(call_id__in=chunk).values_list(
            "call_id", "observed", "source", "applied"
        ):
            if was_applied:
                applied.setdefault(call_id, []).append((source, observed))
            if source == "poll":
                polls[call_id] += 1
    by_receipt = [i for i in ids if applied.get(i) and len(applied[i]) == 1 and applied[i][0][1] == "committed"]
    sources = Counter(applied[i][0][0] for i in by_receipt)
    run.check(
        "all COMMITTED by receipts",
        expected=f"{count} of {count}, one applied receipt each (committed)",
        observed=f"{len(by_receipt)} of {count} (" + ", ".join(f"{s}: {n}" for s, n in sources.items()) + ")",
        passed=len(by_receipt) == count,
    )

    # Before their deadline: from each call's send to its COMMITTED transition.
    sent: dict[int, datetime] = {}
    for chunk in _chunks(ids):
        sent.update(Call.objects.filter(pk__in=chunk).values_list("pk", "sent_at"))
    settled: dict[int, datetime] = {}
    for chunk in _chunks(ids):
        settled.update(
            AuditEvent.objects.filter(call_id__in=chunk, to_state=S.COMMITTED).values_list("call_id", "created_at")
        )
    late = [i for i in ids if i not in settled or not sent.get(i)]
    waits = [(settled[i] - sent[i]).total_seconds() for i in ids if i in settled and sent.get(i)]
    slowest = max(waits, default=0.0)
    median = sorted(waits)[len(waits) // 2] if waits else 0.0
    run.check(
        "before their deadline",
        expected=f"each COMMITTED within {deadline_s} s of its send",
        observed=f"slowest {slowest:.1f} s after its send, median {median:.1f} s"
        + (f"; {len(late)} never committed" if late else ""),
        passed=not late and deadline_s is not None and slowest <= deadline_s,
    )

    # No call checked by two workers at once: one status query and one poll receipt per key.
    queries = Counter(entry["key"] for entry in sandbox.requests(path_prefix="/refunds/by-key/"))
    odd = [
        f"{key}: {queries.get(key, 0)} queries, {polls.get(result.call_id, 0)} receipts"
        for key, result in made
        if queries.get(key, 0) != 1 or polls.get(result.call_id, 0) != 1
    ]
    holders = set().union(*lease_samples) if lease_samples else set()
    at_once = max((len(sample) for sample in lease_samples), default=0)
    run.check(
        "no call checked by two workers at once",
        expected="one status query and one poll receipt per key",
        observed=(f"{len(odd)} keys differ: {'; '.join(odd[:3])}" if odd else f"{count} keys: one of each")
        + f"; up to {at_once} checkers held leases at the same moment ({len(holders)} lease holders seen;"
        f" {stage.jobs})",
        passed=not odd,
    )


# Approved replays ---------------------------------------------------------------------------------------------------


def _request_replay(call_id: int, reviewer, reason: str) -> ActionRequest:
    """The reviewer's dry run of a same-key replay, then the request for it with a reason (bound to the plan's hash)."""
    actor = Actor.for_user(reviewer)
    preview = action_preview(call_id=call_id, action="replay_same_key", user=reviewer, actor=actor)
    return action_request(request_id=preview.pk, user=reviewer, actor=actor, reason=reason, plan_hash=preview.plan_hash)


def _action_events(call_ids: list[int]) -> dict[int, list[str]]:
    """Each call's action events (action.previewed, action.approved, ...), in order, from the audit trail."""
    events: dict[int, list[str]] = {call_id: [] for call_id in call_ids}
    for chunk in _chunks(call_ids):
        rows = AuditEvent.objects.filter(call_id__in=chunk, action__startswith="action.").order_by("seq")
        for call_id, action in rows.values_list("call_id", "action"):
            events[call_id].append(action)
    return events


@dataclass(kw_only=True)
class _Approval:
    """One approver's answer in a round: the status it left the request in, or the refusal's code."""

    username: str
    status: str = ""
    refused: str = ""
    began: float = 0.0
    ended: float = 0.0


def _approve_twice(request_id: int, approvers, *, at_once: bool, reason: str) -> list[_Approval]:
    """Both approvers approve the request: released together by a barrier on threads of their own (each with its
    own database connection) when `at_once`, one after the other otherwise."""
    barrier = threading.Barrier(len(approvers)) if at_once else None

    def approve(user) -> _Approval:
        answer = _Approval(username=user.get_username())
        try:
            if barrier is not None:
                barrier.wait(timeout=30)
            answer.began = time.perf_counter()
            try:
                done = action_approve(request_id=request_id, user=user, actor=Actor.for_user(user), reason=reason)
                answer.status = done.status
            except ActionRefused as refused:
                answer.refused = refused.code
            answer.ended = time.perf_counter()
            return answer
        finally:
            if barrier is not None:
                connection.close()  # this thread's own

    if not at_once:
        return [approve(user) for user in approvers]
    with ThreadPoolExecutor(len(approvers), thread_name_prefix="drill-approver") as pool:
        return list(pool.map(approve, approvers))


def two_approvers(run: _Run, *, rounds: int = ROUNDS_DEFAULT) -> None:
    """`rounds` refunds, each refused 403 `needs_approval` by the provider (nothing executed: HUMAN_REVIEW). In each
    round a reviewer previews and requests a same-key replay, then two approvers approve it at the same moment
    (threads released by a barrier; on SQLite one after the other): exactly one approval and one refusal, one
    execution, one effect per key."""
    stage, sandbox = run.stage, run.sandbox
    people = drill_people()
    at_once = connection.vendor == "postgresql"
    if not at_once:
        run.log(
            "  SQLite: the two approvals of each round run one after the other (SQLite runs one writer at a time);"
            " the concurrency claim is PostgreSQL's"
        )
    tool = stage.tool("refund.create")
    local = threading.local()

    def refund(n: int) -> CallResult:
        if not hasattr(local, "agent"):
            local.agent = run.agent(log=lambda line: None)
        key, arguments = _refund(run, f"approvers-{n:02d}", n)
        sandbox.fault(route="/refunds", key=key, kind="error", status=403, code="needs_approval", times=1)
        task = local.agent.start_task(run.key(f"drill-approvers-{n:02d}"), goal=f"refund {arguments['order_id']}")
        return local.agent.run_call(task.id, step=1, tool=tool, key=key, arguments=arguments)

    began = time.monotonic()
    with ThreadPoolExecutor(SETUP_THREADS, thread_name_prefix="drill-approvers") as pool:
        made = list(pool.map(refund, range(1, rounds + 1)))
    for result in made:
        run.call(result)
    waiting = [result for result in made if result.outcome == HUMAN_REVIEW and result.call_id is not None]
    run.log(
        f"  {rounds} refunds answered 403 needs_approval in {time.monotonic() - began:.1f} s:"
        f" {len(waiting)} in HUMAN_REVIEW"
    )
    if len(waiting) != rounds:
        raise RuntimeError(f"only {len(waiting)} of {rounds} refunds reached HUMAN_REVIEW: nothing to approve")

    answers: dict[int, list[_Approval]] = {}
    requests: dict[int, int] = {}  # call id -> its action request
    approved_at = timezone.now()
    began = time.monotonic()
    for n, result in enumerate(waiting, 1):
        request = _request_replay(result.call_id, people.reviewer, f"drill round {n}: replay with the same key")
        requests[result.call_id] = request.pk
        answers[result.call_id] = _approve_twice(
            request.pk, people.approvers, at_once=at_once, reason=f"drill round {n}: approved"
        )
        if n % 10 == 0 or n == rounds:
            run.log(f"  round {n} of {rounds} approved ({time.monotonic() - began:.1f} s)")

    ids = list(requests)

    def unfinished() -> int:
        pending = (ActionStatus.APPROVED, ActionStatus.EXECUTING)
        return ActionRequest.objects.filter(pk__in=requests.values(), status__in=pending).count()

    _wait(lambda: unfinished() == 0, EXECUTION_WAIT_S, every_s=0.2)
    _wait(lambda: Call.objects.filter(pk__in=ids, state=S.SENT).count() == 0, 30, every_s=0.2)
    run.log(f"  executions done {time.monotonic() - began:.1f} s after the first round ({unfinished()} unfinished)")
    submitter = run.agent(log=lambda line: None)
    for result in waiting:
        submitter.submit(_task_of(result.call_id), "refund replayed by an approved action")

    # Two approvers in every round, at the same moment on PostgreSQL.
    pairs = list(answers.values())
    two_people = sum(1 for pair in pairs if len({a.username for a in pair}) == 2)
    overlapped = sum(1 for pair in pairs if len(pair) == 2 and max(a.began for a in pair) < min(a.ended for a in pair))
    starts = [abs(pair[0].began - pair[1].began) * 1000 for pair in pairs if len(pair) == 2]
    if at_once:
        run.check(
            "two approvers at once in every round",
            expected=f"{rounds} rounds: two different approvers, their approvals in flight at the same time",
            observed=f"{two_people} rounds with two approvers; {overlapped} with both approvals in flight together"
            f" (starts at most {max(starts, default=0):.1f} ms apart)",
            passed=two_people == rounds and overlapped == rounds,
        )
    else:
        run.check(
            "two approvers at once in every round",
            expected=f"{rounds} rounds of two different approvers (at once on PostgreSQL)",
            observed=f"{two_people} rounds with two approvers, one after the other: SQLite runs one writer at a time",
            passed=two_people == rounds,
        )

    # One approval and one refusal per round.
    refusals = Counter(a.refused for pair in pairs for a in pair if a.refused)
    one_each = sum(1 for pair in pairs if sorted(bool(a.status) for a in pair) == [False, True] and _one_refusal(pair))
    run.check(
        "one approval and one refusal per round",
        expected=f"{rounds} rounds: one approver's approval taken, the other's refused",
        observed=f"{one_each} of {rounds} rounds; refusals: "
        + (", ".join(f"{code} x {n}" for code, n in refusals.items()) or "none"),
        passed=one_each == rounds,
    )

    # One execution per round: the request executed once (one claim), the call admitted once more.
    events = _action_events(ids)
    statuses = dict(ActionRequest.objects.filter(pk__in=requests.values()).values_list("pk", "status"))
    replays = Counter(Attempt.objects.filter(call_id__in=ids).values_list("call_id", flat=True))
    once = [
        call_id
        for call_id in ids
        if statuses.get(requests[call_id]) == ActionStatus.EXECUTED
        and events[call_id].count("action.approved") == 1
        and events[call_id].count("action.executing") == 1
        and replays[call_id] == 2
    ]
    odd = [
        f"call {call_id}: {statuses.get(requests[call_id])}, {events[call_id].count('action.executing')} executing,"
        f" {replays[call_id]} attempts"
        for call_id in ids
        if call_id not in once
    ]
    run.check(
        "one execution per round",
        expected=f"{rounds} requests EXECUTED, each approved once, one action.executing, one replay attempt",
        observed=f"{len(once)} of {rounds}" + (f"; {'; '.join(odd[:3])}" if odd else ""),
        passed=len(once) == rounds,
    )

    # The provider's side: one replay request per key after the approvals (the first request was the 403).
    keys = [result.key for result in waiting]
    posts = Counter(entry["key"] for entry in _posts_since(run, "/refunds") if _at(entry) >= approved_at)
    run.check(
        "one replay request per key",
        expected=f"{rounds} keys: one refund request each after its approval",
        observed=f"{sum(1 for key in keys if posts.get(key) == 1)} of {rounds} keys with one;"
        f" {sum(posts.get(key, 0) for key in keys)} requests in all",
        passed=all(posts.get(key) == 1 for key in keys),
    )


def _one_refusal(pair: list[_Approval]) -> bool:
    return sum(bool(a.refused) for a in pair) == 1


def _task_of(call_id: int) -> int:
    return Call.objects.values_list("task_id", flat=True).get(pk=call_id)


def worker_killed_mid_replay(run: _Run) -> None:
    """A refund committed with its reply lost while the status API is down: the poll budget sends it to a person.
    The status API comes back; a reviewer requests a same-key replay, an approver approves it, and an RQ worker
    executes it while the sandbox holds the replay's reply — and is killed with SIGKILL (its session and its work
    horse). The request stays EXECUTING until its lease lapses and actions_sweep_interrupted marks it INTERRUPTED
    (never re-run); the call, left SENT, is swept to UNKNOWN and settled COMMITTED by a receipt."""
    stage, sandbox, workers = run.stage, run.sandbox, run.stage.workers
    if workers is None:
        raise RuntimeError(missing_service(stage, run.drill))
    people = drill_people()
    key, arguments = _refund(run, "killed", 1)
    sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    sandbox.fault(route="/refunds/by-key", key=key, kind="status_down", status=503)
    agent = run.agent()
    task = agent.start_task(run.key("drill-killed"), goal="refund an order nobody can confirm")
    result = run.call(agent.run_call(task.id, step=1, tool=stage.tool("refund.create"), key=key, arguments=arguments))
    if result.outcome != HUMAN_REVIEW:
        raise RuntimeError(f"the refund ended {result.state} ({result.outcome}), not HUMAN_REVIEW: nothing to replay")
    sandbox.clear_faults()
    run.log("  the status API is back; a reviewer requests a same-key replay, an approver approves it")
    request = _request_replay(result.call_id, people.reviewer, "the provider could not confirm it: replay, same key")
    sandbox.fault(route="/refunds", key=key, kind="latency", ms=HOLD_REPLY_MS, times=1)
    approved_at = timezone.now()
    approver = people.approvers[0]
    action_approve(request_id=request.pk, user=approver, actor=Actor.for_user(approver), reason="replay it once")

    def in_flight() -> bool:
        request.refresh_from_db()
        sent = Call.objects.filter(pk=result.call_id, state=S.SENT).exists()
        return request.status == ActionStatus.EXECUTING and sent

    if not _wait(in_flight, 30, every_s=0.02):
        raise RuntimeError(f"the replay was not executing within 30 s: the request is {request.status}")
    time.sleep(KILL_AFTER_S)  # the request leaves right after the admission: let it reach the sandbox
    owner = request.execution_owner
    horse = int(owner.rsplit(":", 2)[1]) if owner.count(":") >= 2 else 0
    worker = workers.holding(horse)
    if worker is None:
        ours = ", ".join(str(child.pid) for child in workers.processes)
        raise RuntimeError(
            f"the execution's owner {owner!r} (parent {parent_pid(horse)}) is not one of this stage's RQ workers"
            f" ({ours})"
        )
    workers.kill(worker, horse)
    killed_at = timezone.now()
    killed = f"kill -9 of RQ worker {worker.pid} and its work horse {horse}"
    run.log(f"  {killed} while the sandbox holds the replay's reply")
    request.refresh_from_db()
    left = request.status
    replacement = workers.replace(worker)
    run.log(f"  a new RQ worker {replacement.pid} takes its place; the request is {left}")

    def settled() -> bool:
        request.refresh_from_db()
        state = Call.objects.values_list("state", flat=True).get(pk=result.call_id)
        return request.status != ActionStatus.EXECUTING and state == S.COMMITTED

    _wait(settled, SETTLE_WAIT_S, every_s=0.25)
    after_kill = AuditEvent.objects.filter(call_id=result.call_id, created_at__gt=killed_at).order_by("seq")
    story = [
        f"{event.action if not event.to_state else f'{event.from_state} → {event.to_state}'}"
        f" +{(event.created_at - killed_at).total_seconds():.1f} s ({event.actor_label})"
        for event in after_kill
    ]
    run.log(f"  after the kill: {'; '.join(story) or 'nothing'}")
    agent.submit(task.id, "refund settled after an interrupted replay")
    # The held reply is written to a dead connection when its latency is over; it is logged then.
    _wait(lambda: len([p for p in sandbox.requests(key=key, method="POST") if _at(p) >= approved_at]) >= 1, 15)

    posts = [post for post in sandbox.requests(key=key, method="POST") if _at(post) >= approved_at]
    received = _at(posts[0]) if posts else None
    held = received is not None and received < killed_at < received + timedelta(milliseconds=HOLD_REPLY_MS)
    run.check(
        "the worker was killed while the sandbox held the replay's reply",
        expected=f"the replay reached the sandbox before the kill, its reply held {HOLD_REPLY_MS} ms past it",
        observed=f"{killed}, exit {worker.returncode};"
        + (
            f" the replay reached the sandbox {(killed_at - received).total_seconds():.2f} s before the kill"
            f" (answered {posts[0]['status']} {posts[0]['outcome']} to a dead connection)"
            if received
            else " the sandbox logged no replay"
        ),
        passed=held and worker.returncode == -9,
    )
    actions = _action_events([result.call_id])[result.call_id]
    after = actions[actions.index("action.approved") :] if "action.approved" in actions else actions
    attempts = Attempt.objects.filter(call_id=result.call_id).count()
    run.check(
        "the request was left EXECUTING, then INTERRUPTED, never re-run",
        expected="EXECUTING after the kill; then INTERRUPTED: approved, executing once, interrupted; 2 attempts",
        observed=f"{left} after the kill, {request.status} now; events {', '.join(after)}; {attempts} attempts",
        passed=left == ActionStatus.EXECUTING
        and request.status == ActionStatus.INTERRUPTED
        and after == ["action.approved", "action.executing", "action.interrupted"]
        and attempts == 2,
    )
    swept = AuditEvent.objects.filter(
        call_id=result.call_id, from_state=S.SENT, to_state=S.UNKNOWN, created_at__gt=killed_at
    ).values_list("actor_label", flat=True)
    run.check(
        "the sweeper moved the call SENT → UNKNOWN",
        expected="SENT → UNKNOWN after the kill, by job:sweeper",
        observed=", ".join(swept) or "not swept",
        passed=list(swept) == ["job:sweeper"],
    )
    applied = list(Receipt.objects.filter(call_id=result.call_id, applied=True, checked_at__gt=killed_at))
    _check_settled_by_one_receipt(run, applied, "one applied receipt after the kill: committed, UNKNOWN → COMMITTED")
    everything = sandbox.requests(key=key, method="POST")
    run.check(
        "one replay request in the sandbox's request log",
        expected="2 refund requests under the key: the first (reply lost), one replay",
        observed=f"{len(everything)}: " + ", ".join(f"{p['status']} {p['outcome']}" for p in everything),
        passed=len(everything) == 2 and len(posts) == 1,
    )


RUNNERS: dict[str, Callable[..., None]] = {
    "refused-before-send": refused_before_send,
    "timeout-after-send": timeout_after_send,
    "lost-before-commit": lost_before_commit,
    "duplicate-callbacks": duplicate_callbacks,
    "rate-limit": rate_limit,
    "dependency-5xx": dependency_5xx,
    "status-api-down": status_api_down,
    "queue-backlog": queue_backlog,
    "worker-killed-mid-replay": worker_killed_mid_replay,
    "two-approvers": two_approvers,
}
assert set(RUNNERS) == set(DRILLS), "every drill of the table has a runner"


# The result table -------------------------------------------------------------------------------------------------


def _verdict(result: dict) -> str:
    if result.get("skipped"):
        return "skipped"
    return "pass" if result["passed"] else "FAIL"


def result_table(results: list[DrillResult] | list[dict]) -> str:
    """drill | expected | observed | result, one line per drill, columns aligned; from results or their stored JSON
    (DrillRun.results)."""
    stored = [r.as_json() if isinstance(r, DrillResult) else r for r in results]
    rows = [("drill", "expected", "observed", "result")]
    rows += [(r["name"], r["expected"], r["observed"], _verdict(r)) for r in stored]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for n, row in enumerate(rows):
        lines.append(" | ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)))
        if n == 0:
            lines.append("-+-".join("-" * width for width in [*widths, len("result")]))
    return "\n".join(lines)


def _check_settled_by_one_receipt(run, applied: list, expected: str) -> None:
    """The call left UNKNOWN on exactly one applied receipt, which observed the refund committed."""
    run.check(
        "settled by a receipt",
        expected=expected,
        observed="; ".join(
            f"{r.source} receipt: {r.observed}, {r.local_state_before} → {r.local_state_after}" for r in applied
        )
        or "no applied receipt",
        passed=len(applied) == 1
        and applied[0].observed == "committed"
        and (applied[0].local_state_before, applied[0].local_state_after) == (S.UNKNOWN, S.COMMITTED),
    )

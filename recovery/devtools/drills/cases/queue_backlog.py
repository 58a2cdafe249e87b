"""Queue backlog: `run.backlog` refunds, each committed with its reply dropped, made by agents on THREADS threads
while the periodic reconciliation drains them; one runtime in IMMEDIATE_EVERY also asks for an immediate check, a
job that races the periodic one on another worker. All must be COMMITTED by one receipt each, with one status query
per key: two workers checking one call at once would show as two."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from django.db import connection
from recovery_client import RecoveryError
from recovery_client.runtime import CallResult

from recovery.devtools.drills.checks import at_most, each
from recovery.devtools.drills.evidence import chunks
from recovery.devtools.drills.framework import Run, wait
from recovery.engine.states import RECONCILABLE
from recovery.engine.states import CallState as S
from recovery.models import AuditEvent, Call, Receipt, Tool

THREADS = 16  # refunds made at once
# One runtime in this many asks for an immediate check of its call (POST .../reconcile): a job of its own, racing
# the periodic reconciliation on another worker for the same calls. (Not every one: on RQ each such job is a forked
# work horse, which would double the drill's cost.)
IMMEDIATE_EVERY = 10
UNSETTLED_STATES = (S.SENT, *sorted(RECONCILABLE), S.NOT_COMMITTED)


def play(run: Run) -> None:
    tool = Tool.objects.get(name=run.stage.tool("refund.create"))
    began = time.monotonic()
    with _Leases(tool) as leases:
        made = _make_refunds(run, tool)
        ids = [result.call_id for _, result in made]

        def unsettled() -> int:
            return sum(Call.objects.filter(pk__in=chunk, state__in=UNSETTLED_STATES).count() for chunk in chunks(ids))

        wait(lambda: unsettled() == 0, 120 + run.backlog * 0.1, every_s=0.25)
        run.log(f"  reconciliation done after {time.monotonic() - began:.1f} s ({unsettled()} unsettled)")

    applied, polls = _receipts(ids)
    sources = Counter(source for receipts in applied.values() for source, _ in receipts)
    run.log("  applied receipts: " + ", ".join(f"{source}: {n}" for source, n in sources.items()))
    run.check(
        "all COMMITTED by receipts",
        expected=each({"applied receipts": ["committed"]}, of=run.backlog, unit="calls"),
        observed={f"call {i}": {"applied receipts": [seen for _, seen in applied.get(i, [])]} for i in ids},
    )
    _check_deadline(run, tool, ids)

    queries = Counter(entry["key"] for entry in run.sandbox.requests(path_prefix="/refunds/by-key/"))
    holders = set().union(*leases.samples)
    run.log(
        f"  up to {max(map(len, leases.samples), default=0)} checkers held leases at the same moment"
        f" ({len(holders)} lease holders seen; {run.stage.jobs})"
    )
    run.check(
        "no call checked by two workers at once",
        expected=each({"status queries": 1, "poll receipts": 1}, of=run.backlog, unit="keys"),
        observed={
            key: {"status queries": queries.get(key, 0), "poll receipts": polls.get(result.call_id, 0)}
            for key, result in made
        },
    )


def _make_refunds(run: Run, tool: Tool) -> list[tuple[str, CallResult]]:
    """The backlog's refunds, each with its reply dropped, made on THREADS threads: (key, call) in key order."""
    local = threading.local()
    asked, already = Counter(), Counter()
    made: list[tuple[str, CallResult]] = []
    began = time.monotonic()

    def one(n: int) -> None:
        agent = getattr(local, "agent", None)  # one agent (one HTTP session) per thread
        if agent is None:
            agent = local.agent = run.agent(log=lambda line: None, patience_s=0)
        key, arguments = run.refund_args(f"backlog-{n:04d}", n)
        run.sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
        task = agent.start_task(run.key(f"drill-backlog-{n:04d}"), goal=f"refund {arguments['order_id']}")
        result = agent.run_call(task.id, step=1, tool=tool.name, key=key, arguments=arguments)
        if n % IMMEDIATE_EVERY == 0:
            try:
                agent.client.reconcile(result.call_id)  # this runtime asks for an immediate check
                asked["yes"] += 1
            except RecoveryError as exc:
                if exc.code != "not_reconcilable":
                    raise
                already["settled"] += 1  # reconciliation got there first
        with run.lock:
            made.append((key, result))
            done = len(made)
        if done % max(1, run.backlog // 10) == 0:
            run.log(f"  {done} of {run.backlog} refunds made ({time.monotonic() - began:.1f} s)")

    with ThreadPoolExecutor(THREADS, thread_name_prefix="drill-backlog") as pool:
        list(pool.map(one, range(1, run.backlog + 1)))
    made.sort(key=lambda pair: pair[0])
    for _, result in made:
        run.call(result)
    run.log(
        f"  {run.backlog} refunds made in {time.monotonic() - began:.1f} s; immediate checks asked for"
        f" {asked['yes']} (and for {already['settled']} settled already); waiting for reconciliation"
    )
    return made


def _receipts(ids: list[int]) -> tuple[dict[int, list[tuple[str, str]]], Counter]:
    """Each call's applied receipts as (source, observed), and how many poll receipts each call has."""
    applied: dict[int, list[tuple[str, str]]] = {}
    polls: Counter = Counter()
    for chunk in chunks(ids):
        for call_id, observed, source, was_applied in Receipt.objects.filter(call_id__in=chunk).values_list(
            "call_id", "observed", "source", "applied"
        ):
            if was_applied:
                applied.setdefault(call_id, []).append((source, observed))
            if source == "poll":
                polls[call_id] += 1
    return applied, polls


def _check_deadline(run: Run, tool: Tool, ids: list[int]) -> None:
    """From each call's send to its COMMITTED transition, within the tool's reconcile deadline."""
    sent: dict[int, datetime] = {}
    settled: dict[int, datetime] = {}
    for chunk in chunks(ids):
        sent.update(Call.objects.filter(pk__in=chunk).values_list("pk", "sent_at"))
        settled.update(
            AuditEvent.objects.filter(call_id__in=chunk, to_state=S.COMMITTED).values_list("call_id", "created_at")
        )
    waits = sorted((settled[i] - sent[i]).total_seconds() for i in ids if i in settled and sent.get(i))
    if waits:
        run.log(f"  committed {waits[len(waits) // 2]:.1f} s after the send at the median")
    run.check(
        "before their deadline",
        expected={
            "slowest, seconds from send to COMMITTED": at_most((tool.reconcile or {}).get("deadline_s")),
            "never committed": 0,
        },
        observed={
            "slowest, seconds from send to COMMITTED": max(waits, default=0.0),
            "never committed": sum(1 for i in ids if i not in settled or not sent.get(i)),
        },
    )


class _Leases:
    """Which checkers hold leases on the tool's reconcilable calls, sampled every 20 ms on a thread of its own while
    the `with` block runs: one set of lease owners per sample that found any."""

    def __init__(self, tool: Tool) -> None:
        self.tool, self.samples = tool, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="drill-lease-sampler", daemon=True)

    def __enter__(self) -> _Leases:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        reconcilable = sorted(RECONCILABLE)
        try:
            while not self._stop.is_set():
                owners = set(
                    Call.objects.filter(tool_id=self.tool.pk, state__in=reconcilable)
                    .exclude(check_lease_owner="")
                    .values_list("check_lease_owner", flat=True)
                )
                if owners:
                    self.samples.append(owners)
                self._stop.wait(0.02)
        finally:
            connection.close()  # this thread's own

"""`make bench`: the benchmarks (transitions, engine, ingest, reconcile, queue, replay, metrics, otlp, protected,
mcp), each a ratio against a baseline measured in the same run, in a throwaway database created like the test database
(test_<NAME> on PostgreSQL), so it never touches the console's data. What each measures and the figures:
docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection, transaction
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.devtools.benchmarks.ingest import bench_ingest
from recovery.devtools.benchmarks.mcp import bench_mcp
from recovery.devtools.benchmarks.metrics import bench_metrics
from recovery.devtools.benchmarks.otlp import bench_otlp
from recovery.devtools.benchmarks.protected import bench_protected
from recovery.devtools.benchmarks.queue import CALLS, bench_queue
from recovery.devtools.benchmarks.reconcile import bench_reconcile
from recovery.devtools.benchmarks.replay import bench_replay
from recovery.engine.canonical import canonical_json
from recovery.models import Call, Provider, Step, Task, Tenant, Tool
from recovery.statemachine.transitions import transition_call


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _calls(count: int, label: str) -> list[Call]:
    tenant, _ = Tenant.objects.get_or_create(name="bench")
    provider, _ = Provider.objects.get_or_create(name="bench", defaults={"base_url": "http://127.0.0.1:9/"})
    tool, _ = Tool.objects.get_or_create(name="bench.write", defaults={"provider": provider, "side_effect": "write"})
    calls = []
    for n in range(count):
        task = Task.objects.create(tenant=tenant, external_id=f"{label}-{n}", agent="bench", goal="bench")
        step = Step.objects.create(task=task, index=1)
        args = {"n": n}
        calls.append(
            Call(
                tenant=tenant,
                task=task,
                step=step,
                tool=tool,
                idempotency_key=f"{label}-{n}",
                arguments=args,
                fingerprint=canonical_json(args),
                side_effect="write",
                risk="low",
            )
        )
    return Call.objects.bulk_create(calls)


PATH = [("READY", "SENT"), ("SENT", "UNKNOWN"), ("UNKNOWN", "COMMITTED")]


def _timed(calls: list[Call], op: Callable[[Call, str, str, int], None]) -> list[float]:
    samples = []
    for version, (src, dst) in enumerate(PATH):
        for call in calls:
            start = time.perf_counter()
            op(call, src, dst, version)
            samples.append(time.perf_counter() - start)
    return samples


def _bare_update(call: Call, src: str, dst: str, version: int) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE recovery_call SET state = %s, version = version + 1 WHERE id = %s AND state = %s AND version = %s",
            [dst, call.pk, src, version],
        )
        assert cursor.rowcount == 1


class _StatementCounter:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def bench_transitions(count: int = 2000) -> dict:
    actor = Actor.system("bench")
    baseline_calls, product_calls = _calls(count, "bare"), _calls(count, "product")

    def product(call: Call, src: str, dst: str, version: int) -> None:
        transition_call(call, dst, actor=actor, reason="bench")

    # Warm both paths (connection, statement caches) before measuring.
    warm_bare, warm_product = _calls(1, "warm-bare")[0], _calls(1, "warm-product")[0]
    for version, (src, dst) in enumerate(PATH):
        _bare_update(warm_bare, src, dst, version)
        product(warm_product, src, dst, version)
    baseline = _timed(baseline_calls, _bare_update)
    measured = _timed(product_calls, product)
    probe, counter = _calls(1, "probe")[0], _StatementCounter()
    with connection.execute_wrapper(counter):
        _timed([probe], product)
    return {
        "benchmark": "transitions",
        "database": connection.vendor,
        "count": count,
        "baseline_median_us": round(statistics.median(baseline) * 1e6, 1),
        "baseline_p99_us": round(_percentile(baseline, 0.99) * 1e6, 1),
        "transition_median_us": round(statistics.median(measured) * 1e6, 1),
        "transition_p99_us": round(_percentile(measured, 0.99) * 1e6, 1),
        "ratio_median": round(statistics.median(measured) / statistics.median(baseline), 2),
        "statements_per_transition": round(counter.count / len(PATH), 2),
    }


def _engine_fixture():
    from recovery.engine.types import BackoffPolicy, Budgets, ErrorFacts, Facts, ToolPolicy

    amount = {"type": "integer", "minimum": 1, "x-unit": "cents"}
    tool = ToolPolicy(
        name="refund.create",
        side_effect="write",
        provider_ref_field="refund_id",
        args_schema={
            "type": "object",
            "properties": {"order_id": {"type": "string", "pattern": "^O-\\d+$"}, "amount_cents": amount},
            "required": ["order_id", "amount_cents"],
            "additionalProperties": False,
        },
        result_schema={"type": "object", "required": ["refund_id", "status"]},
        budgets=Budgets(max_attempts=3),
        backoff=BackoffPolicy(base_ms=500, cap_ms=10_000),
    )
    facts = [
        Facts(connection_opened=True, sent=True, error=ErrorFacts(kind="read_timeout")),
        Facts(connection_opened=False, sent=False, error=ErrorFacts(kind="connection_refused")),
        Facts(connection_opened=True, sent=True, http_status=503, retry_after_ms=2000),
        Facts(connection_opened=True, sent=True, http_status=422),
        Facts(
            connection_opened=True,
            sent=True,
            http_status=200,
            provider_request_id="p-1",
            result={"refund_id": "r-1", "status": "succeeded"},
        ),
    ]
    return tool, facts


def bench_engine(count: int = 2000) -> dict:
    """classify + decide per outcome and admit per candidate, in-process; baseline: canonical JSON of the input."""
    series = {name: _samples(op, count) for name, op in _engine_operations().items()}
    base = statistics.median(series["baseline"])
    result = {"benchmark": "engine", "count": count}
    for name, samples in series.items():
        result[f"{name}_median_us"] = round(statistics.median(samples) * 1e6, 1)
        result[f"{name}_p99_us"] = round(_percentile(samples, 0.99) * 1e6, 1)
        if name != "baseline":
            result[f"{name}_ratio_median"] = round(statistics.median(samples) / base, 2)
    return result


def _samples(op: Callable[[int], None], count: int) -> list[float]:
    """`op`'s time on `count` inputs, after 200 of warm-up."""
    for i in range(200):
        op(i)
    samples = []
    for i in range(count):
        start = time.perf_counter()
        op(i)
        samples.append(time.perf_counter() - start)
    return samples


def _engine_operations() -> dict[str, Callable[[int], None]]:
    """The engine's series, in the order they are timed: the baseline, a decision, an admission."""
    import dataclasses
    import random

    from recovery.engine.classify import classify
    from recovery.engine.decide import decide
    from recovery.engine.gate import admit
    from recovery.engine.types import BreakerView, Candidate, ClassifyContext, TaskView

    tool, facts = _engine_fixture()
    args = {"order_id": "O-1842", "amount_cents": 80000}
    ctx = ClassifyContext(call_id="1", attempt_id="a", idempotency_key="k", arguments=args)
    call, gate_context = _engine_call(tool)
    candidate = Candidate(attempt_id="a2", tool=tool.name, arguments=args, evidence=("time_elapsed",))
    rng, breaker, task = random.Random(1), BreakerView(), TaskView(rounds_used=1)

    def decision(i: int) -> None:
        outcome = classify(facts[i % len(facts)], tool, ctx)
        decide(outcome, call=call, task=task, tool=tool, breaker=breaker, now=gate_context.now, rng=rng)

    def admission(i: int) -> None:
        assert admit(call, candidate, gate_context).allowed

    def baseline(i: int) -> None:
        canonical_json(dataclasses.asdict(facts[i % len(facts)]) | {"args": args})

    return {"baseline": baseline, "decision": decision, "admission": admission}


def _engine_call(tool):
    """A write call retried once after a transient failure 5 s ago, and the gate's context for its next attempt."""
    from recovery.engine.types import CallView, GateContext, PreviousAttempt, TaskView

    call = CallView(
        call_id="1",
        tool=tool.name,
        state="RETRYABLE",
        idempotency_key="k",
        fingerprint="f",
        attempts_made=1,
        max_attempts=3,
    )
    now = timezone.now()
    previous = PreviousAttempt(
        number=1,
        tool=tool.name,
        fingerprint="f",
        credential_version=1,
        failure_class="transient",
        phase="dispatch",
        side_effect="not_sent",
        finished_at=now - timedelta(seconds=5),
        wait_ms=1000,
    )
    return call, GateContext(now=now, tool=tool, previous=previous, task=TaskView(rounds_used=1))


PLAIN_STATIC = "django.contrib.staticfiles.storage.StaticFilesStorage"

BENCHMARKS = {
    "transitions": bench_transitions,
    "engine": bench_engine,
    "ingest": bench_ingest,
    "reconcile": bench_reconcile,
    "queue": bench_queue,
    "replay": bench_replay,
    "metrics": bench_metrics,
    "otlp": bench_otlp,
    "protected": bench_protected,
    "mcp": bench_mcp,
}
SIZED = ("queue", "metrics")  # the benchmarks that `--calls` sizes


class Command(BaseCommand):
    help = "Run the benchmarks in a throwaway database and print ratios against same-run baselines."

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", choices=[*BENCHMARKS, []], help="benchmarks to run (default: all)")
        parser.add_argument(
            "--count",
            type=int,
            help="operations per measured series (default: each benchmark's own: 2000; ingest 1000; reconcile 800; "
            "queue 30 requests per page; replay 50 intents per case; metrics 30 requests per read; otlp 1000 spans; "
            "protected 60 sequential calls per console and latency; mcp 40 sequential calls per case, 16 sessions of a "
            "quarter as many)",
        )
        parser.add_argument(
            "--calls",
            type=int,
            default=CALLS,
            help=f"queue, metrics: calls to load (default {CALLS:,}; 3 attempts each)",
        )
        parser.add_argument("--json", dest="json_path", help="also write the results to this file")

    def handle(self, *args, names, count, calls, json_path, **options):
        settings.DEBUG = False  # measure what production runs: no query logging
        # Pages rendered in this process name their static files without the collectstatic manifest (a lookup in
        # a dict in production): the benchmark does not need `collectstatic` first.
        settings.STORAGES = {**settings.STORAGES, "staticfiles": {"BACKEND": PLAIN_STATIC}}
        if connection.vendor != "postgresql":
            self.stderr.write(
                "note: docs/design/quality-targets.md figures are defined on PostgreSQL; set DATABASE_URL=postgres://..."
            )
        if connection.vendor == "sqlite" and not connection.settings_dict["TEST"].get("NAME"):
            # A file (WAL, busy timeout), as the test suite's, not Django's shared-cache in-memory database: its table
            # locks fail concurrent writers at once ("database table is locked") instead of waiting, and no other
            # process can open it (the replay benchmark's API server, the reconcile benchmark's workers).
            connection.settings_dict["TEST"]["NAME"] = str(settings.VAR_DIR / f"bench-{os.getpid()}.sqlite3")
        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            results = []
            for name in names or BENCHMARKS:
                results.append(
                    BENCHMARKS[name](*([count] if count else []), **({"calls": calls} if name in SIZED else {}))
                )
                self.stdout.write(json.dumps(results[-1]))  # each as it ends: a later failure loses none of them
                if json_path:
                    with open(json_path, "w") as fh:
                        json.dump(results, fh, indent=2)
        finally:
            _end_other_sessions()
            connection.creation.destroy_test_db(old_name, verbosity=0)


def _end_other_sessions() -> None:
    """The throwaway database dropped even where a server the benchmark started left a connection open behind it (a
    worker thread's, closed with its process a moment later): PostgreSQL ends every other session on it first."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        # raw SQL: PostgreSQL's sessions view, which the ORM does not model (the benchmarks' throwaway database only)
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )

"""The `metrics` benchmark: the metrics' reads at 1,000,000 calls against the same reads at 10,000 (loaded with their
audit history, folded by the product's fold and checked against the rows), and ingest with and without the periodic
fold running. The steps, checks and figures: docs/benchmarks.md ("The metrics benchmark"); the targets:
docs/design/quality-targets.md.
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, Exists, F, OuterRef, Q, Sum
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import Resolver404, resolve, reverse

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor
from recovery.devtools.benchmarks.audit_load import AUDIT_HISTORY
from recovery.devtools.benchmarks.ingest import (
    CLIENTS,
    PRODUCT_APP,
    ROUNDS,
    WARM_UP,
    Fixture,
    check_committed,
    connection_url,
    interleaved_rounds,
    rates,
    serve,
    server_env,
    wait_disconnected,
)
from recovery.devtools.benchmarks.queue_load import CALLS, PREFIX, UNKNOWN_PER_CALLS, VIEWER, load
from recovery.engine import metrics as m
from recovery.engine.states import CallState
from recovery.jobs import tasks as jobs
from recovery.models import Attempt, AuditEvent, Call, MetricRollup, MetricTotal, Tenant, TokenScope
from recovery.services.metrics import metrics_fold
from recovery.services.tokens import token_create

SMALL = 10_000
WARM_UP_REQUESTS = 5
# The reads the ratio target is set for (/metrics, the metrics page, the overview); the JSON API's read is timed and
# reported beside them, its statements held constant, its ratio not a target.
TARGETED = ("prometheus_viewer", "prometheus_token", "metrics_page_24h", "metrics_page_30d", "overview")
TARGET_RATIO = 1.5  # docs/design/quality-targets.md: each read at `calls` within this many times the same read at SMALL
TARGET_INGEST = 0.9  # docs/design/quality-targets.md: rollup upkeep costs at most 10 % of ingest throughput
INGEST_ATTEMPTS = 20_000  # single shots per ingest series (with and without the fold), over ROUNDS rounds
DISK_MARGIN = 1.25
CHECKED = (m.CALLS, m.WRITE_CALLS, m.ATTEMPTS, m.UNKNOWN_CALLS, m.COMMITTED_CALLS)
METRICS_TOKEN = f"{PREFIX}-scraper"

Progress = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} bench metrics: {message}", file=sys.stderr, flush=True)


# --- the rollups, checked --------------------------------------------------------------------------------------------


def expected_counts() -> dict[str, int]:
    """CHECKED's series, counted from the loaded rows without the fold: its calls, its attempts, its audit events."""
    started = Call.objects.filter(attempts_count__gt=0)
    unknown = AuditEvent.objects.filter(
        call=OuterRef("pk"), action=AuditAction.CALL_TRANSITION, to_state__in=m.QUEUES["unknown"]
    )
    committed = AuditEvent.objects.filter(
        call=OuterRef("pk"), action=AuditAction.CALL_TRANSITION, to_state=CallState.COMMITTED
    )
    return {
        m.CALLS: started.count(),
        m.WRITE_CALLS: started.filter(side_effect="write").count(),
        m.ATTEMPTS: Attempt.objects.filter(finished_at__isnull=False).count(),
        m.UNKNOWN_CALLS: started.filter(Exists(unknown), side_effect="write").count(),
        m.COMMITTED_CALLS: started.filter(Exists(committed)).count(),
    }


def check_rollups() -> dict:
    """The fold's totals and rollups against expected_counts(), and the loaded history against the calls' rows;
    raises AssertionError on any difference."""
    started = time.perf_counter()
    expected = expected_counts()
    totals = dict(
        MetricTotal.objects.filter(tenant_id=0, series__in=CHECKED).values_list("series").annotate(n=Sum("value"))
    )
    tenants = dict(
        MetricTotal.objects.filter(series__in=CHECKED)
        .exclude(tenant_id=0)
        .values_list("series")
        .annotate(n=Sum("value"))
    )
    hours = dict(
        MetricRollup.objects.filter(period=m.HOUR, tenant_id=0, tool_id=m.ALL_TOOLS, series__in=CHECKED)
        .values_list("series")
        .annotate(n=Sum("value"))
    )
    # Each call moved as often as its version says (the loader's history is the one its rows imply).
    transitions = Count("audit_events", filter=Q(audit_events__action=AuditAction.CALL_TRANSITION))
    off_version = Call.objects.annotate(moves=transitions).exclude(moves=F("version")).count()
    problems = [
        f"{series}: the fold counted {totals.get(series, 0)}, the rows say {n} (hourly rollups "
        f"{hours.get(series, 0)}, per-tenant totals {tenants.get(series, 0)})"
        for series, n in expected.items()
        if not totals.get(series, 0) == hours.get(series, 0) == tenants.get(series, 0) == n
    ]
    if off_version:
        problems.append(f"{off_version} calls have a version that is not their number of transitions")
    if problems:
        raise AssertionError("the rollups do not match the loaded rows: " + "; ".join(problems))
    return {"checked": {series: int(n) for series, n in expected.items()}, "check_s": _since(started)}


def fold() -> dict:
    """metrics_fold() until the watermark reaches the last event: how many, and how fast."""
    started = time.perf_counter()
    events = metrics_fold()
    seconds = time.perf_counter() - started
    return {"events": events, "fold_s": round(seconds, 1), "events_per_s": round(events / seconds, 1)}


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 1)


# --- the reads, timed ------------------------------------------------------------------------------------------------


def _token() -> str:
    """A metrics token of every tenant the loader made (a scraper of everything), created once."""
    tenants = list(Tenant.objects.filter(name__startswith=f"{PREFIX}-").values_list("name", flat=True))
    return token_create(name=METRICS_TOKEN, tenants=tenants, actor=Actor.system("bench"), scope=TokenScope.METRICS)[1]


def reads(token: str) -> dict[str, tuple[Client, str]]:
    viewer, scraper = Client(), Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    viewer.force_login(get_user_model().objects.get(username=VIEWER))
    page, scrape = reverse("console:metrics"), reverse("prometheus-metrics")
    found = {
        "prometheus_viewer": (viewer, scrape),
        "prometheus_token": (scraper, scrape),
        "metrics_page_24h": (viewer, f"{page}?window=24h"),
        "metrics_page_30d": (viewer, f"{page}?window=30d"),
        "overview": (viewer, reverse("console:overview")),
    }
    try:
        resolve("/api/v1/metrics")
    except Resolver404:
        return found
    return {**found, "api_24h": (scraper, "/api/v1/metrics?window=24h")}


def _get(client: Client, url: str) -> None:
    response = client.get(url, secure=True)
    if response.status_code != 200:
        raise AssertionError(f"GET {url}: {response.status_code} {response.content[:300]!r}")


def measure(pages: dict[str, tuple[Client, str]], count: int) -> dict[str, dict]:
    """Each read's median and p95 over `count` requests and its SQL statements (the fewest of three requests: a read
    may write now and then, as a token's last use once a minute)."""
    statements = {}
    for name, (client, url) in pages.items():
        seen = []
        for _ in range(3):
            with CaptureQueriesContext(connection) as queries:
                _get(client, url)
            seen.append(len(queries.captured_queries))
        statements[name] = min(seen)
        for _ in range(WARM_UP_REQUESTS):
            _get(client, url)
    samples: dict[str, list[float]] = {name: [] for name in pages}
    order = list(pages)
    for n in range(count):
        for name in order if n % 2 == 0 else reversed(order):
            client, url = pages[name]
            started = time.perf_counter()
            _get(client, url)
            samples[name].append(time.perf_counter() - started)
    return {
        name: {
            "median_ms": round(statistics.median(series) * 1000, 2),
            "p95_ms": round(statistics.quantiles(series, n=20, method="inclusive")[-1] * 1000, 2),
            "statements": statements[name],
        }
        for name, series in samples.items()
    }


def _data_shape() -> dict[str, int]:
    """What the reads read besides fixed rows (the data behind the ratios): the all-tenant, all-tool rollup rows of
    the 24-hour and 30-day windows, and the open items of the queues (the backlog the overview and the queue sizes
    count)."""
    now = int(time.time())
    tenant0 = MetricRollup.objects.filter(tenant_id=0, tool_id=m.ALL_TOOLS)
    queued = [state for states in m.QUEUES.values() for state in states]
    return {
        "rollup_rows": MetricRollup.objects.count(),
        "rollup_rows_24h": tenant0.filter(period=m.HOUR, start__gte=now - m.DAY).count(),
        "rollup_rows_30d": tenant0.filter(period=m.DAY, start__gte=now - 30 * m.DAY).count(),
        "open_items": Call.objects.filter(state__in=queued).count(),
    }


# --- disk ------------------------------------------------------------------------------------------------------------


def _database_bytes() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        return cursor.fetchone()[0]


def disk_check(used: int, small: int, calls: int) -> dict:
    """The disk the growth to `calls` needs, estimated from what `small` calls took (`used` bytes: rows, indexes,
    rollups; rollups grow slower than calls, so it errs on the safe side) plus max_wal_size for the write-ahead log;
    refuses with a clear error when the database's disk (if on this machine) has less free."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_bytes(current_setting('max_wal_size'))")
        (wal,) = cursor.fetchone()
        try:
            cursor.execute("SELECT current_setting('data_directory')")
            data = Path(cursor.fetchone()[0])
        except Exception:  # no right to read it: the check is skipped, and says so
            data = None
    needed = int(used / small * (calls - small) * DISK_MARGIN + wal)
    free = shutil.disk_usage(data).free if data is not None and data.exists() else None
    found = {"disk_needed_gb": round(needed / 1e9, 1), "disk_free_gb": round(free / 1e9, 1) if free else None}
    if free is not None and free < needed:
        raise RuntimeError(
            f"growing to {calls:,} calls needs about {needed / 1e9:.1f} GB on {data}, which has {free / 1e9:.1f} GB "
            f"free: free some space or run with fewer --calls"
        )
    return found


# --- ingest with the fold running ------------------------------------------------------------------------------------

# The fold process: the product's periodic job, every `every` seconds from the start of each run (as the scheduler
# runs it), until SIGTERM; then one line of JSON: runs, events folded, seconds spent folding, CPU seconds.
FOLD_LOOP = (
    "import django; django.setup(); from recovery.devtools.benchmarks.metrics import fold_loop; fold_loop({every})"
)


def fold_loop(every: float) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    connection.ensure_connection()
    print("ready", flush=True)
    runs = events = 0
    busy, cpu = 0.0, time.process_time()  # the CPU of starting up is not the fold's
    while not stop.is_set():
        started = time.monotonic()
        events += jobs.metrics_fold()
        runs += 1
        busy += time.monotonic() - started
        stop.wait(max(every - (time.monotonic() - started), 0))
    print(json.dumps({"runs": runs, "events": events, "busy_s": busy, "cpu_s": time.process_time() - cpu}), flush=True)


@contextmanager
def folding(dsn: str, every: float, stats: list[dict]) -> Iterator[None]:
    """The fold caught up (untimed), then a fold process running while the block runs; its report added to
    `stats`."""
    metrics_fold()
    command = [sys.executable, "-c", FOLD_LOOP.format(every=every)]
    process = subprocess.Popen(command, cwd=settings.BASE_DIR, env=server_env(dsn), stdout=subprocess.PIPE, text=True)
    try:
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the fold process did not start")
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=600)
    stats.append(json.loads(out.strip().splitlines()[-1]))


def ingest_with_fold(attempts: int, *, rounds: int = ROUNDS, every: float | None = None) -> dict:
    """bench ingest's single shots, `attempts` per series over `rounds` rounds, without and with the fold."""
    every = every or settings.RECOVERY_METRICS_FOLD_EVERY_S
    fixture, dsn, stats = Fixture.create(), connection_url(), []
    per_round = max(attempts // rounds, 10)
    with serve(PRODUCT_APP, dsn) as server:
        runs, all_calls = interleaved_rounds(
            fixture,
            {"plain": server, "fold": server},
            per_round,
            rounds=rounds,
            around={"fold": lambda: folding(dsn, every, stats)},
        )
    check_committed(all_calls)
    wait_disconnected(connection.settings_dict["NAME"])
    rate = rates(runs)
    measured = per_round * rounds
    # Two events per single shot (SENT, then COMMITTED), the warm-up's too: what the fold had to keep up with.
    produced = 2 * (per_round + CLIENTS * WARM_UP) * rounds
    folded = sum(s["events"] for s in stats)
    return {
        "ingest_fold_every_s": every,
        "ingest_rounds": rounds,
        "ingest_attempts_per_round": per_round,
        "ingest_attempts_per_s": round(rate["plain"], 1),
        "ingest_with_fold_attempts_per_s": round(rate["fold"], 1),
        "ingest_with_fold_ratio": round(rate["fold"] / rate["plain"], 3),
        "ingest_rounds_attempts_per_s": {label: [r["attempts_per_s"] for r in rs] for label, rs in runs.items()},
        "ingest_fold_runs": sum(s["runs"] for s in stats),
        "ingest_events_folded_in_rounds": folded,
        "ingest_events_produced_in_rounds": produced,
        "ingest_fold_busy_s": round(sum(s["busy_s"] for s in stats), 2),
        "ingest_fold_cpu_ms_per_attempt": round(sum(s["cpu_s"] for s in stats) * 1000 / measured, 3),
        "ingest_database_cpu_ms_per_attempt": {
            label: round(statistics.median(r["database_cpu_ms"] for r in rs), 2) for label, rs in runs.items()
        },
    }


# --- the benchmark ---------------------------------------------------------------------------------------------------


def _stage(calls: int, *, seed: int, progress: Progress, queued: bool = True) -> dict:
    """Load `calls` more calls with their history, fold them (timed) and check the rollups; `queued` False: history
    only, none of them left in a reviewer's queue (queue_load.load)."""
    unknown = calls // UNKNOWN_PER_CALLS if queued else 0
    progress(f"loading {calls:,} calls with their audit history" + ("" if queued else ", none left in a queue"))
    loaded = load(calls, unknown=unknown, seed=seed, extra=AUDIT_HISTORY, queued=queued)
    progress(f"loaded in {loaded['load_s']} s: {json.dumps(loaded)}; folding {loaded['audit_events']:,} events")
    folded = fold()
    progress(f"folded {folded['events']:,} events in {folded['fold_s']} s; checking the rollups")
    return {"load": loaded, "fold": folded, **check_rollups()}


def bench_metrics(
    count: int = 30,
    *,
    calls: int = CALLS,
    small: int = SMALL,
    ingest_attempts: int = INGEST_ATTEMPTS,
    ingest_rounds: int = ROUNDS,
    fold_every: float | None = None,
    progress: Progress = _stderr,
) -> dict:
    """docs/benchmarks.md ("The metrics benchmark"): `count` requests per read, at `small` and at `calls` calls."""
    if connection.vendor != "postgresql":
        return {
            "benchmark": "metrics",
            "skipped": "needs PostgreSQL (the metrics targets of docs/design/quality-targets.md are defined there, "
            "and the loader uses COPY), "
            f"this is {connection.vendor}: run with DATABASE_URL=postgres://user@host:5432/dbname",
        }
    if not 0 < small < calls:
        raise ValueError(f"calls ({calls:,}) must be more than the small size ({small:,})")
    before = _database_bytes()
    stages = {"small": _stage(small, seed=19, progress=progress)}
    hosts = [*settings.ALLOWED_HOSTS, "testserver"]
    with override_settings(ALLOWED_HOSTS=hosts):
        token = _token()
        pages = reads(token)
        progress(f"timing {', '.join(pages)} at {small:,} calls")
        timed = {"small": measure(pages, count)}
        progress(f"at {small:,} calls: {json.dumps(timed['small'])}")
        rows = {"small": _data_shape()}
        disk = disk_check(_database_bytes() - before, small, calls)
        progress(f"growing to {calls:,} calls needs about {disk['disk_needed_gb']} GB ({disk['disk_free_gb']} free)")
        stages["big"] = _stage(calls - small, seed=20, progress=progress, queued=False)
        progress(f"timing at {calls:,} calls")
        timed["big"] = measure(reads(token), count)  # signed in again: the loader reset the users' passwords
        progress(f"at {calls:,} calls: {json.dumps(timed['big'])}")
        rows["big"] = _data_shape()
    progress("ingest without and with the fold")
    ingest = ingest_with_fold(ingest_attempts, rounds=ingest_rounds, every=fold_every)
    return _report(count, small, calls, stages, timed, rows, disk, ingest)


def _report(count, small, calls, stages, timed, rows, disk, ingest) -> dict:
    result = {"benchmark": "metrics", "database": connection.vendor, "small_calls": small, "calls": calls}
    for size, stage in stages.items():
        load_ = stage["load"]
        result[f"{size}_load"] = {
            k: load_[k] for k in ("calls", "unknown", "queued", "attempts", "audit_events", "load_s", "copy_s")
        }
        result[f"{size}_fold_events"] = stage["fold"]["events"]
        result[f"{size}_fold_s"] = stage["fold"]["fold_s"]
        result[f"{size}_fold_events_per_s"] = stage["fold"]["events_per_s"]
        result[f"{size}_checked"] = stage["checked"]
        result[f"{size}_check_s"] = stage["check_s"]
        result.update({f"{size}_{key}": n for key, n in rows[size].items()})
    result["rollups_checked"] = True  # check_rollups() raised otherwise
    result["requests_per_read"] = count
    for name, small_read in timed["small"].items():
        big_read = timed["big"][name]
        for stat in ("median_ms", "p95_ms", "statements"):
            result[f"{name}_small_{stat}"] = small_read[stat]
            result[f"{name}_big_{stat}"] = big_read[stat]
        result[f"{name}_ratio_1m_over_10k"] = round(big_read["median_ms"] / small_read["median_ms"], 2)
        result[f"{name}_statements_equal"] = small_read["statements"] == big_read["statements"]
    result.update(disk)
    result.update(ingest)
    result["target_ratio_max"], result["target_ingest_ratio_min"] = TARGET_RATIO, TARGET_INGEST
    names = list(timed["small"])
    result["statements_constant"] = all(result[f"{name}_statements_equal"] for name in names)
    targeted = [name for name in names if name in TARGETED]
    result["reads_meet_target"] = all(result[f"{name}_ratio_1m_over_10k"] <= TARGET_RATIO for name in targeted)
    result["meets_targets"] = (
        result["statements_constant"]
        and result["reads_meet_target"]
        and result["ingest_with_fold_ratio"] >= TARGET_INGEST
    )
    return result

"""The `reconcile` benchmark (docs/benchmarks.md): settled calls per second with the sandbox's status API answering in
50 ms and 8 checks in flight (one worker with 8, two with 4), against 8 / 0.05 and a bare `requests` baseline.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import requests
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from recovery.audit.chain import Actor, chain_key
from recovery.models import AuditChainHead, Call, Receipt, Step, Task, Tenant, Tool
from recovery.registry import load_registry
from recovery.services.reconcile import reconcile_due

IN_FLIGHT = 8  # in all: one worker with 8, or two with 4 each
LATENCY_S = 0.05
TARGET = 0.9
API_KEY = "bench-sandbox-key"
REGISTRY = {
    "tenants": [{"name": f"bench-r{n}", "tools": "*"} for n in range(4)],
    "providers": [
        {
            "name": "bench-sandbox",
            "base_url": "http://127.0.0.1:9",  # replaced by the sandbox's URL
            "connect_timeout_s": 2,
            "read_timeout_s": 5,
            "auth": {"kind": "bearer", "secret_env": "BENCH_SANDBOX_API_KEY"},
            # The benchmark measures checks, not the breaker: a threshold it never reaches.
            "status_breaker": {"window_s": 60, "min_calls": 100000, "failure_rate": 1, "cooldown_s": 30},
        }
    ],
    "tools": [
        {
            "name": "bench.refund",
            "provider": "bench-sandbox",
            "side_effect": "write",
            "request": {"method": "POST", "path": "/refunds"},
            "args_schema": {"type": "object"},
            "provider_ref_field": "refund_id",
            "status_query": {
                "method": "GET",
                "path": "/refunds/by-key/{idempotency_key}",
                "status_map": {"succeeded": "committed", "not_found": "not_committed", "pending": "pending"},
                "effects_field": "effects",
            },
            "reconcile": {"first_check_s": 5, "backoff": 2, "max_checks": 6, "deadline_s": 3600},
            "budgets": {"max_attempts": 3, "max_business_effects": 1},
        }
    ],
}


def start_sandbox(db_path: str) -> tuple[subprocess.Popen, str]:
    command = [
        sys.executable,
        str(settings.BASE_DIR / "manage.py"),
        "runsandbox",
        "--port",
        "0",
        "--db",
        db_path,
        "--api-key",
        API_KEY,
        "--status-latency-ms",
        str(int(LATENCY_S * 1000)),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if match := re.search(r"sandbox: (http://\S+)", line or ""):
            return process, match.group(1)
        if process.poll() is not None:
            break
    process.kill()
    raise RuntimeError("the sandbox did not start")


def _commit_at_sandbox(url: str, keys: list[str]) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with requests.Session() as session:
        for key in keys:
            reply = session.post(
                f"{url}/refunds",
                json={"order_id": "O-1", "amount_cents": 100},
                headers=headers | {"Idempotency-Key": key},
                timeout=10,
            )
            reply.raise_for_status()


def _unknown_calls(keys: list[str]) -> list[int]:
    """One UNKNOWN call per key, due now, as a runtime's lost reply leaves it (inserted in bulk, not measured)."""
    tenants = list(Tenant.objects.filter(name__startswith="bench-r").order_by("name"))
    tool = Tool.objects.get(name="bench.refund")
    now = timezone.now()
    tasks = Task.objects.bulk_create(
        Task(tenant=tenants[n % len(tenants)], external_id=f"rec-{key}", agent="bench", goal="bench")
        for n, key in enumerate(keys)
    )
    steps = Step.objects.bulk_create(Step(task=task, index=1) for task in tasks)
    AuditChainHead.objects.bulk_create(AuditChainHead(key=chain_key(task.pk)) for task in tasks)
    calls = Call.objects.bulk_create(
        Call(
            tenant=task.tenant,
            task=task,
            step=step,
            tool=tool,
            idempotency_key=key,
            arguments={"order_id": "O-1", "amount_cents": 100},
            fingerprint=key[:64],
            side_effect="write",
            risk="low",
            state="UNKNOWN",
            version=2,
            attempts_count=1,
            sent_at=now - timedelta(seconds=1),
            next_check_at=now,
        )
        for task, step, key in zip(tasks, steps, keys, strict=True)
    )
    return [call.pk for call in calls]


def _bare(url: str, keys: list[str]) -> float:
    """IN_FLIGHT threads sending the same status queries and ignoring the answers: queries per second."""
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def ask(chunk: list[str]) -> None:
        with requests.Session() as session:
            for key in chunk:
                session.get(f"{url}/refunds/by-key/{key}", headers=headers, timeout=10).raise_for_status()

    chunks = [keys[n::IN_FLIGHT] for n in range(IN_FLIGHT)]
    start = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        list(pool.map(ask, chunks))
    return len(keys) / (time.perf_counter() - start)


def _worker(in_flight: int, barrier, results) -> None:
    """One reconciliation worker process (forked): checks due calls until none is left, then reports."""
    barrier.wait()
    checked = 0
    while batch := reconcile_due(worker=f"bench-{os.getpid()}", in_flight=in_flight):
        checked += batch
    results.put((checked, time.monotonic()))
    connections.close_all()


def _run_workers(processes: int, in_flight: int) -> tuple[int, float]:
    """`processes` worker processes with `in_flight` checks each, started together: (calls checked, seconds)."""
    connections.close_all()  # forked children open their own connections
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    workers = [context.Process(target=_worker, args=(in_flight, barrier, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    barrier.wait()
    start = time.monotonic()
    reports = [results.get(timeout=900) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    return sum(n for n, _ in reports), max(end for _, end in reports) - start


def bench_reconcile(count: int = 800) -> dict:
    """Two series on fresh calls each: one worker with IN_FLIGHT checks in flight, and two worker processes with
    half as many each (the same 8 in flight, as two RQ workers would run them)."""
    series = {"1x8": (1, IN_FLIGHT), "2x4": (2, IN_FLIGHT // 2)}
    results, all_ids = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        process, url = start_sandbox(os.path.join(tmp, "sandbox.sqlite3"))
        try:
            registry = {**REGISTRY, "providers": [{**REGISTRY["providers"][0], "base_url": url}]}
            os.environ["BENCH_SANDBOX_API_KEY"] = API_KEY
            load_registry(registry, actor=Actor.system("bench"))
            keys = {label: [f"bench-rec-{label}-{n}" for n in range(count)] for label in series}
            _commit_at_sandbox(url, [key for chunk in keys.values() for key in chunk])
            bare_rate = _bare(url, keys["1x8"][: min(count, 400)])
            for label, (processes, in_flight) in series.items():
                ids = _unknown_calls(keys[label])
                all_ids += ids
                checked, seconds = _run_workers(processes, in_flight)
                settled = Call.objects.filter(pk__in=ids, state="COMMITTED").count()
                if settled != count or checked != count:
                    raise AssertionError(f"{label}: {settled} of {count} calls settled COMMITTED, {checked} checks")
                results[label] = settled / seconds
        finally:
            process.terminate()
            process.wait(timeout=10)
    receipts = Receipt.objects.filter(call_id__in=all_ids).count()
    ideal = IN_FLIGHT / LATENCY_S
    best = max(results, key=results.get)
    return {
        "benchmark": "reconcile",
        "database": connection.vendor,
        "calls_per_series": count,
        "checks_in_flight": IN_FLIGHT,
        "status_latency_ms": int(LATENCY_S * 1000),
        "settled_per_s": {label: round(rate, 1) for label, rate in results.items()},
        "ideal_per_s": ideal,
        "ratio": {label: round(rate / ideal, 2) for label, rate in results.items()},
        "best": best,
        "target_ratio": TARGET,
        "bare_queries_per_s": round(bare_rate, 1),
        "bare_ratio": round(bare_rate / ideal, 2),
        "receipts_per_call": round(receipts / len(all_ids), 2),
    }

"""The `protected` benchmark: what protection costs. Refunds through `@recovered.tool` against the sandbox, alternating
with bare `requests.post` calls carrying an Idempotency-Key, the sandbox answering at once and holding each write
50 ms (its `latency` fault); sequential, then 16 agents at once (calls per second, server CPU per protected call).
Each console is gunicorn with deploy/gunicorn.conf.py on this run's database, with an RQ worker. With
BENCH_BASELINE_DIR (a checkout of an earlier commit, its .venv linked), that commit's console runs beside this one
and its calls alternate with the others: the figures of "today" in the same run. docs/benchmarks.md.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import requests
from django.db import connection
from recovery_client import RecoveryClient, recovered

from recovery.audit.chain import Actor
from recovery.devtools.benchmarks.protected_stage import Console, statements_per_call
from recovery.devtools.drills.stage import background_jobs, sandbox_env_defaults, shipped_registry
from recovery.devtools.sandbox.process import SandboxProcess
from recovery.registry import load_registry
from recovery.services.tokens import token_create

CALLS = 60  # sequential protected calls per console and latency (as many bare ones)
AGENTS, CALLS_PER_AGENT = 16, 8
LATENCIES_MS = (0, 50)
TENANT, CENTS = "demo", 1250
ACTOR = Actor.system("bench")
TARGETS = {"ratio_median_50ms": 1.2, "ratio_p95_50ms": 1.3, "added_median_ms": 10.0, "cpu_vs_baseline": 0.5}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


class _CountingClient(RecoveryClient):
    """The runtime's console client, counting its round trips (a deferred report's too, from its thread)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_trips = 0
        self.waited: list[
            float
        ] = []  # the caller's own thread's time in round trips, per call (a deferred report's not)
        self._lock = threading.Lock()
        self._caller = threading.get_ident()

    def _exchange(self, method: str, path: str, **kwargs: Any):
        with self._lock:
            self.round_trips += 1
        start = time.perf_counter()
        try:
            return super()._exchange(method, path, **kwargs)
        finally:
            if threading.get_ident() == self._caller and self.waited:
                self.waited[-1] += time.perf_counter() - start


class _Agent:
    """One agent: its console client, its open task, its protected refund tool and a bare one."""

    def __init__(self, console: Console, token: str, sandbox_url: str, api_key: str, name: str) -> None:
        self.client = _CountingClient(console.url, token)
        self.sandbox_url, self.api_key, self.name = sandbox_url, api_key, name
        self.stack = ExitStack()
        self.task = self.stack.enter_context(
            recovered.task(
                self.client, tenant=TENANT, external_id=name, goal="bench refunds", defer_reports=True, patience_s=30
            )
        )

        @recovered.tool("refund.create", key="refund-{order_id}")
        def refund(order_id: str, amount_cents: int) -> dict:
            """Refund part or all of an order's payment."""
            reply = recovered.http().post(
                f"{sandbox_url}/refunds",
                json={"order_id": order_id, "amount_cents": amount_cents},
                headers={"Authorization": f"Bearer {api_key}"},
            )
            reply.raise_for_status()
            return reply.json()

        self.refund = refund

    def protected(self, order_id: str) -> tuple[float, str]:
        self.client.waited.append(0.0)
        with self.task.active():
            start = time.perf_counter()
            answer = self.refund(order_id=order_id, amount_cents=CENTS)
            return time.perf_counter() - start, answer["status"]

    def bare(self, order_id: str) -> float:
        start = time.perf_counter()
        reply = requests.post(
            f"{self.sandbox_url}/refunds",
            json={"order_id": order_id, "amount_cents": CENTS},
            headers={"Authorization": f"Bearer {self.api_key}", "Idempotency-Key": f"bare-{self.name}-{order_id}"},
            timeout=(3, 10),
        )
        reply.raise_for_status()
        return time.perf_counter() - start

    def close(self) -> None:
        self.stack.close()


def _sequential(consoles: list[Console], agents: dict[str, _Agent], run: str, latency: int, count: int) -> dict:
    """`count` rounds, each a bare call and a protected call per console, the order rotating round by round."""
    seconds: dict[str, list[float]] = {"bare": [], **{c.name: [] for c in consoles}}
    statuses: dict[str, list[str]] = {c.name: [] for c in consoles}
    cpu_before = {c.name: c.cpu_s() for c in consoles}
    trips_before = {c.name: agents[c.name].client.round_trips for c in consoles}
    for agent in agents.values():
        agent.client.waited.clear()
    order = ["bare", *(c.name for c in consoles)]
    for n in range(count):
        turn = order[n % len(order) :] + order[: n % len(order)]
        for who in turn:
            order_id = f"O-{int(run, 16) % 10**6}{latency:03d}{n:04d}"
            if who == "bare":
                seconds["bare"].append(agents[consoles[0].name].bare(order_id))
            else:
                spent, status = agents[who].protected(order_id)
                seconds[who].append(spent)
                statuses[who].append(status)
    for agent in agents.values():  # the deferred reports in, before the CPU is read
        agent.task.agent.reports.settle(agent.task.id)
    time.sleep(0.5)
    return _figures(consoles, seconds, statuses, cpu_before, trips_before, agents)


def _figures(consoles, seconds, statuses, cpu_before, trips_before, agents) -> dict:
    bare = seconds["bare"]
    out: dict[str, Any] = {"bare_median_ms": _ms(statistics.median(bare)), "bare_p95_ms": _ms(_p95(bare))}
    for console in consoles:
        mine = seconds[console.name]
        out[console.name] = {
            "median_ms": _ms(statistics.median(mine)),
            "p95_ms": _ms(_p95(mine)),
            "ratio_median": round(statistics.median(mine) / statistics.median(bare), 3),
            "ratio_p95": round(_p95(mine) / _p95(bare), 3),
            "added_median_ms": _ms(statistics.median(mine) - statistics.median(bare)),
            "committed": statuses[console.name].count("committed"),
            "calls": len(mine),
            "server_cpu_ms_per_call": round((console.cpu_s() - cpu_before[console.name]) * 1000 / len(mine), 2),
            "console_wait_median_ms": _ms(statistics.median(agents[console.name].client.waited)),
            "round_trips_per_call": round(
                (agents[console.name].client.round_trips - trips_before[console.name]) / len(mine), 2
            ),
        }
    return out


def _concurrent(console: Console, token: str, sandbox: SandboxProcess, run: str) -> dict:
    """AGENTS agents at once, each CALLS_PER_AGENT protected calls in its own task: calls/s and CPU per call."""
    agents = [
        _Agent(console, token, sandbox.url, os.environ["SANDBOX_API_KEY"], f"bench-{run}-{console.name}-c{n}")
        for n in range(AGENTS)
    ]
    statuses: list[str] = []
    lock = threading.Lock()

    def work(number: int, agent: _Agent) -> None:
        for k in range(CALLS_PER_AGENT):
            _, status = agent.protected(f"O-{int(run, 16) % 10**5}{number:02d}{k:03d}")
            with lock:
                statuses.append(status)

    cpu, start = console.cpu_s(), time.perf_counter()
    threads = [threading.Thread(target=work, args=(n, a)) for n, a in enumerate(agents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    for agent in agents:
        agent.close()
    time.sleep(0.5)
    calls = len(statuses)
    return {
        "calls": calls,
        "committed": statuses.count("committed"),
        "calls_per_s": round(calls / elapsed, 1),
        "server_cpu_ms_per_call": round((console.cpu_s() - cpu) * 1000 / calls, 2),
    }


def bench_protected(count: int = CALLS) -> dict:
    load_before = os.getloadavg()[0]
    sandbox_env_defaults()
    run = uuid.uuid4().hex[:8]
    baseline_dir = os.environ.get("BENCH_BASELINE_DIR", "")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-protected-")))
        sandbox = SandboxProcess(
            tmp / "sandbox.sqlite3",
            api_key=os.environ["SANDBOX_API_KEY"],
            callback_secret=os.environ["SANDBOX_CALLBACK_SECRET"],
        ).start()
        stack.callback(sandbox.stop)
        registry = shipped_registry()
        registry["providers"][0]["base_url"] = sandbox.url
        load_registry(registry, actor=ACTOR, source="bench protected: the shipped registry")
        _, token = token_create(name=f"bench-protected-{run}", tenants=[TENANT], actor=ACTOR)
        consoles = [stack.enter_context(Console("current", None, tmp))]
        if baseline_dir:
            consoles.append(stack.enter_context(Console("baseline", Path(baseline_dir), tmp)))
        jobs = stack.enter_context(background_jobs(log_dir=tmp))
        api_key = os.environ["SANDBOX_API_KEY"]
        agents = {c.name: _Agent(c, token, sandbox.url, api_key, f"bench-{run}-{c.name}") for c in consoles}
        stack.callback(lambda: [agent.close() for agent in agents.values()])
        for agent in agents.values():  # warm each console's workers and connections (not measured)
            for n in range(8):
                agent.protected(f"O-9{n}{int(run, 16) % 10**5}")
        sequential = {}
        for latency in LATENCIES_MS:
            sandbox.clear_faults()
            if latency:
                sandbox.fault(route="/refunds", kind="latency", ms=latency, method="POST")
            sequential[f"{latency}ms"] = _sequential(consoles, agents, run, latency, count)
        sandbox.clear_faults()
        concurrent = {c.name: _concurrent(c, token, sandbox, run) for c in consoles}
        statements = statements_per_call(sandbox.url, token, api_key, run)
        ledger = sandbox.ledger()["by_key"]
    return {
        "benchmark": "protected",
        "database": connection.vendor,
        "api": f"gunicorn -c deploy/gunicorn.conf.py ({consoles[0].description})",
        "jobs": jobs.description,
        "baseline": baseline_dir or None,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "sequential": sequential,
        "concurrent_16_agents": concurrent,
        "statements": statements,
        "duplicates": sum(n > 1 for n in ledger.values()),
        "targets": TARGETS,
        "meets_target": _meets(sequential, concurrent),
    }


def _meets(sequential: dict, concurrent: dict) -> dict:
    slow = sequential["50ms"]["current"]
    out = {
        "ratio_median_50ms": slow["ratio_median"] <= TARGETS["ratio_median_50ms"],
        "ratio_p95_50ms": slow["ratio_p95"] <= TARGETS["ratio_p95_50ms"],
        "added_median_ms": all(
            sequential[k]["current"]["added_median_ms"] <= TARGETS["added_median_ms"] for k in sequential
        ),
    }
    base = sequential["50ms"].get("baseline")
    if base is not None:
        ratio = slow["server_cpu_ms_per_call"] / max(base["server_cpu_ms_per_call"], 1e-9)
        busy = concurrent["current"]["server_cpu_ms_per_call"] / max(
            concurrent["baseline"]["server_cpu_ms_per_call"], 1e-9
        )
        out["cpu_vs_baseline"] = {"sequential_50ms": round(ratio, 3), "concurrent": round(busy, 3)}
    return out

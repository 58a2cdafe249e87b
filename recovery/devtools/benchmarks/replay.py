"""The `replay` benchmark: refunds whose reply is lost (reply_lost; status_down: its status API down too), settled
through the demo runtime on a tool a duplicate probe proved safe, against a bare client retrying once with the same
key at the same sandbox: wall time per intent, duplicates, people, how each settled. The stage, the cases, the
breaker handling and the figures: docs/benchmarks.md ("The replay benchmark"); replay itself: docs/replay.md.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from django.conf import settings
from django.db import connection
from recovery_client import RecoveryClient
from recovery_client.runtime import COMMITTED
from requests.adapters import HTTPAdapter

from recovery.audit.chain import Actor
from recovery.devtools.agent import Agent, ToolBook
from recovery.devtools.drills.stage import (
    ApiServer,
    background_jobs,
    database_url,
    sandbox_env_defaults,
    shipped_registry,
)
from recovery.devtools.sandbox.process import SandboxProcess
from recovery.models import Attempt, AuditEvent, Breaker, BreakerBucket, Call, Receipt, Tool
from recovery.registry import load_registry
from recovery.services.probes import probe_call
from recovery.services.tokens import token_create

INTENTS = 50
TARGET_RATIO = 1.5
TOOL, TENANT, PROVIDER = "refund.create", "demo", "sandbox"
HOLD_CALLBACK_MS = 600_000  # the sandbox's maximum: no held-back callback arrives while the benchmark runs
PROBE_KEY_AGE_S = 5  # the probed key's age: the replays of the cases are younger (under a second or two)
API_WORKERS, API_THREADS = 2, 8
CENTS = 1250
CASES = {
    "reply_lost": ("commit_then_drop",),
    "status_down": ("commit_then_drop", "status_down"),
}
# Each case twice: against the local sandbox as it answers (a few milliseconds), and with every refund request (the
# writes, not the status queries) held PROVIDER_LATENCY_MS by the sandbox, as a payment provider's API answers
# (hundreds of milliseconds): the console's own round trips are a fixed cost per intent, the provider's latency is
# paid by the bare client and the product alike.
PROVIDER_LATENCY_MS = (0, 400)
ACTOR = Actor.system("bench")


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class _TimedClient(RecoveryClient):
    """The runtime's console client, timing each API round trip by what it is (add_call, admit, report, get_call)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spent: Counter[str] = Counter()
        self.count: Counter[str] = Counter()
        self.report_started = 0.0

    def _exchange(self, method: str, path: str, **kwargs: Any):
        what = _operation(method, path)
        start = time.perf_counter()
        if what == "report":
            self.report_started = start
        try:
            return super()._exchange(method, path, **kwargs)
        finally:
            self.spent[what] += time.perf_counter() - start
            self.count[what] += 1

    def reset(self) -> None:
        self.spent.clear()
        self.count.clear()


def _operation(method: str, path: str) -> str:
    if path.endswith("/outcome"):
        return "report"
    if path.endswith("/attempts"):
        return "admit"
    if path.endswith("/calls") and method == "POST":
        return "add_call"
    if path.startswith("/calls/") and method == "GET":
        return "get_call"
    return f"{method} {path.split('/')[1]}"


class _Runtime:
    """The demo runtime with its clock: one Agent, its sleeps and its provider request timed."""

    def __init__(self, api_url: str, token: str, registry: dict) -> None:
        self.client = _TimedClient(api_url, token)
        self.slept = 0.0
        self.sent_at = 0.0
        self.agent = Agent(
            self.client,
            ToolBook.from_registry(registry),
            tenant=TENANT,
            name="bench-replay",
            sleep=self._sleep,
            before_send=self._before_send,
        )

    def _sleep(self, seconds: float) -> None:
        self.slept += seconds
        time.sleep(seconds)

    def _before_send(self, tool: str, key: str, number: int) -> None:
        self.sent_at = time.perf_counter()

    def intent(self, key: str, order_id: str) -> dict:
        """One refund, its task made first (not timed), then run_call until it ends: its time and breakdown."""
        task = self.agent.start_task(f"task-{key}", goal=f"refund {CENTS} cents on order {order_id}")
        self.client.reset()
        self.slept = 0.0
        start = time.perf_counter()
        result = self.agent.run_call(
            task.id, step=1, tool=TOOL, key=key, arguments={"order_id": order_id, "amount_cents": CENTS}
        )
        seconds = time.perf_counter() - start
        provider = max(0.0, self.client.report_started - self.sent_at) if self.sent_at else 0.0
        measured = {
            "key": key,
            "seconds": seconds,
            "outcome": result.outcome,
            "call_id": result.call_id,
            "console_s": sum(self.client.spent.values()),
            "console": dict(self.client.spent),
            "round_trips": dict(self.client.count),
            "provider_s": provider,
            "waiting_s": self.slept,
        }
        self.agent.submit(task.id, f"refund of order {order_id}: {result.outcome}")
        return measured


class _BareClient:
    """What a careful client does with no console: POST with an Idempotency-Key, and on a connection dropped
    without a reply, the same request once more with the same key."""

    def __init__(self, url: str, api_key: str, timeout: tuple[float, float]) -> None:
        self.url = url.rstrip("/") + "/refunds"
        self.headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
        self.timeout = timeout
        self.session = requests.Session()
        no_retries = HTTPAdapter(max_retries=0)  # like the runtime's session: nothing resent underneath
        self.session.mount("http://", no_retries)

    def intent(self, key: str, order_id: str) -> dict:
        body = {"order_id": order_id, "amount_cents": CENTS}
        headers = self.headers | {"Idempotency-Key": key}
        start, sent, status = time.perf_counter(), 0, None
        for _ in range(2):
            sent += 1
            try:
                response = self.session.post(self.url, json=body, headers=headers, timeout=self.timeout)
            except requests.ConnectionError:
                continue
            status = response.status_code
            break
        return {"seconds": time.perf_counter() - start, "sent": sent, "status": status}


def _faults(sandbox: SandboxProcess, key: str, kinds: tuple[str, ...], latency_ms: int = 0) -> None:
    """The case's faults on one key, its refund requests held `latency_ms`, and its callback held back."""
    if latency_ms:
        sandbox.fault(route="/refunds", key=key, kind="latency", ms=latency_ms, method="POST")
    for kind in kinds:
        if kind == "commit_then_drop":
            sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", method="POST", times=1)
        elif kind == "status_down":
            sandbox.fault(route="/refunds/by-key", key=key, kind="status_down", status=503)
    sandbox.fault(route="/refunds", key=key, kind="delayed_callbacks", ms=HOLD_CALLBACK_MS, times=1)


def _clear_tool_breaker(tool: Tool) -> bool:
    """Forget refund.create's breaker counts (every intent loses a reply: docs/benchmarks.md); whether it had opened."""
    opened = Breaker.objects.filter(tool=tool).exclude(state="closed").exists()
    BreakerBucket.objects.filter(tool=tool).delete()
    Breaker.objects.filter(tool=tool).delete()
    return opened


def _prove(runtime: _Runtime, tool: Tool, run: str, key_age_s: float) -> dict:
    """One refund committed normally, its key aged `key_age_s`, then the duplicate probe on it."""
    key = f"bench-replay-probe-{run}"
    done = runtime.intent(key, f"O-{int(run, 16) % 10**9}0")
    if done["outcome"] != COMMITTED:
        raise AssertionError(f"the probe's refund ended {done['outcome']}, not committed")
    call = Call.objects.select_related("tool__provider", "tenant").get(pk=done["call_id"])
    first = Attempt.objects.filter(call=call, number=1).values_list("admitted_at", flat=True).get()
    age = time.time() - first.timestamp()
    if age < key_age_s:
        time.sleep(key_age_s - age + 0.1)
    probe = probe_call(call, actor=ACTOR)
    tool.refresh_from_db()
    return {
        "call_state": call.state,
        "decision": probe.decision,
        "detail": probe.detail,
        "http_status": probe.http_status,
        "observed_effects": probe.observed_effects,
        "key_age_s": probe.key_age_s,
        "retry_path": tool.retry_path,
        "retry_path_key_age_s": tool.retry_path_key_age_s,
    }


def _case(
    name: str, count: int, *, runtime: _Runtime, bare: _BareClient, sandbox, tool: Tool, run: str, latency_ms: int = 0
) -> dict:
    kinds = CASES[name.split("-")[0]]
    product, baseline, cleared = [], [], 0
    for n in range(count):
        key, bare_key = f"bench-replay-{name}-{run}-{n}", f"bench-bare-{name}-{run}-{n}"
        order_id = f"O-{int(run, 16) % 10**9}{n + 1:03d}"
        _faults(sandbox, key, kinds, latency_ms)
        _faults(sandbox, bare_key, kinds, latency_ms)
        cleared += _clear_tool_breaker(tool)
        if n % 2 == 0:
            baseline.append(bare.intent(bare_key, order_id))
            product.append(runtime.intent(key, order_id))
        else:
            product.append(runtime.intent(key, order_id))
            baseline.append(bare.intent(bare_key, order_id))
    return _report(name, product, baseline, sandbox=sandbox, run=run, breaker_opened=cleared)


def _report(name: str, product: list[dict], baseline: list[dict], *, sandbox, run: str, breaker_opened: int) -> dict:
    console = _console_side([intent["call_id"] for intent in product])
    ledger = sandbox.ledger()["by_key"]
    keys = {f"bench-replay-{name}-{run}-{n}" for n in range(len(product))}
    bare_keys = {f"bench-bare-{name}-{run}-{n}" for n in range(len(baseline))}
    seen_by_key = _requests_by_key(sandbox, keys | bare_keys)
    writes = Counter({key: sum(method == "POST" for method, _ in seen) for key, seen in seen_by_key.items()})
    seconds = [intent["seconds"] for intent in product]
    bare_seconds = [intent["seconds"] for intent in baseline]
    round_trips, console_ms = _round_trips(product)

    def median(field: str) -> float:
        return _ms(statistics.median(intent[field] for intent in product))

    return {
        "intents": len(product),
        "committed": console["committed"],
        "outcomes": dict(Counter(intent["outcome"] for intent in product)),
        "product_median_ms": _ms(statistics.median(seconds)),
        "product_p95_ms": _ms(_percentile(seconds, 0.95)),
        "bare_median_ms": _ms(statistics.median(bare_seconds)),
        "bare_p95_ms": _ms(_percentile(bare_seconds, 0.95)),
        "ratio_median": round(statistics.median(seconds) / statistics.median(bare_seconds), 2),
        "ratio_p95": round(_percentile(seconds, 0.95) / _percentile(bare_seconds, 0.95), 2),
        "duplicates": sum(ledger.get(key, 0) > 1 for key in keys),
        "effects": sum(ledger.get(key, 0) for key in keys),
        "bare_duplicates": sum(ledger.get(key, 0) > 1 for key in bare_keys),
        "bare_effects": sum(ledger.get(key, 0) for key in bare_keys),
        "bare_settled": sum(intent["status"] == 200 for intent in baseline),
        "people": len(console["why_people"]),
        "people_why": sorted(set(console["why_people"].values()))[:5],
        "settled_by": dict(console["settled_by"]),
        "status_checks": dict(console["checks"]),
        "write_requests_per_intent": round(sum(writes[key] for key in keys) / len(keys), 2),
        "bare_write_requests_per_intent": round(sum(writes[key] for key in bare_keys) / len(bare_keys), 2),
        "round_trips_per_intent": {what: round(n / len(product), 2) for what, n in sorted(round_trips.items())},
        "round_trip_median_ms": {what: _ms(statistics.median(spent)) for what, spent in sorted(console_ms.items())},
        "breakdown_median_ms": {
            "console_api": median("console_s"),
            "provider": median("provider_s"),
            "waiting": median("waiting_s"),
            **_unknown_at_console(product, console, seen_by_key),
        },
        "tool_breaker_cleared": True,
        "tool_breaker_found_open": breaker_opened,
    }


def _console_side(ids: list[int]) -> dict:
    """What the console holds of the intents' calls: how many committed, the settling receipts' sources and times,
    the status checks' answers, each call's first report, and why any went to a person."""
    calls = Call.objects.filter(pk__in=ids)
    receipts = list(Receipt.objects.filter(call_id__in=ids).order_by("pk"))
    settling = [r for r in receipts if r.applied and r.local_state_after == "COMMITTED"]
    first_reported = Attempt.objects.filter(call_id__in=ids, number=1).values_list("call_id", "reported_at")
    to_people = AuditEvent.objects.filter(call_id__in=ids, to_state="HUMAN_REVIEW").order_by("seq")
    return {
        "committed": sum(call.state == "COMMITTED" for call in calls),
        "settled_by": Counter(r.source for r in settling),
        "checks": Counter(r.observed for r in receipts if r.source == "poll"),
        "first_reported": dict(first_reported.order_by()),
        "settled_at": {r.call_id: r.created_at for r in settling},
        "why_people": {event.call_id: event.reason for event in to_people},
    }


def _requests_by_key(sandbox, keys: set[str]) -> dict[str, list[tuple[str, datetime]]]:
    """The sandbox's refund requests under `keys`: method and time, per key, in the log's order."""
    seen_by_key: dict[str, list[tuple[str, datetime]]] = {}
    for request in sandbox.requests(path_prefix="/refunds"):
        if request["key"] in keys:
            seen_by_key.setdefault(request["key"], []).append((request["method"], _at(request["at"])))
    return seen_by_key


def _round_trips(product: list[dict]) -> tuple[Counter, dict[str, list[float]]]:
    """The intents' API round trips by what they were, and each one's time."""
    round_trips, console = Counter(), {}
    for intent in product:
        round_trips.update(intent["round_trips"])
        for what, spent in intent["console"].items():
            console.setdefault(what, []).append(spent / intent["round_trips"][what])
    return round_trips, console


def _unknown_at_console(product: list[dict], console: dict, seen_by_key: dict) -> dict[str, float | None]:
    """The console's side of each UNKNOWN (medians, ms): from the lost reply's report to the settling receipt; to
    reconciliation's first request to the provider (a status query, or the replay when the status breaker skipped
    it); and from its last one to the receipt."""
    first_reported, settled_at = console["first_reported"], console["settled_at"]
    unknown_s = [
        (settled_at[pk] - first_reported[pk]).total_seconds()
        for pk in (intent["call_id"] for intent in product)
        if pk in settled_at and first_reported.get(pk) is not None
    ]
    pickup, applying = [], []
    for intent in product:
        pk, seen = intent["call_id"], seen_by_key.get(intent["key"], [])[1:]
        if pk in settled_at and first_reported.get(pk) is not None and seen:
            pickup.append((seen[0][1] - first_reported[pk]).total_seconds())
            applying.append((settled_at[pk] - seen[-1][1]).total_seconds())
    return {
        "unknown_at_console": _ms(statistics.median(unknown_s)) if unknown_s else None,
        "report_to_first_provider_request": _ms(statistics.median(pickup)) if pickup else None,
        "last_provider_request_to_settled": _ms(statistics.median(applying)) if applying else None,
    }


def _gunicorn(stack: ExitStack, tmp: Path) -> str:
    """The console under gunicorn on a free port, on this process's database and settings, stopped with `stack`."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    command = [sys.executable, "-m", "gunicorn", "console.wsgi:application", "--bind", f"127.0.0.1:{port}"]
    command += ["--workers", str(API_WORKERS), "--threads", str(API_THREADS), "--log-level", "warning"]
    log_path = tmp / "api.log"
    with open(log_path, "a") as log:
        process = subprocess.Popen(
            command, cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    stack.callback(_stop, process)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            requests.get(f"{url}/api/v1/calls/0", timeout=10)  # a 401: cheap, and served by the whole stack
            return url
        except requests.RequestException:
            time.sleep(0.1)
    raise RuntimeError(f"the API (gunicorn) did not start: {log_path.read_text()[-2000:]}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _api(stack: ExitStack, tmp: Path) -> tuple[str, str]:
    """The console over HTTP on this process's database: gunicorn, or threads here for in-memory SQLite (which no
    other process can open)."""
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        server = ApiServer().start()
        stack.callback(server.stop)
        return server.url, "threads of the benchmark's process (SQLite in memory)"
    return _gunicorn(stack, tmp), f"gunicorn {API_WORKERS} workers x {API_THREADS} threads"


def _label(name: str, latency_ms: int) -> str:
    return f"{name}-{latency_ms}ms" if latency_ms else name


def bench_replay(count: int = INTENTS, *, probe_key_age_s: float = PROBE_KEY_AGE_S) -> dict:
    """The probe, then both cases with `count` intents each (bare and product alternating)."""
    load_before = os.getloadavg()[0]
    sandbox_env_defaults()
    run = uuid.uuid4().hex[:8]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-replay-")))
        api_url, served = _api(stack, tmp)
        sandbox = _sandbox(stack, tmp, api_url)
        registry = shipped_registry()
        registry["providers"][0]["base_url"] = sandbox.url
        load_registry(registry, actor=ACTOR, source="bench replay: the shipped registry")
        _, token = token_create(name=f"bench-replay-{run}", tenants=[TENANT], actor=ACTOR)
        jobs = stack.enter_context(background_jobs(log_dir=tmp))
        tool = Tool.objects.select_related("provider").get(name=TOOL)
        runtime = _Runtime(api_url, token, registry)
        provider = registry["providers"][0]
        bare = _BareClient(
            sandbox.url, os.environ["SANDBOX_API_KEY"], (provider["connect_timeout_s"], provider["read_timeout_s"])
        )
        probe = _prove(runtime, tool, run, probe_key_age_s)
        if probe["retry_path"] != "safe":
            raise AssertionError(f"the probe did not prove {TOOL} safe: {probe}")
        cases = _cases(count, runtime=runtime, bare=bare, sandbox=sandbox, tool=tool, run=run)
    return {
        "benchmark": "replay",
        "database": connection.vendor,
        "api": served,
        "jobs": jobs.description,
        "intents_per_case": count,
        # The machine's 1-minute load average before and after: a busy machine slows the console's round trips
        # (Python and PostgreSQL work) far more than the bare client's.
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "probe": probe,
        **cases,
        "target_ratio": TARGET_RATIO,
        # Per case: no duplicate, no person, every intent committed, and the median within TARGET_RATIO.
        "meets_target": {label: _meets(case) for label, case in cases.items()},
    }


def _sandbox(stack: ExitStack, tmp: Path, api_url: str) -> SandboxProcess:
    """A sandbox provider process sending its signed callbacks to the console at `api_url`, stopped with `stack`."""
    sandbox = SandboxProcess(
        tmp / "sandbox.sqlite3",
        api_key=os.environ["SANDBOX_API_KEY"],
        callback_secret=os.environ["SANDBOX_CALLBACK_SECRET"],
        extra_args=("--callback-url", f"{api_url}/api/v1/providers/{PROVIDER}/callbacks"),
    ).start()
    stack.callback(sandbox.stop)
    return sandbox


def _cases(count: int, **stage: Any) -> dict:
    """Every case at every provider latency, `count` intents each; a sandbox that died mid-run says so."""
    sandbox = stage["sandbox"]
    try:
        return {
            _label(name, latency): _case(_label(name, latency), count, latency_ms=latency, **stage)
            for name in CASES  # reply_lost first at both latencies: status_down's 503s may open the status breaker
            for latency in PROVIDER_LATENCY_MS
        }
    except requests.ConnectionError as exc:
        if sandbox.process is not None and (code := sandbox.process.poll()) is not None:
            raise RuntimeError(f"the sandbox exited ({code}) mid-run:\n{sandbox.stderr()[-3000:]}") from exc
        raise


def _meets(case: dict) -> bool:
    settled = case["duplicates"] == 0 and case["people"] == 0 and case["committed"] == case["intents"]
    return settled and case["ratio_median"] <= TARGET_RATIO

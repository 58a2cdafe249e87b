"""The `ingest` benchmark: single-shot attempts over HTTP on PostgreSQL (the product, its ORM twin, its pooled
twin) against a bare WSGI baseline making the same statements, in interleaved rounds. docs/benchmarks.md ("The ingest
benchmark") describes the series and the checks; the target is docs/design/quality-targets.md's.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from importlib.metadata import version
from urllib.parse import quote

import psycopg
import requests
from django.conf import settings
from django.db import connection
from django.test import Client, override_settings

from console.env import keyring_text
from recovery.audit.chain import Actor, chain_key
from recovery.devtools.benchmarks import bare_wsgi
from recovery.engine.canonical import canonical_json
from recovery.engine.fingerprint import fingerprint
from recovery.models import AuditChainHead, Call, Step, Task, Tenant, Tool
from recovery.registry import load_registry, tool_policy
from recovery.services import tasks
from recovery.services.calls import call_add
from recovery.services.tokens import token_create

CLIENTS = 8
WORKERS, THREADS = 4, 1
WARM_UP = 5  # attempts per client before each round's measured ones (imports, connections, statement caches)
PRODUCT_APP, BARE_APP = "console.wsgi:application", "recovery.devtools.benchmarks.bare_wsgi:application"
TARGET_RATIO = 0.5  # docs/design/quality-targets.md
TARGET_STATEMENTS = 15  # docs/design/quality-targets.md: statements per single-shot attempt
ROUNDS = 5  # measured rounds per server, interleaved
TENANTS = [f"bench-{n}" for n in range(4)]
TOOLS = [f"bench.lookup-{n}" for n in range(4)]
ARGS_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"],
    "additionalProperties": False,
}
REGISTRY = {
    "tenants": [{"name": name, "tools": "*"} for name in TENANTS],
    "providers": [{"name": "bench", "base_url": "http://127.0.0.1:9"}],
    "tools": [
        {
            "name": name,
            "provider": "bench",
            "side_effect": "read",
            "request": {"method": "GET", "path": "/orders"},
            "args_schema": ARGS_SCHEMA,
            "required_result_fields": ["status"],
            "budgets": {"max_attempts": 3},
        }
        for name in TOOLS
    ],
}
# A committed 200 of a read tool, as recovery_client.RecoveryClient.single_shot sends it.
OUTCOME = {"connection_opened": True, "sent": True, "http_status": 200, "result": {"status": "shipped"}}


def attempt_body(call_id: int) -> dict:
    return {"attempt_id": f"a-{call_id}", "evidence": [], "outcome": OUTCOME}


# --- data ----------------------------------------------------------------------------------------------------------


@dataclass
class Fixture:
    token: str
    token_id: int
    tenants: list[Tenant]
    tools: list[Tool]

    @classmethod
    def create(cls) -> Fixture:
        actor = Actor.system("bench")
        load_registry(REGISTRY, actor=actor)
        row, token = token_create(name="bench", tenants=TENANTS, actor=actor)
        tenants = list(Tenant.objects.filter(name__in=TENANTS).order_by("name"))
        tools = list(Tool.objects.filter(name__in=TOOLS).select_related("provider").order_by("name"))
        return cls(token=token, token_id=row.pk, tenants=tenants, tools=tools)

    def service_call(self, label: str) -> int:
        """One READY call made as a runtime makes it: task_create + call_add (the services behind the API)."""
        runtime = Actor(kind="token", label="token:bench", token_id=self.token_id)
        task, _ = tasks.task_create(
            tenant=self.tenants[0], external_id=label, agent="bench", goal="bench", budget={}, actor=runtime
        )
        added = call_add(
            task=task,
            step_index=1,
            depends_on=[],
            tool_name=self.tools[0].name,
            arguments={"order_id": label},
            idempotency_key=label,
            actor=runtime,
        )
        return added.call.pk

    def bulk_calls(self, count: int, label: str) -> list[int]:
        """`count` READY calls, one per task, with what call_add writes (task chain heads included), in bulk."""
        tenants, tools = self.tenants, self.tools
        task_rows = Task.objects.bulk_create(
            Task(
                tenant=tenants[n % len(tenants)],
                external_id=f"{label}-{n}",
                agent="bench",
                goal="bench",
                created_by_token_id=self.token_id,
            )
            for n in range(count)
        )
        steps = Step.objects.bulk_create(Step(task=task, index=1) for task in task_rows)
        AuditChainHead.objects.bulk_create(AuditChainHead(key=chain_key(task.pk)) for task in task_rows)
        calls = []
        for n, (task, step) in enumerate(zip(task_rows, steps, strict=True)):
            tool, args = tools[n % len(tools)], {"order_id": f"{label}-{n}"}
            calls.append(
                Call(
                    tenant=task.tenant,
                    task=task,
                    step=step,
                    tool=tool,
                    idempotency_key=f"{label}-{n}",
                    arguments=args,
                    fingerprint=fingerprint(tool.name, args),
                    side_effect=tool.side_effect,
                    risk=tool.risk,
                    max_attempts=tool_policy(tool).budgets.max_attempts,
                    outcome_timeout_s=tool.outcome_timeout_s,
                )
            )
        return [call.pk for call in Call.objects.bulk_create(calls)]


def committed(call_ids: list[int]) -> int:
    return Call.objects.filter(pk__in=call_ids, state="COMMITTED", attempts__isnull=False).distinct().count()


# --- statements ----------------------------------------------------------------------------------------------------

_KIND = re.compile(r"^\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|SAVEPOINT|RELEASE SAVEPOINT)\b\s*\"?(\w+)?", re.I)


def signature(sql: str) -> str:
    """A statement's kind and main table: `INSERT recovery_attempt`, `SELECT recovery_call` (the FROM outside any
    parentheses), `SAVEPOINT`, `RELEASE`."""
    match = _KIND.match(sql)
    if not match:
        return sql.split(None, 1)[0].upper()
    kind = match.group(1).upper().split()[0]
    if kind in ("SAVEPOINT", "RELEASE"):
        return kind
    if kind == "SELECT":
        outer, previous = sql, None
        while outer != previous:
            previous, outer = outer, re.sub(r"\([^()]*\)", "", outer)
        table = re.search(r'\bFROM\s+"?(\w+)"?', outer, re.I)
        return f"SELECT {table.group(1) if table else '-'}"
    return f"{kind} {match.group(2)}"


def _host() -> str:
    hosts = [h.lstrip(".") for h in settings.ALLOWED_HOSTS if h != "*"]
    return hosts[0] if hosts else "localhost"


def product_statements(token: str, call_id: int, *, sql: bool = True) -> list[str]:
    """The SQL of one single shot served in-process by the whole Django stack (middleware, ninja, services);
    `sql` False: with the hot path's ORM twin (RECOVERY_HOT_PATH_SQL off)."""
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_HOST=_host())
    with connection.execute_wrapper(wrapper), override_settings(RECOVERY_HOT_PATH_SQL=sql):
        response = client.post(
            f"/api/v1/calls/{call_id}/attempts", attempt_body(call_id), content_type="application/json", secure=True
        )
    assert response.status_code == 201, (response.status_code, response.content[:500])
    assert response.json()["call_state"] == "COMMITTED", response.json()
    return seen


def bare_statements(dsn: str, token: str, call_id: int) -> list[str]:
    trace: list[str] = []
    with psycopg.connect(dsn) as conn:
        answer = bare_wsgi.single_shot(conn, call_id, attempt_body(call_id), token, _pepper(), trace=trace)
    assert answer["call_state"] == "COMMITTED", answer
    return trace


def _steady(probe, calls: list[int]) -> list[str]:
    """The shortest of a few probes: the steady state, without the statements a request makes now and then (the
    token's last_used_at once a minute, pruning the breaker's old buckets once per bucket and tool)."""
    return min((probe(call_id) for call_id in calls), key=len)


# --- servers and clients -------------------------------------------------------------------------------------------


def _pepper() -> str:
    return settings.RECOVERY_TOKEN_PEPPER


def connection_url() -> str:
    db = connection.settings_dict
    auth = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"], safe="")
    return f"postgres://{auth}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    url: str
    pid: int


def server_env(database_url: str, **extra_env: str) -> dict[str, str]:
    """The environment of a process of the benchmark's (a server, a job loop): production settings, DEBUG off,
    against `database_url`, with this process's secrets."""
    env = dict(os.environ)
    env.update(**extra_env)
    env.update(
        DJANGO_SETTINGS_MODULE="console.settings",
        DATABASE_URL=database_url,
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(48),
        ALLOWED_HOSTS="127.0.0.1,localhost",
        RECOVERY_TOKEN_PEPPER=_pepper(),
        RECOVERY_AUDIT_KEYS=keyring_text(settings.RECOVERY_AUDIT_KEYS),
        SECURE_SSL_REDIRECT="0",
        LOG_LEVEL="WARNING",
    )
    return env


@contextmanager
def serve(app: str, database_url: str, **extra_env: str) -> Iterator[Server]:
    """gunicorn serving `app` (module:callable) with DEBUG off against `database_url`, until the block ends."""
    port = _free_port()
    env = server_env(database_url, **extra_env)
    command = [sys.executable, "-m", "gunicorn", app, "--bind", f"127.0.0.1:{port}"]
    command += ["--workers", str(WORKERS), "--threads", str(THREADS), "--log-level", "warning"]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=settings.BASE_DIR, env=env, stdout=log, stderr=log)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(process, url, log)
            yield Server(url=url, pid=process.pid)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(process: subprocess.Popen, url: str, log) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            requests.get(f"{url}/api/v1/calls/0", timeout=5)
            return
        # gunicorn listens before its workers have booted (seconds on a busy machine): a request may wait that long
        except (requests.ConnectionError, requests.Timeout):
            time.sleep(0.1)
    log.seek(0)
    raise RuntimeError(f"gunicorn did not start: {log.read()[-2000:].decode(errors='replace')}")


def _client(url: str, token: str, warm: list[int], jobs: list[int], barrier, results) -> None:
    """One client process: the warm-up attempts, then (all clients together) its share of the measured ones."""
    session = requests.Session()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    bodies = {call_id: canonical_json(attempt_body(call_id)).encode() for call_id in warm + jobs}

    def post(call_id: int) -> int:
        target = f"{url}/api/v1/calls/{call_id}/attempts"
        return session.post(target, data=bodies[call_id], headers=headers, timeout=60).status_code

    statuses = Counter(post(call_id) for call_id in warm)
    barrier.wait()
    latencies = []
    start = time.perf_counter()
    for call_id in jobs:
        sent = time.perf_counter()
        statuses[post(call_id)] += 1
        latencies.append(time.perf_counter() - sent)
    results.put((start, time.perf_counter(), dict(statuses), latencies))


def drive(url: str, token: str, warm: list[int], jobs: list[int], meter=None) -> dict:
    """CLIENTS processes posting `jobs` (call ids, dealt round robin) after `warm`; attempts/s over the whole run.

    `meter`, if given, is called once when the warm-up is over and the measured attempts start, and once more when
    they are done; its two answers are returned as `metered`.
    """
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(CLIENTS + 1), context.Queue()  # the clients, and this process
    processes = [
        context.Process(
            target=_client, args=(url, token, warm[n::CLIENTS], jobs[n::CLIENTS], barrier, results), daemon=True
        )
        for n in range(CLIENTS)
    ]
    for process in processes:
        process.start()
    try:
        barrier.wait(timeout=600)
        metered = [meter()] if meter else []
        answers = [results.get(timeout=600) for _ in processes]
        metered += [meter()] if meter else []
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    start, end = min(a[0] for a in answers), max(a[1] for a in answers)
    statuses: Counter = Counter()
    for answer in answers:
        statuses.update(answer[2])
    latencies = [t for answer in answers for t in answer[3]]
    if set(statuses) != {201}:
        raise RuntimeError(f"{url}: answers other than 201 Created: {dict(statuses)}")
    return {
        "attempts": len(jobs),
        "seconds": end - start,
        "attempts_per_s": round(len(jobs) / (end - start), 1),
        "latency_median_ms": round(statistics.median(latencies) * 1e3, 2),
        "latency_p99_ms": round(sorted(latencies)[int(0.99 * len(latencies))] * 1e3, 2),
        "metered": metered,
    }


def _cpu_seconds(pids) -> dict[int, float]:
    """CPU time (user + system) each process has used so far, from Linux's /proc (those it cannot read left out)."""
    used = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return used


def _server_pids(server: Server) -> list[int]:
    try:
        with open(f"/proc/{server.pid}/task/{server.pid}/children") as children:
            return [server.pid, *map(int, children.read().split())]
    except OSError:
        return [server.pid]


def _backend_pids() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [connection.settings_dict["NAME"]])
        return [pid for (pid,) in cursor.fetchall()]


def measured_round(server: Server, token: str, warm: list[int], jobs: list[int]) -> dict:
    """drive(), plus the CPU the server's processes and the database's backends used per measured attempt: unlike
    a rate, hardly moved by whatever else the machine runs."""
    result = drive(
        server.url, token, warm, jobs, lambda: (_cpu_seconds(_server_pids(server)), _cpu_seconds(_backend_pids()))
    )
    (before_server, before_db), (after_server, after_db) = result.pop("metered")
    for key, before, after in (("server", before_server, after_server), ("database", before_db, after_db)):
        used = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
        result[f"{key}_cpu_ms"] = used * 1e3 / len(jobs)
    return result


def raw_psycopg(dsn: str, token: str, warm: list[int], jobs: list[int]) -> float:
    """bare_wsgi.single_shot in a loop from this process over one connection: attempts/s without HTTP."""
    with psycopg.connect(dsn) as conn:
        for call_id in warm:
            bare_wsgi.single_shot(conn, call_id, attempt_body(call_id), token, _pepper())
        start = time.perf_counter()
        for call_id in jobs:
            bare_wsgi.single_shot(conn, call_id, attempt_body(call_id), token, _pepper())
        return round(len(jobs) / (time.perf_counter() - start), 1)


def wait_disconnected(name: str, timeout: float = 15) -> None:
    """Servers are stopped: wait until their sessions have left, so the test database can be dropped."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [name]
            )
            if cursor.fetchone()[0] == 0:
                return
            time.sleep(0.1)


# --- the benchmark -------------------------------------------------------------------------------------------------


def interleaved_rounds(
    fixture: Fixture,
    servers: dict[str, Server],
    per_round: int,
    *,
    rounds: int = ROUNDS,
    around: Mapping[str, Callable[[], AbstractContextManager]] | None = None,
) -> tuple[dict[str, list[dict]], dict[str, list[int]]]:
    """`rounds` rounds of `per_round` attempts per series (a label and its server), each on fresh calls, the series
    in a rotating order, so that a drift in what else the machine runs weighs on all alike: each series' rounds and
    the calls they used. `around[label]`, if given, makes the context each of that series' rounds runs in (the
    metrics benchmark's fold process: the same server with and without it)."""
    warm, labels = CLIENTS * WARM_UP, list(servers)
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    all_calls: dict[str, list[int]] = {label: [] for label in labels}
    for n in range(rounds):
        for label in labels[n % len(labels) :] + labels[: n % len(labels)]:
            calls = fixture.bulk_calls(warm + per_round, f"{label}-{n}")
            all_calls[label] += calls
            with (around or {}).get(label, nullcontext)():
                runs[label].append(measured_round(servers[label], fixture.token, calls[:warm], calls[warm:]))
    return runs, all_calls


def rates(runs: dict[str, list[dict]]) -> dict[str, float]:
    """Each series' attempts per second: the median of its rounds."""
    return {label: statistics.median(r["attempts_per_s"] for r in rounds) for label, rounds in runs.items()}


def check_committed(all_calls: dict[str, list[int]]) -> None:
    for label, calls in all_calls.items():
        if (done := committed(calls)) != len(calls):
            raise AssertionError(f"{label}: {len(calls) - done} of {len(calls)} calls did not end COMMITTED")


def bench_ingest(count: int = 1000) -> dict:
    if connection.vendor != "postgresql":
        return {
            "benchmark": "ingest",
            "skipped": "needs PostgreSQL (the ingest target of docs/design/quality-targets.md is defined there), "
            f"this is {connection.vendor}: "
            "run with DATABASE_URL=postgres://user@host:5432/dbname",
        }
    fixture = Fixture.create()
    dsn = connection_url()
    product, orm = _statements_checked(fixture, dsn)
    per_round = max(count // ROUNDS, 50)
    runs, raw_rate = _series(fixture, dsn, count, per_round)
    rate = rates(runs)
    kinds = Counter(signature(sql).split()[0] for sql in product)
    return {
        "benchmark": "ingest",
        "database": connection.vendor,
        "server": f"gunicorn {version('gunicorn')} --workers {WORKERS} --threads {THREADS}",
        "clients": CLIENTS,
        "rounds": ROUNDS,
        "attempts_per_round": per_round,
        "product_attempts_per_s": round(rate["product"], 1),
        "bare_attempts_per_s": round(rate["bare"], 1),
        "ratio": round(rate["product"] / rate["bare"], 2),
        "target_ratio": TARGET_RATIO,
        # The hot path's raw statement against its ORM twin: the twin's rate and statements, and its ratio.
        "orm_twin_attempts_per_s": round(rate["orm"], 1),
        "orm_twin_ratio": round(rate["orm"] / rate["bare"], 2),
        "orm_twin_statements_per_attempt": len(orm),
        # The product with Django's psycopg pool (DATABASE_POOL=1) instead of a persistent connection per thread.
        "pool_attempts_per_s": round(rate["pool"], 1),
        "pool_ratio_to_product": round(rate["pool"] / rate["product"], 2),
        "raw_psycopg_attempts_per_s": raw_rate,
        "statements_per_attempt": len(product),
        "target_statements_per_attempt": TARGET_STATEMENTS,
        "statements_by_kind": dict(sorted(kinds.items())),
        "rounds_attempts_per_s": {label: [r["attempts_per_s"] for r in rounds] for label, rounds in runs.items()},
        # CPU per attempt of the gunicorn processes (the app) and of the PostgreSQL backends, per server.
        "server_cpu_ms_per_attempt": {label: _median(rounds, "server_cpu_ms") for label, rounds in runs.items()},
        "database_cpu_ms_per_attempt": {label: _median(rounds, "database_cpu_ms") for label, rounds in runs.items()},
        "latency_median_ms": {label: _median(rounds, "latency_median_ms") for label, rounds in runs.items()},
        "latency_p99_ms": {label: _median(rounds, "latency_p99_ms") for label, rounds in runs.items()},
    }


def _statements_checked(fixture: Fixture, dsn: str) -> tuple[list[str], list[str]]:
    """What one attempt costs in statements (the product's, its ORM twin's), with proof that the baseline does the
    same work: AssertionError when its statements differ from the product's."""
    # Probes of one tool (bulk calls cycle through the tools), so all but the first find that tool's breaker bucket
    # already there.
    per_tool = len(fixture.tools)
    service_probes = [fixture.service_call(f"probe-{n}") for n in range(3)]
    product = _steady(lambda c: product_statements(fixture.token, c), fixture.bulk_calls(3 * per_tool, "p")[::per_tool])
    from_services = _steady(lambda c: product_statements(fixture.token, c), service_probes)
    bare = _steady(lambda c: bare_statements(dsn, fixture.token, c), fixture.bulk_calls(3 * per_tool, "b")[::per_tool])
    product_sig, bare_sig = [signature(s) for s in product], [signature(s) for s in bare]
    if (service_sig := [signature(s) for s in from_services]) != product_sig:
        raise AssertionError(
            f"a bulk-created call does not take the same path as one made through call_add:\n{product_sig}\n"
            f"{service_sig}"
        )
    if len(bare) != len(product) or bare_sig != product_sig:
        diff = [(n, p, b) for n, (p, b) in enumerate(zip(product_sig, bare_sig, strict=False)) if p != b]
        raise AssertionError(
            f"the bare baseline makes {len(bare)} statements, the product {len(product)}; first differences: "
            f"{diff[:5]}\nproduct: {product_sig}\nbare: {bare_sig}"
        )
    orm = _steady(
        lambda c: product_statements(fixture.token, c, sql=False), fixture.bulk_calls(3 * per_tool, "o")[::per_tool]
    )
    return product, orm


def _series(fixture: Fixture, dsn: str, count: int, per_round: int) -> tuple[dict[str, list[dict]], float]:
    """The product, its ORM twin (RECOVERY_HOT_PATH_SQL off, docs/architecture.md: the raw statement stays only while
    the ORM misses a target), the product with the pool and the bare baseline in interleaved rounds, then the raw
    psycopg loop; every call checked COMMITTED. Each series' rounds, and the raw rate."""
    warm = CLIENTS * WARM_UP
    with (
        serve(PRODUCT_APP, dsn) as product_server,
        serve(PRODUCT_APP, dsn, RECOVERY_HOT_PATH_SQL="0") as orm_server,
        serve(PRODUCT_APP, dsn, DATABASE_POOL="1") as pool_server,
        serve(BARE_APP, dsn) as bare_server,
    ):
        servers = {"product": product_server, "orm": orm_server, "pool": pool_server, "bare": bare_server}
        runs, all_calls = interleaved_rounds(fixture, servers, per_round)
    raw_calls = fixture.bulk_calls(warm + count, "raw")
    raw_rate = raw_psycopg(dsn, fixture.token, raw_calls[:warm], raw_calls[warm:])
    all_calls["raw"] = raw_calls
    check_committed(all_calls)
    wait_disconnected(connection.settings_dict["NAME"])
    return runs, raw_rate


def _median(rounds: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rounds), 2)

"""Faults under the background jobs, on real processes: a redis-server of the test's own killed (SIGKILL) and started
again under a `manage.py runjobs` worker that no supervisor would restart, and a worker killed in the middle of a
burst of unknown outcomes (docs/deploy.md, "Jobs and the schedule"; docs/reconciliation.md).

The workers query the sandbox provider, whose status API answers in STATUS_LATENCY_S: a status check is a job still
running when Redis goes, and how long a burst takes to settle shows how many checks run at once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
import requests
from django.db import connection
from recovery_client import RecoveryClient, facts_from_exception, facts_from_response

from console import health
from recovery.audit.chain import Actor
from recovery.devtools.drills.stage import JobWorkers, database_url
from recovery.engine.states import RECONCILABLE
from recovery.models import Call
from recovery.registry import load_registry
from recovery.services.tokens import token_create
from tests.conftest import missing_service
from tests.sandbox import (
    SANDBOX_API_KEY_FOR_TESTS,
    SANDBOX_CALLBACK_SECRET_FOR_TESTS,
    sandbox_for_tests,
    sandbox_registry,
)
from tests.servers import RedisServer, production_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

STATUS_LATENCY_S = 1.0
CHECK_LEASE_S = 5  # the shortest RECOVERY_CHECK_LEASE_S allowed: a dead worker's leases lapse this quickly
IN_FLIGHT = 8  # RECOVERY_CHECKS_IN_FLIGHT, the runner's concurrency
REFUND = {"order_id": "O-4821", "amount_cents": 990}
_n = itertools.count(1)


@pytest.fixture(scope="module")
def slow_status_sandbox(tmp_path_factory):
    """The sandbox provider with status queries answering in STATUS_LATENCY_S (writes at once)."""
    path = tmp_path_factory.mktemp("sandbox-slow-status") / "sandbox.sqlite3"
    latency = ("--status-latency-ms", str(int(STATUS_LATENCY_S * 1000)))
    process = sandbox_for_tests(path, extra_args=latency).start()
    yield process
    process.stop()


@pytest.fixture
def redis_server():
    if not RedisServer.available():
        missing_service("needs redis-server (apt-get install redis-server)")
    with RedisServer() as server:
        yield server


@pytest.fixture
def world(slow_status_sandbox, redis_server, live_server, settings, monkeypatch, tmp_path):
    """The API (live_server) and its enqueues on `redis_server`, the sandbox registry, a runtime's client, and
    runjobs processes started on demand (`world["jobs"].start(...)`), stopped at the end whatever was killed."""
    slow_status_sandbox.reset()
    settings.REDIS_URL = redis_server.url
    settings.RQ_QUEUES = {"default": {"URL": redis_server.url, "DEFAULT_TIMEOUT": 60}}
    settings.RECOVERY_READY_CACHE_S = 0
    monkeypatch.setenv("SANDBOX_API_KEY", SANDBOX_API_KEY_FOR_TESTS)
    load_registry(sandbox_registry(slow_status_sandbox.url, max_checks=3), actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["demo"], actor=Actor.system("tests"))
    env = production_env(
        DATABASE_URL=database_url(),
        REDIS_URL=redis_server.url,
        RECOVERY_TOKEN_PEPPER=settings.RECOVERY_TOKEN_PEPPER,
        SANDBOX_API_KEY=SANDBOX_API_KEY_FOR_TESTS,
        SANDBOX_CALLBACK_SECRET=SANDBOX_CALLBACK_SECRET_FOR_TESTS,
        RECOVERY_RECONCILE_EVERY_S="1",
        RECOVERY_SWEEP_EVERY_S="1",
        RECOVERY_ACTIONS_EVERY_S="1",
        RECOVERY_CHECK_LEASE_S=str(CHECK_LEASE_S),
        RECOVERY_CHECKS_IN_FLIGHT=str(IN_FLIGHT),
        RECOVERY_SCHEDULER_LEASE_S="2",
        RECOVERY_AUDIT_CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
    )
    jobs = JobWorkers(env=env, log_dir=tmp_path)
    client = RecoveryClient(live_server.url, token)
    try:
        yield {"client": client, "sandbox": slow_status_sandbox, "jobs": jobs}
    finally:
        client.session.close()  # the live server's threads end with their keep-alive connections, closing their own
        # SIGKILL, each process's session (its scheduler process, rq's), and its work horses, in groups of their own:
        # nothing of them is kept (their Redis dies with the test), and a warm stop would wait for a running check.
        for process in jobs.processes:
            horses = [pid for pid in _children(process.pid) if pid != process.pid]
            for group in (process.pid, *horses):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)
            process.wait(10)
        _wait_for_other_sessions_to_end()


def _wait_for_other_sessions_to_end(timeout_s: float = 5) -> None:
    """The live server's threads close their database connections a moment after their client's went: waited for
    here, or dropping the test database at the end of the run would wait out (and warn about) each of them."""
    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0] == 0:
                return
            time.sleep(0.05)


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children")
    with contextlib.suppress(OSError):
        return [int(child) for child in found.read_text().split()]
    return []


def _logs(world, tail: int = 4000) -> str:
    paths = sorted(world["jobs"].log_dir.glob("*.log"))
    return "\n".join(path.read_text(errors="replace")[-tail:] for path in paths)


def _lost_reply(world) -> int:
    """A refund the sandbox commits while the runtime loses the reply: an UNKNOWN call (its id)."""
    client, sandbox = world["client"], world["sandbox"]
    task = client.create_task("demo", f"faults-{next(_n)}", agent="tests", goal="refund an order")
    key = f"faults-refund-{next(_n)}"
    call = client.add_call(task.id, step=1, tool="refund.create", arguments=REFUND, idempotency_key=key)
    sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    attempt = client.admit(call.call_id, f"a-{next(_n)}")
    headers = {"Authorization": f"Bearer {SANDBOX_API_KEY_FOR_TESTS}", "Idempotency-Key": key}
    try:
        reply = requests.post(f"{sandbox.url}/refunds", json=REFUND, headers=headers, timeout=(2, 3))
        facts = facts_from_response(reply)
    except requests.RequestException as exc:
        facts = facts_from_exception(exc)
    assert client.report(call.call_id, attempt.attempt_id, facts).call_state == "UNKNOWN"
    return call.call_id


def _wait(condition, timeout_s: float, what: str, world) -> float:
    """Wait until `condition()` holds; the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"not within {timeout_s} s: {what}\n{_logs(world)}"
        time.sleep(0.05)
    return time.monotonic() - started


def _unsettled(ids: list[int]) -> int:
    return Call.objects.filter(pk__in=ids, state__in=sorted(RECONCILABLE)).count()


def _leased(ids: list[int]) -> dict[int, list[int]]:
    """The calls of `ids` under a check lease, by the pid of the work horse holding it (host:pid:thread)."""
    held = defaultdict(list)
    rows = Call.objects.filter(pk__in=ids, state__in=sorted(RECONCILABLE)).exclude(check_lease_owner="")
    for pk, owner in rows.values_list("pk", "check_lease_owner"):
        with contextlib.suppress(IndexError, ValueError):
            held[int(owner.split(":")[1])].append(pk)
    return held


def _workers_registered(url: str) -> int:
    return redis.Redis.from_url(url).scard("rq:workers")


def test_a_worker_lives_through_redis_killed_under_a_running_job_and_the_backlog_settles(world, redis_server):
    # Before: rq's monitor of the running job met a ConnectionError, the worker logged "found an unhandled exception,
    # quitting..." and the process ended: nothing checked the backlog again until someone restarted it.
    worker = world["jobs"].start()  # `runjobs`: an RQ worker and a scheduler candidate, no supervisor
    _wait(lambda: _workers_registered(redis_server.url) >= 1, 30, "the worker registered", world)

    checking = _lost_reply(world)  # its check starts at once, on the worker
    _wait(lambda: _leased([checking]), 10, "a status check running on the worker", world)
    redis_server.kill()

    # While Redis is gone: a write turns UNKNOWN (its enqueue is lost), and the running check ends.
    backlog = [checking, _lost_reply(world)]
    time.sleep(STATUS_LATENCY_S + 1.5)
    assert worker.poll() is None, _logs(world)
    assert Call.objects.get(pk=checking).state == "COMMITTED"  # what the job did while Redis was gone stands
    paused = health.readiness()[1]["jobs"]
    assert paused["state"] == "paused", paused

    redis_server.start()  # empty: every queued job and marker went with the old one
    settled_s = _wait(lambda: _unsettled(backlog) == 0, 30, "the backlog settled after Redis came back", world)

    assert worker.poll() is None, _logs(world)
    assert settled_s < 15, settled_s
    log = _logs(world, tail=10**6)
    for role in ("worker", "scheduler"):
        assert f"{role} " in log and "Redis unreachable" in log and "Redis reachable again" in log, log
    ready = health.readiness()[1]["jobs"]
    assert ready["state"] == "running" and ready["workers"] >= 1, ready
    assert {r["role"] for r in ready["reconnected"]} == {"worker", "scheduler"}, ready
    assert all(r["down_s"] > 0 for r in ready["reconnected"]), ready


def test_a_burst_of_unknown_outcomes_is_checked_at_the_runners_concurrency_through_a_killed_worker(world, redis_server):
    # Before: each UNKNOWN queued a job checking its one call, ahead of the periodic sweep: the workers checked the
    # backlog one call at a time each (40 x 1 s over two workers, then one).
    burst = 40
    with ThreadPoolExecutor(8) as pool:  # made before any worker runs: a backlog, as after workers were lost
        ids = list(pool.map(lambda _: _lost_reply(world), range(burst)))
    jobs = world["jobs"]
    workers = [jobs.start("--role", "worker") for _ in range(2)]
    jobs.start("--role", "scheduler")
    _wait(lambda: _workers_registered(redis_server.url) >= 2, 30, "two workers registered", world)
    started = time.monotonic()

    # Kill the worker whose work horse holds the most check leases, a few checks into the burst.
    _wait(lambda: _unsettled(ids) <= burst - 4 and _holding(jobs, ids), 20, "a worker mid-burst", world)
    horse, leases = max(_holding(jobs, ids).items(), key=lambda item: len(item[1]))
    held = len(leases)
    victim = jobs.holding(horse)
    jobs.kill(victim, horse)
    assert victim in workers

    _wait(lambda: _unsettled(ids) == 0, 60, "the burst settled", world)
    took_s = time.monotonic() - started
    # Every call checked IN_FLIGHT at a time, plus the killed worker's leases lapsing, plus slack for the processes.
    bound_s = burst / IN_FLIGHT * STATUS_LATENCY_S + CHECK_LEASE_S + 5
    print(f"{burst} unknown outcomes settled in {took_s:.1f} s (bound {bound_s:.1f} s); the killed worker held {held}")
    assert took_s <= bound_s, (took_s, bound_s, held)
    assert Call.objects.filter(pk__in=ids, state="COMMITTED").count() == burst
    assert world["sandbox"].ledger()["effects"] == burst  # checked, never sent again


def _holding(jobs: JobWorkers, ids: list[int]) -> dict[int, list[int]]:
    """The leases of `ids` held by a live work horse of one of `jobs`' workers, by the horse's pid."""
    return {pid: pks for pid, pks in _leased(ids).items() if jobs.holding(pid) is not None}

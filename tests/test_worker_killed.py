"""The periodic schedule survives its workers being killed mid-job (docs/reconciliation.md, docs/deploy.md), with real
`runjobs` processes on Redis, the real sandbox and the live API.

Before: two workers, 16 UNKNOWN refunds whose status query takes 4 s, kill -9 of both while their check leases were
held, one worker started again — `reconcile-due` did not run for ~80 s (the dead worker's job still "started" in
rq's registry), then every tick failed on the vanished job record, taking `sweep-sent` and `flag-no-submission`
down with it; the calls settled 151-164 s after the kill. Now every call settles within the check lease plus two
periods of the schedule (plus the time a process takes to start)."""

from __future__ import annotations

import os
import time

import pytest
from django.db.models import Q
from django.utils import timezone

from recovery.devtools.drills.stage import JobWorkers, database_url
from recovery.models import Call
from tests.conftest import missing_service
from tests.isolation import extra_redis_database, flush
from tests.test_reconcile import API_KEY, _lose_reply, _refund_call
from tests.test_reconcile import world as world  # the fixture, found by its name (re-exported)

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_S, PERIOD_S, CALLS = 5, 1, 16


def _until(condition, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def _leased(ids: list[int]) -> list[Call]:
    now = timezone.now()
    return list(Call.objects.filter(pk__in=ids, state="UNKNOWN", check_lease_until__gt=now))


@pytest.mark.postgres
def test_calls_leased_by_workers_killed_mid_check_settle_within_the_lease_and_two_periods(world, tmp_path):
    redis_url = extra_redis_database("worker-killed")
    try:
        flush(redis_url)
    except Exception as error:
        missing_service(f"needs Redis at {redis_url} ({error})")
    sandbox = world["sandbox"]
    ids = []
    for _ in range(CALLS):
        call_id, key = _refund_call(world)
        _lose_reply(world, call_id, key)  # committed at the sandbox, the reply lost: UNKNOWN, due now
        ids.append(call_id)
    sandbox.fault(route="/refunds/by-key", method="GET", kind="latency", ms=4000)  # slow status queries

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "DEBUG": "1",
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_url,
        "SANDBOX_API_KEY": API_KEY,
        "RECOVERY_CHECK_LEASE_S": str(LEASE_S),
        "RECOVERY_RECONCILE_EVERY_S": str(PERIOD_S),
        "RECOVERY_SCHEDULER_LEASE_S": "2",
        "RECOVERY_AUDIT_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "PYTHONUNBUFFERED": "1",
    }
    workers = JobWorkers(env=env, log_dir=tmp_path)
    first = [workers.start(), workers.start()]
    try:
        assert _until(lambda: len(_leased(ids)) == CALLS, timeout=60), "the workers never leased every call"
        holders = {int(call.check_lease_owner.split(":")[1]) for call in _leased(ids)}
        for worker in first:  # kill -9 mid-check: the workers, their schedulers, the work horses holding leases
            horses = [pid for pid in holders if workers.holding(pid) is worker]
            workers.kill(worker, *horses[:1])
            for horse in horses[1:]:
                workers.kill(worker, horse)
        killed_at = time.monotonic()
        sandbox.clear_faults()  # the provider answers at once from here on
        assert Call.objects.filter(pk__in=ids, state="UNKNOWN").count() == CALLS  # nothing settled before the kill

        workers.start()  # one worker (and scheduler candidate) again, as a supervisor would
        settled = _until(lambda: not Call.objects.filter(pk__in=ids).exclude(state="COMMITTED").exists(), 120)
        took = time.monotonic() - killed_at
    finally:
        workers.stop()
    logs = "\n".join(p.read_text() for p in tmp_path.glob("runjobs-*.log"))
    assert settled, logs[-3000:]
    print(f"\nworker killed mid-check: {CALLS} calls settled {took:.1f} s after the kill (lease {LEASE_S} s, period "
          f"{PERIOD_S} s)")  # fmt: skip
    # The lease and two periods, plus the few seconds a new process needs to start Django and fork a work horse.
    assert took <= LEASE_S + 2 * PERIOD_S + 4, (took, logs[-3000:])
    assert "not found in Redis" not in logs and "tick failed" not in logs
    by_key = {}
    for call in Call.objects.filter(pk__in=ids):
        by_key[call.idempotency_key] = sandbox.ledger(call.idempotency_key)["effects"]
    assert set(by_key.values()) == {1}  # one refund each: settled by receipts, never sent again
    assert not Call.objects.filter(Q(pk__in=ids), ~Q(receipts__observed="committed")).exists()

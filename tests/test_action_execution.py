"""Executing approved operator actions (docs/actions.md, docs/drills.md): once, by a worker, against the real sandbox
process.

A same-key replay carries the call's original idempotency key, goes through admission and the same classification
as any attempt, and the sandbox's ledger shows one effect; a replay that times out leaves the call UNKNOWN for a
receipt to settle, never a second replay; two workers on one request execute it once; a worker killed mid-replay
(kill -9 of a real process while the sandbox holds the reply) leaves the request to be marked interrupted, never run
again, while the call is swept to UNKNOWN and settled by a receipt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.utils import timezone
from rq.worker import SimpleWorker

from recovery.devtools.drills.stage import database_url
from recovery.jobs import queueing
from recovery.jobs import tasks as jobs
from recovery.models import ActionRequest, ActionStatus, Attempt, AuditEvent, Call, Provider
from recovery.services.actions import action_execute, actions_sweep_interrupted
from recovery.services.reconcile import reconcile_due
from recovery.services.sweeper import sweep_sent
from tests import test_action_services as base
from tests.conftest import missing_service
from tests.isolation import extra_redis_database, flush
from tests.test_action_services import API_KEY, _at_once, events, fresh

# The world of tests/test_action_services.py (the sandbox registry, the people, the held jobs), as fixtures here too.
held_jobs, world = base.held_jobs, base.world

pytestmark = pytest.mark.django_db(transaction=True)

A = ActionStatus
ROOT = django_settings.BASE_DIR


def _approved_replay(world, call: Call) -> ActionRequest:
    """A replay_same_key request approved by a second person; its execution job held."""
    req = world.approve(world.requested(call, "replay_same_key"))
    assert req.status == A.APPROVED
    return req


def _until(predicate, *, timeout: float = 15, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(step)
    raise AssertionError("timed out waiting")


def test_a_replay_carries_the_original_key_and_commits_with_one_effect(world):
    call = world.review_call()  # the provider committed the refund; the runtime never heard back
    key = call.idempotency_key
    req = _approved_replay(world, call)

    assert world.jobs.run() == 1

    req.refresh_from_db()
    call = fresh(call)
    assert (req.status, req.result["call_state"], call.state) == (A.EXECUTED, "COMMITTED", "COMMITTED")
    assert key in req.result["what"] and req.result["sent"] == "HTTP 200"
    first, replay = world.posts(key)
    assert (first["key"], first["outcome"]) == (key, "dropped_after_commit")
    assert (replay["key"], replay["status"], replay["outcome"]) == (key, 200, "replayed")
    assert world.sandbox.ledger(key)["effects"] == 1
    attempt = Attempt.objects.get(call=call, number=2)
    assert (attempt.attempt_id, attempt.evidence, attempt.http_status) == (
        f"action-{req.pk}",
        ["approval_granted"],
        200,
    )
    assert req.attempt_id == attempt.pk and req.approval_used_at is not None
    assert call.provider_ref == world.sandbox.ledger(key)["entries"][0]["provider_ref"]
    moves = AuditEvent.objects.filter(call_id=call.pk).exclude(from_state="").order_by("seq")
    assert list(moves.values_list("to_state", flat=True)) == ["SENT", "UNKNOWN", "HUMAN_REVIEW", "SENT", "COMMITTED"]
    assert events(call)[-5:] == [
        ("action.previewed", "user:reviewer"),
        ("action.requested", "user:reviewer"),
        ("action.approved", "user:approver"),
        ("action.executing", "job:actions"),
        ("action.executed", "job:actions"),
    ]
    admitted = AuditEvent.objects.get(call_id=call.pk, to_state="SENT", from_state="HUMAN_REVIEW")
    assert admitted.actor_label == "job:actions" and admitted.evidence["evidence"] == "approval_granted"


def test_a_replay_of_a_refund_lost_before_commit_makes_its_one_effect(world):
    call = world.review_call(kind="drop_before_commit")
    key = call.idempotency_key
    assert world.sandbox.ledger(key)["effects"] == 0
    _approved_replay(world, call)

    world.jobs.run()

    assert fresh(call).state == "COMMITTED"
    assert [(p["status"], p["outcome"]) for p in world.posts(key)] == [
        (None, "dropped_before_commit"),
        (200, "answered"),
    ]
    assert world.sandbox.ledger(key)["effects"] == 1


def test_a_replay_that_times_out_is_unknown_and_settled_by_a_receipt_never_replayed_again(world):
    call = world.review_call(kind="drop_before_commit")
    key = call.idempotency_key
    req = _approved_replay(world, call)
    world.sandbox.fault(route="/refunds", key=key, kind="latency", ms=3500, times=1)  # read timeout: 2 s

    world.jobs.run()

    req.refresh_from_db()
    assert req.status == A.EXECUTED and req.result["call_state"] == "UNKNOWN"
    assert req.result["sent"] == "read_timeout" and "never a second replay" in req.result["what"]
    assert fresh(call).state == "UNKNOWN"
    _until(lambda: world.sandbox.ledger(key)["effects"] == 1)  # the provider finished it after the client gave up

    reconcile_due(worker="poller")

    assert fresh(call).state == "COMMITTED"
    assert len(world.posts(key)) == 2  # the runtime's lost one and the one replay: nobody replayed after the timeout
    assert world.sandbox.ledger(key)["effects"] == 1


def test_two_workers_executing_one_request_at_once_execute_it_once(world):
    call = world.review_call(kind="drop_before_commit")
    key = call.idempotency_key
    req = _approved_replay(world, call)
    world.sandbox.fault(route="/refunds", key=key, kind="latency", ms=500, times=1)
    (job,) = world.jobs.jobs
    assert job[0] is jobs.execute_action and job[2] == f"action-execute-{req.pk}"

    results = _at_once(
        lambda: action_execute(req.pk, worker="worker-1"), lambda: action_execute(req.pk, worker="worker-2")
    )

    assert all(isinstance(r, ActionRequest) for r in results), results
    req.refresh_from_db()
    assert req.status == A.EXECUTED and req.execution_owner in ("worker-1", "worker-2")
    claims = AuditEvent.objects.filter(call_id=call.pk, action="action.executing").values_list("evidence", flat=True)
    assert [e["worker"] for e in claims if e["request"] == req.pk] == [req.execution_owner]
    assert len(world.posts(key)) == 2 and world.sandbox.ledger(key)["effects"] == 1
    assert action_execute(req.pk, worker="worker-3").status == A.EXECUTED  # a late duplicate job does nothing
    assert len(world.posts(key)) == 2


def test_an_approved_action_for_a_call_that_moved_since_fails_and_sends_nothing(world):
    call = world.review_call()
    replay = _approved_replay(world, call)
    world.jobs.jobs.clear()  # the replay's job waits...
    world.run_action(call, "mark_committed", provider_ref="re_by_hand")  # ...while another action settles the call

    action_execute(replay.pk, worker="late")

    replay.refresh_from_db()
    assert replay.status == A.FAILED and "the call changed since it was approved" in replay.result["what"]
    assert len(world.posts(call.idempotency_key)) == 1 and fresh(call).state == "COMMITTED"
    assert events(call)[-1] == ("action.failed", "job:actions")


def test_abandon_from_human_review_ends_the_call(world):
    call = world.review_call()

    req = world.run_action(call, "abandon")

    call = fresh(call)
    assert (call.state, call.outcome, req.result["call_state"]) == ("FAILED_PERMANENT", "abandoned", "FAILED_PERMANENT")
    assert world.admit(call, "approval_granted").status == 409


def test_a_worker_killed_mid_replay_leaves_it_interrupted_never_run_again_and_a_receipt_settles_the_call(world):
    Provider.objects.filter(name="sandbox").update(read_timeout_s=20)  # the worker waits for the held reply
    call = world.review_call(kind="drop_before_commit")
    key = call.idempotency_key
    req = _approved_replay(world, call)
    world.jobs.jobs.clear()  # this worker is a separate process, killed below
    world.sandbox.fault(route="/refunds", key=key, kind="latency", ms=4000, times=1)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        "SANDBOX_API_KEY": API_KEY,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)
    code = f"from recovery.services.actions import action_execute; action_execute({req.pk}, worker='doomed')"
    worker = subprocess.Popen([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env)
    try:
        _until(lambda: fresh(call).state == "SENT")  # admitted: the replay is on its way to the held reply
        time.sleep(1.0)
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()

    req.refresh_from_db()
    assert (req.status, req.execution_owner) == (A.EXECUTING, "doomed")
    assert action_execute(req.pk, worker="another").status == A.EXECUTING  # no second run, even by hand
    later = timezone.now() + timedelta(seconds=django_settings.RECOVERY_ACTION_LEASE_S + 60)
    assert actions_sweep_interrupted(now=timezone.now()) == 0  # its lease has not passed yet
    assert actions_sweep_interrupted(now=later) == 1
    req.refresh_from_db()
    assert req.status == A.INTERRUPTED and req.result["call_state"] == "SENT"
    assert events(call)[-1] == ("action.interrupted", "job:actions-sweep")
    assert action_execute(req.pk, worker="another").status == A.INTERRUPTED

    assert sweep_sent(now=later) == 1
    assert fresh(call).state == "UNKNOWN"
    _until(lambda: world.sandbox.ledger(key)["effects"] == 1, timeout=10)
    Call.objects.filter(pk=call.pk).update(next_check_at=timezone.now())  # swept "later": its first check is due now
    reconcile_due(worker="poller")

    assert fresh(call).state == "COMMITTED"
    assert len(world.posts(key)) == 2  # the runtime's lost one and the one replay
    assert world.sandbox.ledger(key)["effects"] == 1
    assert world.jobs.jobs == []


@pytest.fixture
def core_redis():
    """A Redis database of this test's own (not the one tests/settings.py gives every suite), emptied around it."""
    url = extra_redis_database("action-execution")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError as error:
        missing_service(f"needs Redis at {url} ({error}): run with REDIS_URL=redis://host:6379/0")
    flush(url)
    yield url
    flush(url)


def test_an_rq_worker_executes_the_approved_replay_once(world, core_redis, settings):
    call = world.review_call()
    settings.REDIS_URL = core_redis  # from here on, jobs go to RQ
    core_queue = queueing.get_queue()
    req = _approved_replay(world, call)
    assert world.jobs.jobs == [] and core_queue.count == 1

    SimpleWorker([core_queue], connection=core_queue.connection).work(burst=True)

    req.refresh_from_db()
    assert req.status == A.EXECUTED and fresh(call).state == "COMMITTED"
    assert world.sandbox.ledger(call.idempotency_key)["effects"] == 1
    queueing.enqueue_now(jobs.execute_action, req.pk, job_id=f"action-execute-{req.pk}")  # a duplicate job
    SimpleWorker([core_queue], connection=core_queue.connection).work(burst=True)
    assert len(world.posts(call.idempotency_key)) == 2

"""Background jobs: enqueued on commit only, once per job id, run by a real RQ worker or the in-process runner; the
periodic schedule runs at its intervals, survives failing jobs and is enqueued by one scheduler at a time.

Tests needing Redis use a database this run claimed for them (tests/isolation.py), emptied around each test, so
real queues are never touched; without Redis they skip, unless REQUIRE_SERVICES=1 makes that a failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import rq
from django.db import transaction
from django.utils import timezone
from rq.job import Job

from recovery.jobs import inprocess, queueing
from recovery.jobs.cron import PERIODIC, Scheduler
from recovery.jobs.schedule import Periodic
from recovery.models import AuditEvent, Task, TaskStatus, Tenant
from tests import jobs_for_tests
from tests.conftest import missing_service
from tests.isolation import extra_redis_database, flush

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def redis_required(settings):
    url = extra_redis_database("jobs")
    connection = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        connection.ping()
    except redis.RedisError as error:
        missing_service(f"needs Redis at {url} ({error}): run with REDIS_URL=redis://host:6379/0")
    flush(url)
    settings.REDIS_URL = url
    settings.RQ_QUEUES = {"default": {"URL": url, "DEFAULT_TIMEOUT": 60}}
    yield connection
    flush(url)


@pytest.fixture
def queue(redis_required):
    return queueing.get_queue()


@pytest.fixture
def runner(settings, monkeypatch):
    settings.REDIS_URL = None
    runner = inprocess.Runner()
    monkeypatch.setattr(inprocess, "_runner", runner)
    yield runner
    runner.stop()


@pytest.fixture
def work(queue):
    """A real RQ worker in burst mode, in this process (it forks a work horse per job, as in production)."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield lambda: rq.Worker([queue], connection=queue.connection).work(burst=True)
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.fixture
def work_unforked(queue):
    """A real RQ worker in burst mode that runs each job in this process (rq's SimpleWorker): for tests that run
    threads of their own meanwhile, since forking a work horse while another thread holds a lock (redis-py's,
    logging's) copies the lock held, and the horse hangs until rq kills it."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield lambda: rq.SimpleWorker([queue], connection=queue.connection).work(burst=True)
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.fixture(params=["in-process", "rq"])
def run_pending(request):
    """Whatever runs enqueued jobs in each mode: the in-process runner, or an RQ worker on the test database."""
    if request.param == "rq":
        return request.getfixturevalue("work")
    runner = request.getfixturevalue("runner")
    return lambda: runner.wait_idle(timeout=10)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# Enqueue on commit, once per job id --------------------------------------------------------------------------------


def test_it_enqueues_nothing_for_a_rolled_back_transaction(transactional_db, run_pending, tmp_path):
    out = tmp_path / "out.txt"
    with pytest.raises(RuntimeError), transaction.atomic():
        queueing.enqueue(jobs_for_tests.append_line, str(out), "rolled back", job_id="t-rollback")
        raise RuntimeError("roll back")
    run_pending()
    assert lines(out) == []


def test_it_enqueues_once_when_the_transaction_commits(transactional_db, run_pending, tmp_path):
    out = tmp_path / "out.txt"
    with transaction.atomic():
        # The first job is still queued (RQ) or running (in-process) when the second enqueue of its id arrives.
        queueing.enqueue(jobs_for_tests.append_slowly, str(out), "first", 0.5, job_id="t-same")
        queueing.enqueue(jobs_for_tests.append_slowly, str(out), "second", 0.5, job_id="t-same")
        queueing.enqueue(jobs_for_tests.append_line, str(out), "other", job_id="t-other")
        assert lines(out) == []  # nothing before the commit
    run_pending()
    assert sorted(lines(out)) == ["first", "other"]


def test_it_keeps_one_rq_job_per_job_id_until_it_runs(queue, work, tmp_path):
    out = tmp_path / "out.txt"
    assert queueing.enqueue_now(jobs_for_tests.append_line, str(out), "a", job_id="reconcile-call-7") is True
    assert queueing.enqueue_now(jobs_for_tests.append_line, str(out), "b", job_id="reconcile-call-7") is False
    assert queue.job_ids == ["reconcile-call-7"]

    work()
    assert lines(out) == ["a"]
    assert not Job.exists("reconcile-call-7", connection=queue.connection)  # no result kept: the id is free
    assert queueing.enqueue_now(jobs_for_tests.append_line, str(out), "c", job_id="reconcile-call-7") is True
    work()
    assert lines(out) == ["a", "c"]


def test_it_enqueues_a_job_id_again_after_its_last_run_failed(queue, work, tmp_path):
    out = tmp_path / "out.txt"
    assert queueing.enqueue_now(jobs_for_tests.fail, "provider down", job_id="reconcile-call-8")
    work()
    assert queue.failed_job_registry.get_job_ids() == ["reconcile-call-8"]

    assert queueing.enqueue_now(jobs_for_tests.append_line, str(out), "retried", job_id="reconcile-call-8") is True
    work()
    assert lines(out) == ["retried"]


def test_it_keeps_one_in_process_job_per_job_id_while_it_runs(runner, tmp_path):
    out = tmp_path / "out.txt"
    assert runner.submit(jobs_for_tests.append_slowly, (str(out), "a", 0.3), job_id="j") is True
    assert runner.submit(jobs_for_tests.append_slowly, (str(out), "b", 0.3), job_id="j") is False
    assert runner.wait_idle(timeout=10)
    assert runner.submit(jobs_for_tests.append_line, (str(out), "c"), job_id="j") is True
    assert runner.wait_idle(timeout=10)
    assert lines(out) == ["a", "c"]


# Kicks: one sweep waiting at most, and a kick during a run queues the next --------------------------------------------

KICKED = "tests.jobs_for_tests.kicked"


def test_a_kick_while_its_run_is_going_queues_the_next_run_on_rq(queue):
    # Writes turning UNKNOWN kick one reconcile sweep. A job id deduplicated while the job runs would drop the kick
    # of a call that turned UNKNOWN after the running sweep claimed its batch: the marker goes when the run starts.
    assert queueing.kick_now(KICKED, "t-kick") is True
    assert queueing.kick_now(KICKED, "t-kick") is False  # one run waits already
    (waiting,) = queue.get_jobs()
    assert waiting.id == f"t-kick-{waiting.args[1]}"

    queueing.kick_started(*waiting.args)  # what the run does first, before looking for work

    assert queueing.kick_now(KICKED, "t-kick") is True
    assert queueing.kick_now(KICKED, "t-kick") is False
    assert len(queue.get_jobs()) == 2


def test_a_kick_while_its_run_is_going_queues_the_next_run_in_process(settings, monkeypatch):
    settings.REDIS_URL = None
    runner = inprocess.Runner(threads=1)
    monkeypatch.setattr(inprocess, "_runner", runner)
    jobs_for_tests.kicked_runs.clear()
    jobs_for_tests.kicked_release.clear()
    try:
        assert queueing.kick_now(KICKED, "t-kick") is True
        deadline = time.monotonic() + 10
        while not jobs_for_tests.kicked_runs:  # the first run has started (and holds the only thread)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert queueing.kick_now(KICKED, "t-kick") is True  # queued behind it, not dropped
        assert queueing.kick_now(KICKED, "t-kick") is False  # one run waits already
    finally:
        jobs_for_tests.kicked_release.set()
        assert runner.wait_idle(timeout=10)
        runner.stop()
    assert len(jobs_for_tests.kicked_runs) == 2


# The in-process runner ---------------------------------------------------------------------------------------------


def test_it_runs_periodic_functions_repeatedly_and_survives_a_raising_job(tmp_path, caplog):
    out = tmp_path / "out.txt"
    runner = inprocess.Runner(
        [
            Periodic(name="tick", every_s=0.1, func=jobs_for_tests.append_line, args=(str(out), "tick")),
            Periodic(name="boom", every_s=0.1, func=jobs_for_tests.fail, args=("boom",)),
        ]
    )
    with caplog.at_level(logging.ERROR, logger="recovery.jobs"):
        runner.start()
        time.sleep(0.75)
        runner.stop()
    assert 4 <= len(lines(out)) <= 9
    failures = [r for r in caplog.records if r.name == "recovery.jobs" and r.getMessage() == "job boom failed"]
    assert len(failures) >= 4  # every run of the failing job was logged, and the loop kept going
    assert failures[0].exc_info[0] is RuntimeError


def test_it_skips_a_periodic_run_while_the_last_one_is_still_running(tmp_path):
    out = tmp_path / "out.txt"
    slow = Periodic(name="slow", every_s=0.05, func=jobs_for_tests.append_slowly, args=(str(out), "run", 0.4))
    runner = inprocess.Runner([slow])
    runner.start()
    time.sleep(1.0)
    runner.stop()
    assert 2 <= len(lines(out)) <= 3  # runs back to back, never 20 queued behind each other


def test_it_starts_once_and_stop_waits_for_the_running_job(tmp_path):
    out = tmp_path / "out.txt"
    runner = inprocess.Runner([])
    runner.start()
    runner.start()
    assert [t.name for t in threading.enumerate()].count("recovery-periodic") == 1
    runner.submit(jobs_for_tests.append_slowly, (str(out), "done", 0.3), job_id="slow")
    time.sleep(0.05)
    runner.stop()
    assert lines(out) == ["done"]
    assert not runner.running


def test_it_runs_every_periodic_function_once_in_a_burst(tmp_path):
    out = tmp_path / "out.txt"
    runner = inprocess.Runner(
        [
            Periodic(name="a", every_s=60, func=jobs_for_tests.append_line, args=(str(out), "a")),
            Periodic(name="b", every_s=60, func=jobs_for_tests.append_line, args=(str(out), "b")),
        ]
    )
    assert runner.run_burst(timeout=10)
    runner.stop()
    assert sorted(lines(out)) == ["a", "b"]


# The periodic schedule's own jobs ---------------------------------------------------------------------------------


def test_the_schedule_flags_open_tasks_past_their_deadline_once(transactional_db):
    tenant = Tenant.objects.create(name="acme", sandbox=True, all_tools=True)
    now = timezone.now()

    def task(name: str, deadline, status=TaskStatus.OPEN) -> Task:
        return Task.objects.create(
            tenant=tenant, external_id=name, agent="a", goal="g", deadline=deadline, status=status
        )

    late = task("late", now - timedelta(seconds=1))
    on_time = task("on-time", now + timedelta(hours=1))
    no_deadline = task("no-deadline", None)
    submitted = task("submitted", now - timedelta(seconds=1), status=TaskStatus.SUBMITTED)

    (flagging,) = [p for p in PERIODIC if p.name == "flag-no-submission"]
    assert flagging.every_s == 5  # RECOVERY_NO_SUBMISSION_EVERY_S
    for _ in range(2):  # a second run flags nothing again
        runner = inprocess.Runner(PERIODIC)
        assert runner.run_burst(timeout=30)
        runner.stop()

    flagged = {t.external_id for t in Task.objects.filter(no_submission=True)}
    assert flagged == {"late"}
    assert Task.objects.get(pk=late.pk).status == TaskStatus.OPEN  # flagged, not closed: the runtime may still submit
    events = AuditEvent.objects.filter(action="task.no_submission")
    assert [(e.task_id, e.actor_label) for e in events] == [(late.pk, "job:no-submission")]
    assert {on_time.pk, no_deadline.pk, submitted.pk}.isdisjoint(e.task_id for e in events)


# The RQ scheduler --------------------------------------------------------------------------------------------------


def test_it_lets_only_one_of_two_schedulers_enqueue(queue, work, tmp_path):
    out = tmp_path / "out.txt"
    periodic = [Periodic(name="tick", every_s=0.2, func=jobs_for_tests.append_line, args=(str(out), "tick"))]
    first, second = Scheduler(queue, periodic, name="first"), Scheduler(queue, periodic, name="second")

    assert first.tick() == ["tick"]
    assert second.tick() == []
    assert (first.is_leader, second.is_leader) == (True, False)
    time.sleep(0.25)
    assert first.tick() == []  # due again, but the last run is still queued: no backlog of duplicates
    (queued,) = queue.job_ids
    assert queued.startswith("tick-")  # each run has an id of its own; the marker keeps it to one pending

    first.release()  # the leader stops: the standby takes over at its next tick
    assert second.tick() == []  # still the same queued run
    assert second.is_leader
    work()
    time.sleep(0.25)
    assert second.tick() == ["tick"]
    assert first.tick() == []
    work()
    assert lines(out) == ["tick", "tick"]


def test_it_enqueues_from_one_scheduler_when_two_run_at_once(queue, work_unforked, tmp_path):
    work = work_unforked  # the schedulers' threads run while it works
    out = tmp_path / "out.txt"
    periodic = [Periodic(name="tick", every_s=0.1, func=jobs_for_tests.append_line, args=(str(out), "tick"))]
    schedulers = [Scheduler(queue, periodic, name=name) for name in ("a", "b")]
    for scheduler in schedulers:
        scheduler.TICK_S = 0.02
    stop = threading.Event()
    threads = [threading.Thread(target=s.run, args=(stop,)) for s in schedulers]
    for thread in threads:
        thread.start()
    for _ in range(4):
        time.sleep(0.2)
        work()
    stop.set()
    for thread in threads:
        thread.join(5)
    work()  # a run enqueued after the last burst
    enqueued = sorted(s.enqueued for s in schedulers)
    assert enqueued[0] == 0 and enqueued[1] >= 3
    assert len(lines(out)) == enqueued[1]
    assert not queue.connection.exists(Scheduler.LOCK_KEY)  # released on stop


# runjobs --burst, in both modes ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def var_dir(tmp_path_factory):
    """A migrated embedded database for the command's periodic jobs to work on."""
    path = tmp_path_factory.mktemp("var")
    result = _manage("migrate", var_dir=path)
    assert result.returncode == 0, result.stderr
    return path


def _manage(*args: str, var_dir: Path, redis_url: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "REDIS_URL"}}
    env.update(DEBUG="1", RECOVERY_VAR_DIR=str(var_dir))
    if redis_url:
        env["REDIS_URL"] = redis_url
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_it_runs_runjobs_burst_in_process(var_dir):
    result = _manage("runjobs", "--burst", var_dir=var_dir)
    assert result.returncode == 0, result.stderr
    assert "jobs: in-process (no REDIS_URL)" in result.stdout
    assert (
        "reconcile-due every 2 s, sweep-sent every 5 s, metrics-fold every 10 s, flag-no-submission every 5 s, "
        "notifications every 5 s, retention every 3600 s, audit-checkpoint every 60 s (once: burst)"
    ) in result.stdout
    assert "failed" not in result.stderr


def test_it_runs_runjobs_burst_on_rq(queue, var_dir, tmp_path, settings):
    out = tmp_path / "out.txt"
    assert queueing.enqueue_now(jobs_for_tests.append_line, str(out), "queued before", job_id="t-before")
    result = _manage("runjobs", "--burst", var_dir=var_dir, redis_url=settings.REDIS_URL)
    assert result.returncode == 0, result.stderr
    assert f"jobs: RQ worker on queue 'default' at {settings.REDIS_URL}" in result.stdout
    assert lines(out) == ["queued before"]
    # The periodic jobs ran too, and successfully: nothing is left queued or failed.
    assert queue.count == 0
    assert queue.failed_job_registry.count == 0


def test_runjobs_roles_need_redis(var_dir):
    result = _manage("runjobs", "--role", "scheduler", var_dir=var_dir)
    assert result.returncode != 0 and "--role scheduler needs REDIS_URL" in result.stderr


def _spawn(*args: str, var_dir: Path, redis_url: str, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(DEBUG="1", RECOVERY_VAR_DIR=str(var_dir), REDIS_URL=redis_url, RECOVERY_SCHEDULER_LEASE_S="2")
    with open(log, "a") as out:
        # A session of its own: killing "the worker" kills its process tree (rq's scheduler process and work horses
        # are its children), as losing its machine would; none is left behind to write to the run's Redis database.
        return subprocess.Popen(
            [sys.executable, "manage.py", "runjobs", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill9(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def _holder_pid(queue, wait_s: float) -> int | None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        holder = queue.connection.get(Scheduler.LOCK_KEY)
        if holder:
            return int(holder.decode().split(":")[1])
        time.sleep(0.1)
    return None


def test_scheduler_candidates_and_workers_run_apart_and_a_standby_takes_over_within_the_lease(
    queue, var_dir, tmp_path, settings
):
    log = tmp_path / "runjobs.log"
    candidates = [_spawn("--role", "scheduler", var_dir=var_dir, redis_url=settings.REDIS_URL, log=log) for _ in "ab"]
    worker = _spawn("--role", "worker", var_dir=var_dir, redis_url=settings.REDIS_URL, log=log)
    processes = [*candidates, worker]
    try:
        holder = _holder_pid(queue, 60)
        assert holder in {c.pid for c in candidates}, log.read_text()[-2000:]
        # The periodic jobs reach the worker: the holder enqueues them, the worker (no scheduler of its own) runs them.
        deadline = time.monotonic() + 60
        while "Successfully completed recovery.jobs.tasks.metrics_fold()" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)

        _kill9(next(c for c in candidates if c.pid == holder))  # the holder dies without releasing its lock
        killed_at = time.monotonic()
        standby = next(c for c in candidates if c.pid != holder)
        while _holder_pid(queue, 0.2) != standby.pid and time.monotonic() - killed_at < 10:
            pass
        took_over_s = time.monotonic() - killed_at
        assert _holder_pid(queue, 0.2) == standby.pid and took_over_s <= 2 + 1, (took_over_s, log.read_text()[-2000:])
        assert worker.poll() is None  # killing the scheduler holder did not stop the worker

        _kill9(worker)  # nor the reverse
        time.sleep(2.5)  # longer than the lease: the holder kept renewing it
        assert standby.poll() is None and _holder_pid(queue, 0.2) == standby.pid
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                _kill9(process)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # whatever of its tree outlived it


# Periodic runs that nothing can block ------------------------------------------------------------------------------


def test_a_periodic_job_that_cannot_be_enqueued_never_costs_the_others_their_run(queue, work, tmp_path, caplog):
    # One failing enqueue aborted the whole tick: sweep-sent and flag-no-submission stopped with reconcile-due.
    out = tmp_path / "out.txt"
    periodic = [
        Periodic(name="broken", every_s=60, func=jobs_for_tests.append_line, args=(threading.Lock(), "x")),
        Periodic(name="fine", every_s=60, func=jobs_for_tests.append_line, args=(str(out), "fine")),
    ]
    with caplog.at_level(logging.ERROR, logger="recovery.jobs"):
        assert Scheduler(queue, periodic, name="s").tick() == ["fine"]
    assert any("could not enqueue periodic job broken" in r.getMessage() for r in caplog.records)
    work()
    assert lines(out) == ["fine"]


def test_a_periodic_run_lost_with_its_records_runs_again_within_its_period_and_the_lease(
    queue, work, tmp_path, settings
):
    settings.RECOVERY_CHECK_LEASE_S = 1
    out = tmp_path / "out.txt"
    periodic = [Periodic(name="tick", every_s=0.2, func=jobs_for_tests.append_line, args=(str(out), "tick"))]
    scheduler = Scheduler(queue, periodic, name="s")
    assert scheduler.tick() == ["tick"]

    queue.empty()  # the queued run vanished (a Redis that lost it, a job nobody will ever run)
    time.sleep(0.25)
    assert scheduler.tick() == []  # its marker still stands: a run may yet be going on somewhere
    time.sleep(1.0)  # the period plus the lease (1 s here) have passed since it was enqueued
    assert scheduler.tick() == ["tick"]
    work()
    assert lines(out) == ["tick"]

    flush(settings.REDIS_URL)  # a Redis restarted empty: markers, jobs and registries gone
    time.sleep(0.25)
    assert scheduler.tick() == ["tick"]  # at once, no record stands in the way
    work()
    assert lines(out) == ["tick", "tick"]


def test_a_periodic_run_that_ended_frees_its_name_at_once_even_when_it_failed(queue, work, tmp_path):
    periodic = [Periodic(name="failing", every_s=0.1, func=jobs_for_tests.fail, args=("down",))]
    scheduler = Scheduler(queue, periodic, name="s")
    assert scheduler.tick() == ["failing"]
    work()  # fails; its failure callback removes the marker
    time.sleep(0.15)
    assert scheduler.tick() == ["failing"]
    assert queue.connection.exists("recovery:cron:pending:failing")


def test_only_the_scheduler_holding_the_lock_writes_audit_checkpoints(queue, transactional_db, settings, tmp_path):
    settings.RECOVERY_AUDIT_CHECKPOINT_DIR = tmp_path / "checkpoints"
    Tenant.objects.create(name="acme", sandbox=True, all_tools=True)
    with transaction.atomic():
        from recovery.audit.chain import Actor, append_event
        from recovery.audit.checkpoints import trail_directory

        append_event(action="test.event", actor=Actor.job("tests"), reason="one event to anchor")
    (checkpoint,) = [p for p in PERIODIC if p.name == "audit-checkpoint"]
    assert checkpoint.in_scheduler and checkpoint.every_s == 60  # RECOVERY_AUDIT_CHECKPOINT_S
    holder, standby = Scheduler(queue, [checkpoint], name="holder"), Scheduler(queue, [checkpoint], name="standby")
    assert holder.tick() == ["audit-checkpoint"] and standby.tick() == []
    holder.wait_here(30)
    assert len(list(trail_directory(tmp_path / "checkpoints").glob("checkpoint-*.json"))) == 1
    assert queue.count == 0  # run by the holder itself, never handed to a worker on another machine

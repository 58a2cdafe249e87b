"""The one way to enqueue a background job: on commit, at most once per job id, on RQ with REDIS_URL and on the
in-process runner without it (docs/deploy.md, "Jobs and the schedule"). Services name their jobs by dotted path
(recovery.jobs imports the services); every job must be idempotent.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import django_rq
import redis
from django.conf import settings
from django.db import transaction
from django.utils.module_loading import import_string
from rq.exceptions import DuplicateJobError, InvalidJobOperation, NoSuchJobError
from rq.job import Callback, Job, JobStatus
from rq.queue import Queue

from recovery.jobs import inprocess

logger = logging.getLogger("recovery.jobs")

Func = Callable[..., Any] | str  # a job function, or its dotted path

# Results of successful jobs are not kept (every job's effects are in the database), so a finished job frees its
# id at once; a failed one stays in django-rq's failed registry for a week, until the same id is enqueued again.
RESULT_TTL_S = 0
FAILURE_TTL_S = 7 * 24 * 3600
_DONE = {JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED}


def worker_name() -> str:
    """Who holds a check lease: host, process and thread, so a lease names the exact worker that took it."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


# Enqueueing --------------------------------------------------------------------------------------------------------


def enqueue(func: Func, *args: Any, job_id: str) -> None:
    """Run `func(*args)` in the background once the current transaction commits (at once outside a transaction).

    A second enqueue of the same `job_id` while the first is still queued or running adds nothing. An enqueue that
    fails after the commit (Redis down) is logged, not raised: the data is committed and the request succeeded, and
    the periodic schedule picks up due work on its next run anyway.
    """

    def send() -> None:
        try:
            enqueue_now(func, *args, job_id=job_id)
        except Exception:
            logger.exception("could not enqueue job %s (%s)", job_id, _func_name(func))

    transaction.on_commit(send)


def enqueue_now(func: Func, *args: Any, job_id: str) -> bool:
    """Enqueue without waiting for a commit; True when a job was added, False when one with that id is pending."""
    if settings.REDIS_URL:
        return rq_enqueue(get_queue(), func, args, job_id=job_id)  # a path is resolved by the worker that runs it
    return inprocess.get_runner().submit(import_string(func) if isinstance(func, str) else func, args, job_id=job_id)


def get_queue() -> Queue:
    """django-rq's "default" queue on a connection kept per process (a new one per enqueue would be a new pool)."""
    return django_rq.get_queue("default", connection=_redis(settings.REDIS_URL), commit_mode="auto")


def rq_enqueue(queue: Queue, func: Func, args: tuple = (), *, job_id: str) -> bool:
    """Add a job unless one with this id is queued, scheduled or running; True when added.

    rq's `unique=True` checks and saves atomically (a Lua script), so two racing enqueuers add one job. A job that
    is done but still stored (a failure kept for inspection) is deleted and the enqueue retried once.
    """
    for _ in range(2):
        try:
            queue.enqueue_call(
                func, args=args, job_id=job_id, result_ttl=RESULT_TTL_S, failure_ttl=FAILURE_TTL_S, unique=True
            )
            return True
        except DuplicateJobError:
            if not _clear_if_done(queue, job_id):
                return False
    return False


def _clear_if_done(queue: Queue, job_id: str) -> bool:
    """Delete the stored job `job_id` if it is no longer pending; True when the id is free again."""
    try:
        job = queue.job_class.fetch(job_id, connection=queue.connection, serializer=queue.serializer)
        status = job.get_status(refresh=False)
        if status == JobStatus.STARTED:
            # A worker killed mid-job leaves its job STARTED until a worker's maintenance (every few minutes) fails
            # it; its heartbeat has lapsed long before. Failing such jobs here keeps an id from being blocked by a
            # dead worker. cleanup() only touches executions whose heartbeat expired.
            queue.started_job_registry.cleanup()
            status = job.get_status()
    except (NoSuchJobError, InvalidJobOperation):
        return True  # finished and deleted in the meantime
    except ValueError:
        # rq's records of a dead worker's execution can vanish under it ("Execution ... not found in Redis"):
        # nothing runs this job any more.
        status = JobStatus.FAILED
    if status not in _DONE:
        return False
    if status == JobStatus.FAILED:
        logger.info("job %s failed last time; enqueueing it again", job_id)
    # Two enqueuers clearing the same finished job at once may each add one: at worst one extra idempotent run.
    try:
        job.delete()
    except ValueError:  # the same vanished execution: drop the job's own record, which is what holds the id
        queue.connection.delete(job.key)
    return True


# Kicks --------------------------------------------------------------------------------------------------------------

# A kick asks for one run of a sweep soon (the reconcile sweep, when a write turns UNKNOWN): however many kicks
# arrive, at most one run waits to start. Its marker is set when the run is enqueued and removed when the run starts
# (kick_started), before the run claims its work: a kick arriving while a run is going queues the next run instead of
# being dropped as a duplicate of it. The marker expires after the check lease, so a run lost with Redis (or with a
# stopped in-process runner) holds later kicks back no longer than that; the periodic sweep runs meanwhile.
_KICK = "recovery:kick:{name}"
# In-process markers, per runner (a test's stand-in runner starts with none): name -> (token, expiry).
_kicks: weakref.WeakKeyDictionary[Any, dict[str, tuple[str, float]]] = weakref.WeakKeyDictionary()
_kicks_lock = threading.Lock()


def kick(func: str, name: str) -> None:
    """Once the current transaction commits, enqueue one run of `func(name, token)` unless one is waiting to start;
    a failure to enqueue is logged, as enqueue()'s is."""

    def send() -> None:
        try:
            kick_now(func, name)
        except Exception:
            logger.exception("could not enqueue a run of %s (%s)", name, func)

    transaction.on_commit(send)


def kick_now(func: str, name: str) -> bool:
    """Enqueue a run of `func(name, token)` (job id `<name>-<token>`) unless one is waiting to start; True when
    added. `func` must call kick_started(name, token) before it looks for work."""
    token = uuid.uuid4().hex[:12]
    ttl_s = settings.RECOVERY_CHECK_LEASE_S
    if settings.REDIS_URL:
        queue = get_queue()
        key = _KICK.format(name=name)
        if not queue.connection.set(key, token, nx=True, px=ttl_s * 1000):
            return False
        try:
            queue.enqueue_call(
                func, args=(name, token), job_id=f"{name}-{token}", result_ttl=RESULT_TTL_S, failure_ttl=FAILURE_TTL_S
            )
        except Exception:
            queue.connection.eval(_RELEASE_MARKER, 1, key, token)
            raise
        return True
    runner = inprocess.get_runner()
    with _kicks_lock:
        markers = _kicks.setdefault(runner, {})
        waiting = markers.get(name)
        if waiting is not None and waiting[1] > time.monotonic():
            return False
        markers[name] = (token, time.monotonic() + ttl_s)
    try:
        return runner.submit(import_string(func), (name, token), job_id=f"{name}-{token}")
    except Exception:
        kick_started(name, token)
        raise


def kick_started(name: str, token: str) -> None:
    """A kicked run starts: from now on a kick enqueues the next run (the marker is removed if it is this run's)."""
    if settings.REDIS_URL:
        get_queue().connection.eval(_RELEASE_MARKER, 1, _KICK.format(name=name), token)
        return
    with _kicks_lock:
        markers = _kicks.get(inprocess.get_runner(), {})
        if markers.get(name, ("",))[0] == token:
            del markers[name]


# Periodic runs ------------------------------------------------------------------------------------------------------

# Whether a run of a periodic job is pending is a marker of ours, not rq's registries: rq learns that a worker died
# only when another worker's maintenance notices (minutes), and a job record can vanish with Redis. The marker is
# set (SET NX) when a run is enqueued, removed when the run ends (its success or failure callback), and expires on
# its own after the job's period plus the check lease — the longest a dead worker's run can block the next one.
_PENDING = "recovery:cron:pending:{name}"
_RELEASE_MARKER = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


def periodic_marker_ttl_ms(every_s: float) -> int:
    return int((every_s + settings.RECOVERY_CHECK_LEASE_S) * 1000)


def enqueue_periodic(queue: Queue, name: str, func: Callable[..., Any], args: tuple, *, every_s: float) -> bool:
    """Enqueue one run of the periodic job `name` unless one is pending (queued, or running on a live worker, or
    less than its marker's lifetime ago on a dead one); True when a run was added. Each run has an id of its own
    (`<name>-<token>`), so no record of an earlier run — finished, failed, or lost with a worker — stands in the way.
    """
    token = uuid.uuid4().hex[:12]
    key = _PENDING.format(name=name)
    if not queue.connection.set(key, token, nx=True, px=periodic_marker_ttl_ms(every_s)):
        return False
    try:
        queue.enqueue_call(
            func,
            args=args,
            job_id=f"{name}-{token}",
            result_ttl=RESULT_TTL_S,
            failure_ttl=FAILURE_TTL_S,
            meta={"periodic": name, "marker": token},
            on_success=Callback(_periodic_ended),
            on_failure=Callback(_periodic_failed),
        )
    except Exception:
        release_periodic_marker(queue.connection, name, token)
        raise
    return True


def release_periodic_marker(connection: redis.Redis, name: str, token: str) -> None:
    connection.eval(_RELEASE_MARKER, 1, _PENDING.format(name=name), token)


def _periodic_ended(job: Job, connection: redis.Redis, result: Any, *args: Any, **kwargs: Any) -> None:
    release_periodic_marker(connection, job.meta["periodic"], job.meta["marker"])


def _periodic_failed(job: Job, connection: redis.Redis, *exc_info: Any, **kwargs: Any) -> None:
    logger.error("periodic job %s failed (run %s)", job.meta.get("periodic"), job.id)
    release_periodic_marker(connection, job.meta["periodic"], job.meta["marker"])


_connections: dict[tuple[int, str], redis.Redis] = {}


def _redis(url: str) -> redis.Redis:
    # Keyed by pid too: a forked worker must not share its parent's sockets.
    key = (os.getpid(), url)
    connection = _connections.get(key)
    if connection is None:
        # Bounded timeouts: an enqueue runs after a request's commit, and an unreachable Redis must not hang it.
        connection = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10, health_check_interval=30)
        _connections[key] = connection
    return connection


def _func_name(func: Func) -> str:
    return func if isinstance(func, str) else f"{func.__module__}.{func.__qualname__}"

"""The RQ worker of `manage.py runjobs`, made to outlive Redis (docs/deploy.md, "Jobs and the schedule").

rq's own worker retries Redis only while it waits for a job: a Redis error while a job runs (the heartbeats of
`monitor_work_horse`), in its maintenance or in its teardown ends `work()` ("found an unhandled exception,
quitting..."), and without a supervisor nothing starts it again. Here the running job goes on (its database writes
commit on their own; its check lease lapses as designed), the worker waits for Redis with capped backoff, and a
fresh worker takes over once Redis answers; rq's maintenance then fails the old execution whose heartbeat lapsed,
and the periodic jobs pick up whatever is due.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable

from rq.exceptions import StopRequested
from rq.worker import Worker

from recovery.jobs.outages import REDIS_ERRORS, Backoff, Outage
from recovery.statemachine import watch as call_watch

logger = logging.getLogger("recovery.jobs")


class RecoveryWorker(Worker):
    """rq's forking worker, telling a Redis loss apart from the rest: `outage` records it, and the heartbeats that
    a running job's monitor sends no longer end the worker when Redis is gone."""

    max_connection_wait_time = 10.0  # rq's own retries while dequeueing: the same cap as ours
    outage: Outage | None = None
    stop: threading.Event | None = None

    def _lost(self, exc: BaseException, what: str) -> None:
        if self.outage is not None:
            self.outage.lost(exc, what)

    def _answered(self) -> None:
        if self.outage is not None and self.outage.ongoing:
            self.outage.back(self.connection)

    def perform_job(self, *args, **kwargs):
        try:
            return super().perform_job(*args, **kwargs)
        finally:
            # The work horse ends with os._exit: the word of the calls its job moved goes out first (long polls).
            call_watch.flush()

    def heartbeat(self, timeout=None, pipeline=None):
        if pipeline is not None:  # queued on a pipeline: nothing is sent yet
            return super().heartbeat(timeout, pipeline)
        try:
            super().heartbeat(timeout, pipeline)
        except REDIS_ERRORS as exc:
            self._lost(exc, "no job is dequeued meanwhile")
            raise
        self._answered()

    def maintain_heartbeats(self, job, execution):
        try:
            super().maintain_heartbeats(job, execution)
        except REDIS_ERRORS as exc:
            # The work horse goes on: what it writes to the database commits on its own.
            self._lost(exc, f"job {job.id} goes on running")
            return
        self._answered()

    def execute_job(self, job, queue):
        try:
            super().execute_job(job, queue)
        except REDIS_ERRORS as exc:
            self._lost(exc, f"job {job.id} ended without rq's records of it")
            raise

    def run_maintenance_tasks(self):
        try:
            super().run_maintenance_tasks()
        except REDIS_ERRORS as exc:
            self._lost(exc, "maintenance waits")
            raise

    def check_for_suspension(self, burst):
        try:
            super().check_for_suspension(burst)
        except REDIS_ERRORS as exc:
            self._lost(exc, "no job is dequeued meanwhile")
            raise

    def request_stop(self, signum, frame):
        if self.stop is not None:
            self.stop.set()
        try:
            super().request_stop(signum, frame)
        except REDIS_ERRORS:
            # rq asks Redis whether a job runs; without it, the horse tells: a running job finishes first.
            if not self.horse_pid:
                raise StopRequested() from None
            self._stop_requested = True


def run_worker(make_worker: Callable[[], RecoveryWorker], *, burst: bool = False) -> None:
    """Run workers from `make_worker` until one stops on request (SIGTERM, SIGINT) or, with `burst`, ends its
    burst: a worker that ends on a Redis error (or on any other error, which rq only logs) is followed by a fresh one
    once Redis answers."""
    stop = threading.Event()
    backoff = Backoff()
    outage: Outage | None = None
    while True:
        worker = make_worker()
        if outage is None:
            outage = Outage(worker.name, role="worker")
        worker.outage, worker.stop = outage, stop
        failure: BaseException | None = None
        try:
            worker.work(burst=burst, with_scheduler=True)
        except REDIS_ERRORS as exc:  # its teardown (registering its death) when Redis is gone
            failure = exc
            outage.lost(exc, "the worker stopped")
        finally:
            _unsubscribe(worker)
        # Until the next worker installs rq's handlers: a stop request ends the wait (rq's would ask Redis).
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        if stop.is_set() or worker._stop_requested:
            return
        if not outage.ongoing:
            if burst and failure is None:
                return
            # rq ended work() on something it only logged ("found an unhandled exception"): a fresh worker, as a
            # supervisor would start, after a pause.
            logger.error("worker %s stopped on an error (above); a fresh one starts", worker.name)
            stop.wait(backoff.next())
        elif not outage.wait_for_redis(worker.connection, stop, backoff):
            return
        else:
            outage.back(worker.connection)
            backoff.reset()
        if stop.is_set():
            return


def _unsubscribe(worker: Worker) -> None:
    """Stop the worker's command channel thread, which rq's teardown leaves running when Redis failed under it."""
    thread = worker.pubsub_thread
    if thread is None or not thread.is_alive():
        return
    thread.stop()
    thread.join(timeout=1)
    with contextlib.suppress(Exception):  # closing a connection to a Redis that is gone
        worker.pubsub.close()

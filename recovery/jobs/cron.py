"""The periodic schedule, as data, and the scheduler that enqueues it on RQ: only the candidate holding the Redis lock
enqueues, and a periodic job has at most one run pending (docs/deploy.md, "Jobs and the schedule"). Without Redis the
in-process runner (recovery/jobs/inprocess.py) runs PERIODIC itself.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence

from django.conf import settings
from django.db import connections
from rq.queue import Queue

from recovery.jobs import queueing
from recovery.jobs import tasks as jobs
from recovery.jobs.outages import REDIS_ERRORS, Backoff, Outage
from recovery.jobs.schedule import Periodic

logger = logging.getLogger("recovery.jobs")


PERIODIC: list[Periodic] = [
    Periodic(name="actions-due", every_s=settings.RECOVERY_ACTIONS_EVERY_S, func=jobs.actions_due),
    Periodic(name="reconcile-due", every_s=settings.RECOVERY_RECONCILE_EVERY_S, func=jobs.reconcile_due),
    Periodic(name="sweep-sent", every_s=settings.RECOVERY_SWEEP_EVERY_S, func=jobs.sweep_sent),
    Periodic(name="metrics-fold", every_s=settings.RECOVERY_METRICS_FOLD_EVERY_S, func=jobs.metrics_fold),
    Periodic(name="flag-no-submission", every_s=settings.RECOVERY_NO_SUBMISSION_EVERY_S, func=jobs.flag_no_submission),
    Periodic(name="notifications", every_s=settings.RECOVERY_NOTIFY_EVERY_S, func=jobs.notifications_due),
    Periodic(name="retention", every_s=settings.RECOVERY_RETENTION_EVERY_S, func=jobs.prune_settled_history),
    Periodic(
        name="audit-checkpoint",
        every_s=settings.RECOVERY_AUDIT_CHECKPOINT_S,
        func=jobs.audit_checkpoint,
        in_scheduler=True,
    ),
]


# Take the lock if it is free, or extend it if it is ours: one round trip, so a lease cannot lapse between the two.
_ACQUIRE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 1
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 1
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class Scheduler:
    """Enqueues `periodic` on `queue` at their intervals while it holds the scheduler lock."""

    LOCK_KEY = "recovery:cron:scheduler"
    TICK_S = 0.5

    def __init__(
        self,
        queue: Queue,
        periodic: Sequence[Periodic] = PERIODIC,
        *,
        name: str | None = None,
        lock_ttl_ms: int | None = None,
    ) -> None:
        self.queue = queue
        self.periodic = list(periodic)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lock_ttl_ms = lock_ttl_ms or settings.RECOVERY_SCHEDULER_LEASE_S * 1000
        self.is_leader = False
        self._here: dict[str, threading.Thread] = {}  # the in_scheduler runs going on
        self.enqueued = 0  # runs this scheduler added (not counting ones deduplicated away)
        self._next_due = {p.name: 0.0 for p in self.periodic}
        self._acquire = queue.connection.register_script(_ACQUIRE)
        self._release = queue.connection.register_script(_RELEASE)

    def tick(self) -> list[str]:
        """Take or keep the lock, then enqueue what is due; returns the names enqueued."""
        was_leader = self.is_leader
        self.is_leader = bool(self._acquire(keys=[self.LOCK_KEY], args=[self.name, self.lock_ttl_ms]))
        if self.is_leader != was_leader:
            logger.info("scheduler %s %s", self.name, "leads" if self.is_leader else "stands by")
        if not self.is_leader:
            return []
        enqueued = []
        now = time.monotonic()
        for periodic in self.periodic:
            if now < self._next_due[periodic.name]:
                continue
            self._next_due[periodic.name] = now + periodic.every_s
            if periodic.in_scheduler:
                if self._run_here(periodic):
                    enqueued.append(periodic.name)
                continue
            try:
                if queueing.enqueue_periodic(
                    self.queue, periodic.name, periodic.func, periodic.args, every_s=periodic.every_s
                ):
                    enqueued.append(periodic.name)
            except Exception:
                # One job that cannot be enqueued never costs the others their run: each is tried in its turn.
                logger.exception("scheduler %s: could not enqueue periodic job %s", self.name, periodic.name)
        self.enqueued += len(enqueued)
        return enqueued

    def _run_here(self, periodic: Periodic) -> bool:
        """Start an in_scheduler run on a thread unless the last one is still going (the tick must keep renewing
        the lock meanwhile); True when started."""
        running = self._here.get(periodic.name)
        if running is not None and running.is_alive():
            return False
        thread = threading.Thread(target=_here_main, args=(periodic,), name=f"scheduler-{periodic.name}")
        self._here[periodic.name] = thread
        thread.start()
        return True

    def wait_here(self, timeout: float | None = None) -> None:
        """Wait for the in_scheduler runs started so far (`runjobs --burst`, a stopping scheduler)."""
        for thread in list(self._here.values()):
            thread.join(timeout)

    def run(self, stop: threading.Event) -> None:
        """Tick until `stop` is set. Losing Redis is never fatal: the candidate stands by, retries with capped
        backoff, and says when Redis answers again (recovery.jobs.outages); other errors are logged and retried."""
        outage = Outage(self.name, role="scheduler")
        backoff = Backoff(first=0.5, cap=min(5.0, self.lock_ttl_ms / 1000))
        try:
            while not stop.is_set():
                try:
                    self.tick()
                except Exception as exc:
                    # A lost lease must not leave us enqueueing next to a new leader after Redis comes back.
                    self.is_leader = False
                    if isinstance(exc, REDIS_ERRORS):
                        outage.lost(exc, "it stands by")
                    else:
                        logger.exception("scheduler %s: tick failed; retrying", self.name)
                    stop.wait(backoff.next())
                    continue
                if outage.ongoing:
                    outage.back(self.queue.connection)
                backoff.reset()
                stop.wait(self.TICK_S)
        finally:
            self.release()
            self.wait_here(30)

    def release(self) -> None:
        """Give the lock up (if ours) so a standby takes over at once instead of after its expiry."""
        try:
            self._release(keys=[self.LOCK_KEY], args=[self.name])
        except Exception:
            logger.exception("scheduler %s: could not release the lock; it expires on its own", self.name)
        self.is_leader = False


def _here_main(periodic: Periodic) -> None:
    try:
        periodic.func(*periodic.args)
    except Exception:
        logger.exception("periodic job %s failed (in the scheduler)", periodic.name)
    finally:
        connections.close_all()  # this thread's own connection, which nothing else would close

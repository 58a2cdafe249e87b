"""The embedded default's background jobs, without Redis: a thread runs the periodic schedule, a small thread pool
runs enqueued jobs.

`manage.py run` starts the process-wide runner (get_runner()) next to runserver; `manage.py runjobs` without
REDIS_URL runs it in the foreground. Enqueued jobs run in the process that enqueued them (the pool starts on the
first one, started runner or not); pending ids deduplicate enqueues exactly as job ids do on RQ.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections, connections

from recovery.jobs.schedule import Periodic

logger = logging.getLogger("recovery.jobs")

THREADS = 4


class Runner:
    def __init__(self, periodic: Sequence[Periodic] = (), *, threads: int = THREADS) -> None:
        self.periodic = list(periodic)
        self.threads = threads
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending: set[str] = set()  # ids queued or running
        self._pool: ThreadPoolExecutor | None = None
        self._loop: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        return self._loop is not None and self._loop.is_alive()

    def submit(self, func: Callable[..., Any], args: tuple = (), *, job_id: str) -> bool:
        """Run `func(*args)` on the pool unless a job with `job_id` is queued or running; True when added."""
        with self._lock:
            if job_id in self._pending:
                return False
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="recovery-job")
            self._pending.add(job_id)
            try:
                self._pool.submit(self._run, func, args, job_id)
            except RuntimeError:  # the interpreter is shutting down
                self._pending.discard(job_id)
                raise
        return True

    def start(self) -> None:
        """Start the periodic loop (a daemon thread); a second start() while it runs does nothing."""
        with self._lock:
            if self.running:
                return
            self._stop.clear()
            self._loop = threading.Thread(target=self._periodic_loop, name="recovery-periodic", daemon=True)
            self._loop.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the periodic loop, drop queued jobs, and wait for the running ones to finish."""
        self._stop.set()
        loop = self._loop
        if loop is not None:
            loop.join(timeout)
        with self._lock:
            pool, self._pool, self._loop = self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._pending.clear()  # cancelled jobs never reached their finally
            self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no job is queued or running (jobs they enqueue included); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def run_burst(self, timeout: float | None = None) -> bool:
        """Run each periodic function once, then every job pending, and return (`runjobs --burst`)."""
        for periodic in self.periodic:
            self.submit(periodic.func, periodic.args, job_id=periodic.name)
        return self.wait_idle(timeout)

    def _run(self, func: Callable[..., Any], args: tuple, job_id: str) -> None:
        # Connections are per thread: drop one left broken or past its age by this thread's previous job.
        close_old_connections()
        try:
            func(*args)
        except Exception:
            logger.exception("job %s failed", job_id)
        finally:
            # Pool threads can sit idle for long; an open connection would hold a server slot (and keep a test
            # database from being dropped), so each job leaves none behind.
            connections.close_all()
            with self._lock:
                self._pending.discard(job_id)
                if not self._pending:
                    self._idle.notify_all()

    def _periodic_loop(self) -> None:
        next_due = {p.name: 0.0 for p in self.periodic}
        while not self._stop.is_set():
            now = time.monotonic()
            for periodic in self.periodic:
                if now < next_due[periodic.name]:
                    continue
                next_due[periodic.name] = now + periodic.every_s
                try:
                    # Still pending from the last interval: skipped, so a slow run never stacks up behind itself.
                    self.submit(periodic.func, periodic.args, job_id=periodic.name)
                except Exception:
                    logger.exception("could not start periodic job %s", periodic.name)
            wait = min(next_due.values(), default=now + 1.0) - time.monotonic()
            self._stop.wait(max(wait, 0.01))


_runner: Runner | None = None
_runner_lock = threading.Lock()


def get_runner(periodic: Sequence[Periodic] | None = None) -> Runner:
    """The process-wide runner; `periodic` (recovery.jobs.cron.PERIODIC, from the commands that run the schedule) is the
    schedule its start() and run_burst() run. A process that only enqueues gets the runner's pool alone."""
    global _runner
    with _runner_lock:
        if _runner is None:
            _runner = Runner()
        if periodic is not None and not _runner.running:
            _runner.periodic = list(periodic)
        return _runner

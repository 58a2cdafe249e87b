"""`manage.py runjobs [--burst] [--role all|worker|scheduler]`: run the background jobs (docs/deploy.md).
With REDIS_URL an RQ worker, a scheduler candidate (only the lock holder enqueues the schedule) or both; without it
the in-process runner. --burst runs each periodic job once, then what is queued, and exits (tests and drills use it).
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time
from urllib.parse import urlsplit

import django_rq
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from recovery.jobs import inprocess, queueing
from recovery.jobs.cron import PERIODIC, Scheduler
from recovery.jobs.schedule import describe
from recovery.jobs.worker import RecoveryWorker, run_worker

ROLES = ("all", "worker", "scheduler")
# A worker's maintenance (failing jobs whose worker died, freeing their ids) every minute instead of rq's ten.
MAINTENANCE_INTERVAL_S = 60


class Command(BaseCommand):
    help = "Run the background jobs: an RQ worker and the periodic scheduler with REDIS_URL, in-process without it."

    def add_arguments(self, parser):
        parser.add_argument(
            "--burst", action="store_true", help="run each periodic job once and everything queued, then exit"
        )
        parser.add_argument(
            "--role",
            choices=ROLES,
            default="all",
            help="with REDIS_URL: 'worker' (an RQ worker only), 'scheduler' (a scheduler candidate only) or 'all'",
        )

    def handle(self, *args, burst: bool, role: str, **options):
        # Work horses are forked: a connection pool (DATABASE_POOL, for web processes) must not be copied into them.
        connections["default"].settings_dict.get("OPTIONS", {}).pop("pool", None)
        if role != "all" and not settings.REDIS_URL:
            raise CommandError(f"--role {role} needs REDIS_URL: without Redis one process runs everything in-process")
        if role == "scheduler":
            if burst:
                raise CommandError("--burst is a worker's: a scheduler candidate runs until stopped")
            self._run_scheduler()
        elif settings.REDIS_URL:
            self._run_rq(burst, periodic=role == "all")
        else:
            self._run_in_process(burst)

    def _run_scheduler(self) -> None:
        scheduler = Scheduler(queueing.get_queue())
        self.stdout.write(
            f"jobs: scheduler candidate {scheduler.name} at {redacted(settings.REDIS_URL)}; "
            f"periodic: {describe(PERIODIC)}"
        )
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        scheduler.run(stop)

    def _run_rq(self, burst: bool, *, periodic: bool) -> None:
        """An RQ worker; `periodic`: and a scheduler candidate beside it (rq's own scheduler, which any worker runs
        under rq's lock, only moves delayed jobs onto the queue)."""
        queue = queueing.get_queue()
        schedule = describe(PERIODIC) + (" (once: burst)" if burst else "") if periodic else "not here (--role worker)"
        self.stdout.write(f"jobs: RQ worker on queue 'default' at {redacted(settings.REDIS_URL)}; periodic: {schedule}")
        connections.close_all()  # the scheduler process and the work horses are forked: no database socket to copy
        if not periodic:
            run_worker(_make_worker, burst=burst)
            return
        if burst:
            scheduler = Scheduler(queue)
            scheduler.tick()
            scheduler.release()
            run_worker(_make_worker, burst=True)
            scheduler.wait_here()
            return
        # The scheduler gets a process of its own, started before the worker: forking work horses from a process
        # that also runs a scheduler thread could copy a lock that thread holds (redis-py's, logging's).
        scheduler_process = multiprocessing.get_context("fork").Process(
            target=_scheduler_main, name="recovery-scheduler", daemon=True
        )
        scheduler_process.start()
        try:
            run_worker(_make_worker)
        finally:
            scheduler_process.terminate()
            scheduler_process.join(10)

    def _run_in_process(self, burst: bool) -> None:
        runner = inprocess.get_runner(PERIODIC)
        self.stdout.write(
            f"jobs: in-process (no REDIS_URL), {runner.threads} threads; "
            f"periodic: {describe(runner.periodic)}{' (once: burst)' if burst else ''}"
        )
        if burst:
            try:
                runner.run_burst()
            finally:
                runner.stop()
            return
        runner.start()
        signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops as gently as Ctrl-C
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            self.stdout.write("jobs: stopping (waiting for running jobs)")
        finally:
            runner.stop()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _make_worker() -> RecoveryWorker:
    """A fresh RQ worker (run_worker starts another after Redis comes back)."""
    connections.close_all()  # work horses are forked: they must not inherit a database socket
    return django_rq.get_worker("default", maintenance_interval=MAINTENANCE_INTERVAL_S, worker_class=RecoveryWorker)


def _scheduler_main() -> None:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    Scheduler(queueing.get_queue()).run(stop)


def redacted(url: str) -> str:
    """The URL without its password, fit to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()

"""Who runs the background jobs now (docs/deploy.md), for the overview: the RQ workers and the scheduler's lock holder.
Read from Redis only; an unreachable Redis is an answer, not an error, so the overview stays up through an outage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings


@dataclass(frozen=True, kw_only=True)
class WorkerView:
    name: str
    host: str
    pid: int | None
    state: str  # rq's: idle, busy, suspended, started...
    last_heartbeat: datetime | None
    current_job: str  # "" when idle


@dataclass(frozen=True, kw_only=True)
class JobProcesses:
    mode: str  # "rq" or "in-process"
    reachable: bool = True
    error: str = ""
    workers: list[WorkerView] = field(default_factory=list)
    holder: str | None = None  # the scheduler candidate holding the lock
    lease_s: float | None = None  # what is left of its lease: it renews it every tick


def scheduler_holder(client) -> tuple[str | None, int | None]:
    """The scheduler candidate holding the lock (recovery.jobs.cron) and the milliseconds left of its lease, in one
    round trip on `client` (a redis.Redis); (None, None) when nobody holds it. Redis errors are the caller's."""
    from recovery.jobs.cron import Scheduler

    with client.pipeline(transaction=False) as pipe:
        holder, lease_ms = pipe.get(Scheduler.LOCK_KEY).pttl(Scheduler.LOCK_KEY).execute()
    if not holder:
        return None, None
    return holder.decode(errors="replace"), max(int(lease_ms), 0)


def job_processes() -> JobProcesses:
    if not settings.REDIS_URL:
        return JobProcesses(mode="in-process")
    import redis
    from rq import Worker

    from recovery.jobs import queueing

    queue = queueing.get_queue()
    try:
        workers = Worker.all(connection=queue.connection)
        holder, lease_ms = scheduler_holder(queue.connection)
        found = [_view(worker) for worker in workers]
    except redis.RedisError as exc:
        return JobProcesses(mode="rq", reachable=False, error=type(exc).__name__)
    found.sort(key=lambda w: (w.host, w.name))
    return JobProcesses(
        mode="rq", workers=found, holder=holder, lease_s=lease_ms / 1000 if lease_ms is not None else None
    )


def _view(worker) -> WorkerView:
    beat = worker.last_heartbeat
    if beat is not None and beat.tzinfo is None:
        beat = beat.replace(tzinfo=UTC)  # rq writes UTC
    return WorkerView(
        name=worker.name,
        host=worker.hostname or "",
        pid=worker.pid,
        state=str(worker.get_state()),
        last_heartbeat=beat,
        current_job=worker.get_current_job_id() or "",
    )

"""`/healthz` and `/readyz` for load balancers (docs/deploy.md, "Health"): JSON, no authentication, no data.
`/readyz` fails only on the database or pending migrations, never on Redis, the scheduler or the workers, which it
reports. The middleware answering them is first in the chain: no host check, no HTTPS redirect, no session, no CSRF.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.http import JsonResponse

HEALTHZ, READYZ = "/healthz", "/readyz"
REDIS_TIMEOUT_S = 0.5
RECONNECTS_SHOWN_S = 600  # how far back /readyz lists the Redis outages job processes lived through

_lock = threading.Lock()
_cached: tuple[float, int, dict[str, Any]] | None = None  # (monotonic time, status, body)
_known: frozenset[tuple[str, str]] | None = None  # the migrations on disk: the code's, fixed for the process


class HealthMiddleware:
    """Answers /healthz and /readyz before any other middleware sees the request."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        path = request.path_info.rstrip("/")
        if path == HEALTHZ:
            return _json(200, {"status": "up"})
        if path == READYZ:
            return _json(*readiness())
        return self.get_response(request)


def _json(status: int, body: dict) -> JsonResponse:
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"
    return response


def readiness() -> tuple[int, dict[str, Any]]:
    """(HTTP status, body): 200 when the database answers and no migration is pending, else 503."""
    global _cached
    now = time.monotonic()
    with _lock:
        if _cached is not None and now - _cached[0] < settings.RECOVERY_READY_CACHE_S:
            return _cached[1], _cached[2]
    database = _database()
    ready = database["ok"] and database.get("pending_migrations") == 0
    body = {"status": "ready" if ready else "not_ready", "database": database, **_jobs()}
    status = 200 if ready else 503
    with _lock:
        _cached = (now, status, body)
    return status, body


def _database() -> dict[str, Any]:
    global _known
    started = time.perf_counter()
    try:
        if _known is None:
            _known = frozenset(MigrationLoader(None, ignore_no_migrations=True).graph.nodes)  # squashes applied
        applied = set(MigrationRecorder(connection).applied_migrations())  # one statement: the database answers
    except DatabaseError as exc:
        connection.close_if_unusable_or_obsolete()
        return {"ok": False, "error": type(exc).__name__}
    finally:
        elapsed_ms = round((time.perf_counter() - started) * 1000, 1)
    pending = sorted(f"{app}.{name}" for app, name in _known - applied)
    found = {"ok": True, "ms": elapsed_ms, "pending_migrations": len(pending)}
    return {**found, "pending": pending} if pending else found


def _jobs() -> dict[str, Any]:
    """Redis, the scheduler's holder (recovery.jobs.cron) and the job processes: reported, never failing the probe.

    `jobs.state`: "paused" while this process cannot reach Redis (nothing is dequeued; the workers and scheduler
    candidates retry it with backoff), "running" when Redis answers and RQ workers are registered, "no_workers" when
    none is (none started, or the ones that lived through an outage not yet back). `jobs.reconnected`: the outages
    job processes recorded on reconnecting in the last RECONNECTS_SHOWN_S (recovery.jobs.outages)."""
    if not settings.REDIS_URL:
        return {"redis": {"configured": False}, "scheduler": {"mode": "in-process"}}
    import redis
    from rq.worker_registration import REDIS_WORKER_KEYS

    from recovery.jobs.outages import recent_reconnects
    from recovery.selectors.job_processes import scheduler_holder

    # A client of its own with short timeouts: a probe must answer within its deadline through a Redis outage.
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
    )
    try:
        holder, lease_ms = scheduler_holder(client)
        workers = client.scard(REDIS_WORKER_KEYS)
        reconnected = recent_reconnects(client, within_s=RECONNECTS_SHOWN_S)
    except redis.RedisError as exc:
        paused = {
            "state": "paused",
            "detail": "Redis unreachable: workers and scheduler candidates reconnect with backoff",
        }
        return {
            "redis": {"configured": True, "ok": False, "error": type(exc).__name__},
            "scheduler": {"holder": None},
            "jobs": paused,
        }
    finally:
        client.close()
    scheduler = {"holder": holder}
    if holder:
        scheduler["lease_ms"] = lease_ms
    jobs = {"state": "running" if workers else "no_workers", "workers": workers, "reconnected": reconnected}
    return {"redis": {"configured": True, "ok": True}, "scheduler": scheduler, "jobs": jobs}

"""What keeps one test run out of another's way (and out of a `make run` beside it): a Redis database of its own.

PostgreSQL is kept apart by the test database's name (tests/settings.py: one per run, made and dropped by
pytest-django); ports are always free ones picked at start. Redis has numbered databases and no names, so a run
claims one: it sets a claim key (its host and pid) with SET NX in the first database of 15..1 that is empty — never
the database REDIS_URL names, nor one holding anything (a `make run` on another database) — and empties it at exit.
A claim whose process is gone (a run killed with -9) is taken over; one never released expires after CLAIM_TTL_S.

Child processes (workers, servers the tests start) inherit the claimed URL through the environment
(RECOVERY_TEST_REDIS_URL), so they read the database their parent claimed instead of claiming one of their own.
"""

from __future__ import annotations

import atexit
import functools
import os
import socket

import redis

CLAIM_KEY = "recovery-console:test-run-claim"
CLAIM_TTL_S = 6 * 3600
INHERITED = "RECOVERY_TEST_REDIS_URL"
CLAIMED_FOR = "RECOVERY_TEST_REDIS_CLAIMED_FOR"  # the pytest-xdist worker (or "main") the inherited claim is for


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _gone(holder: bytes | None) -> bool:
    """Whether the claim's process has ended (only knowable for a claim made on this host)."""
    if holder is None:
        return True
    host, _, pid = holder.decode(errors="replace").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def claim_redis_database(url: str, *, taken: tuple[str, ...] = ()) -> str:
    """The URL of a Redis database this run holds alone (released at exit); `taken`: URLs it must not be."""
    base, _, own = url.rpartition("/")
    own_number = int(own) if own.isdigit() else 0
    skip = {own_number} | {int(u.rpartition("/")[2]) for u in taken if u.rpartition("/")[2].isdigit()}
    holder = _holder()
    for number in range(15, 0, -1):
        if number in skip:
            continue
        client = redis.Redis.from_url(f"{base}/{number}", socket_connect_timeout=2)
        try:
            claimed = client.dbsize() == 0 and client.set(CLAIM_KEY, holder, nx=True, ex=CLAIM_TTL_S)
            if not claimed and client.exists(CLAIM_KEY) and _gone(client.get(CLAIM_KEY)):
                client.flushdb()  # what a killed run left behind
                claimed = client.set(CLAIM_KEY, holder, nx=True, ex=CLAIM_TTL_S)
        except redis.RedisError:
            return url  # no Redis here: the tests that need it skip (or fail under REQUIRE_SERVICES) on their own
        if claimed:
            claimed_url = f"{base}/{number}"
            atexit.register(release_redis_database, claimed_url)
            return claimed_url
    raise RuntimeError(f"every Redis database 1..15 at {base} is claimed by another test run")


def reclaim(url: str) -> None:
    """Put this run's claim back after a test emptied the database (FLUSHDB deletes the claim key with the rest)."""
    redis.Redis.from_url(url).set(CLAIM_KEY, _holder(), ex=CLAIM_TTL_S)


def release_redis_database(url: str) -> None:
    """Empty the database (the run's queues and job records, the claim key last of all), so the next run finds it
    free."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        if client.get(CLAIM_KEY) == _holder().encode():
            client.flushdb()
    except redis.RedisError:
        pass


@functools.cache
def extra_redis_database(purpose: str) -> str:
    """Another Redis database of this run's own besides the suite's (claimed on first use, once per `purpose`), for a
    test whose processes must not read the suite's queues: a `make run` under test, a worker of its own."""
    base = os.environ.get(INHERITED) or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    return claim_redis_database(base)


def flush(url: str) -> None:
    """Empty one of this run's databases and keep holding it."""
    redis.Redis.from_url(url).flushdb()
    reclaim(url)

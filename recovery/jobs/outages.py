"""Redis outages as the job processes live through them (docs/deploy.md, "Jobs and the schedule"): a worker or a
scheduler candidate that loses Redis waits for it with capped exponential backoff, says so in its log, and once
Redis answers again records the outage there, where `/readyz` reads it (console/health.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time

import redis

logger = logging.getLogger("recovery.jobs")

# What losing Redis raises (a reset connection, a refused one, a read past its socket timeout); anything else is
# a bug, not an outage.
REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
RECONNECTS_KEY = "recovery:jobs:reconnects"  # a sorted set: one member per outage a process lived through
RECONNECTS_KEEP_S = 3600


class Backoff:
    """Delays of `first`, twice that, ... up to `cap` seconds; reset() once things work again."""

    def __init__(self, *, first: float = 0.5, cap: float = 10.0) -> None:
        self.first, self.cap = first, cap
        self._delay = first

    def next(self) -> float:
        delay, self._delay = self._delay, min(self._delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._delay = self.first


class Outage:
    """One process's view of Redis: lost (since when, on what error) or not."""

    def __init__(self, process: str, *, role: str) -> None:
        self.process, self.role = process, role
        self.since: float | None = None
        self.error = ""

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def lost(self, exc: BaseException, what: str) -> None:
        """Redis failed under `what` (one line for the log: what goes on meanwhile); logged once per outage."""
        if self.since is not None:
            return
        self.since, self.error = time.monotonic(), f"{type(exc).__name__}: {exc}"[:200]
        logger.warning(
            "%s %s: Redis unreachable (%s); %s; reconnecting with backoff", self.role, self.process, self.error, what
        )

    def back(self, connection: redis.Redis) -> None:
        """Redis answers again: log how long it was gone and record it for /readyz (a failure to record is logged,
        never raised: the process resumes either way)."""
        if self.since is None:
            return
        down_s = round(time.monotonic() - self.since, 1)
        self.since = None
        logger.warning("%s %s: Redis reachable again after %.1f s; resuming", self.role, self.process, down_s)
        now = time.time()
        record = {"process": self.process, "role": self.role, "down_s": down_s, "error": self.error, "at": round(now)}
        try:
            with connection.pipeline(transaction=False) as pipe:
                pipe.zadd(RECONNECTS_KEY, {json.dumps(record, sort_keys=True): now})
                pipe.zremrangebyscore(RECONNECTS_KEY, "-inf", now - RECONNECTS_KEEP_S)
                pipe.execute()
        except redis.RedisError:
            logger.exception("%s %s: could not record the outage for /readyz", self.role, self.process)

    def wait_for_redis(self, connection: redis.Redis, stop: threading.Event, backoff: Backoff) -> bool:
        """Ping Redis until it answers (True) or `stop` is set (False), sleeping `backoff`'s delays in between."""
        while not stop.is_set():
            try:
                connection.ping()
            except REDIS_ERRORS as exc:
                delay = backoff.next()
                logger.info(
                    "%s %s: Redis still unreachable (%s); next try in %.1f s", self.role, self.process, exc, delay
                )
                stop.wait(delay)
                continue
            return True
        return False


def recent_reconnects(client: redis.Redis, *, within_s: float) -> list[dict]:
    """The outages job processes recorded on reconnecting in the last `within_s` seconds, newest first. Redis
    errors are the caller's."""
    found = client.zrevrangebyscore(RECONNECTS_KEY, "+inf", time.time() - within_s)
    reconnects = []
    for raw in found:
        try:
            reconnects.append(json.loads(raw))
        except ValueError:
            continue
    return reconnects

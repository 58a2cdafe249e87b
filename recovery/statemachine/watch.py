"""Waiting for a call to change: the long poll behind `GET /calls/{id}?version=V&wait_ms=N` (docs/api.md).
The database stays the only truth: `announce` (after commit) only says when to re-read, and a waiter also re-reads
on its own clock, so a lost or failed wake-up costs time, never a wrong answer (docs/design/state-machine.md).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time

import redis
from django.conf import settings
from django.db import transaction

from recovery.models import Call

logger = logging.getLogger("recovery.call_watch")

MAX_WAIT_MS = 20_000
REREAD_REDIS_S = 1.0
REREAD_LOCAL_S = 0.1
PUBLISH_PAUSE_S = 5.0
CHANNEL = "recovery:call-changed:{}"

_changed = threading.Condition()
_state = {"paused_until": 0.0, "generation": 0}
_clients: dict[tuple[int, str, str], redis.Redis] = {}
_outbox: dict = {}  # the publishing thread of this process: its pid and queue


def announce(call_id: int) -> None:
    """Say, once the current transaction commits, that call `call_id` changed."""
    transaction.on_commit(lambda: _announce_now(call_id))


def _announce_now(call_id: int) -> None:
    with _changed:
        _state["generation"] += 1
        _changed.notify_all()
    if not settings.REDIS_URL or time.monotonic() < _state["paused_until"]:
        return
    _publisher().put(call_id)


def _publisher() -> queue.SimpleQueue:
    """This process's publishing thread's queue, the thread started on first use (a forked process starts its own).
    The PUBLISH leaves from there, not from the request that committed the change: a request does not wait for
    Redis to hear it (docs/benchmarks.md, the protected benchmark), and the word is only ever a hint to re-read."""
    with _changed:
        if _outbox.get("pid") != os.getpid():
            _outbox.update(pid=os.getpid(), queue=queue.SimpleQueue())
            threading.Thread(target=_publish_forever, args=(_outbox["queue"],), name="call-watch", daemon=True).start()
            atexit.register(flush)
        return _outbox["queue"]


def flush(timeout_s: float = 2.0) -> None:
    """Wait (at most `timeout_s`) until this process's publishing thread has sent every word queued so far: before
    a process ends that would not wait for it (an RQ work horse ends with os._exit; the interpreter's exit)."""
    if _outbox.get("pid") != os.getpid():
        return
    done = threading.Event()
    _outbox["queue"].put(done)
    done.wait(timeout_s)


def _publish_forever(outbox: queue.SimpleQueue) -> None:
    while True:
        taken = [outbox.get()]
        while not outbox.empty() and len(taken) < 100:  # a burst goes out in one round trip
            taken.append(outbox.get_nowait())
        changed = [item for item in taken if not isinstance(item, threading.Event)]
        try:
            if changed:
                _publish(changed)
        finally:
            for item in taken:
                if isinstance(item, threading.Event):
                    item.set()


def _publish(changed: list[int]) -> None:
    try:
        with _client("publish").pipeline(transaction=False) as pipe:
            for call_id in dict.fromkeys(changed):
                pipe.publish(CHANNEL.format(call_id), b"1")
            pipe.execute()
    except Exception as exc:  # the thread outlives any failure: a lost word costs waiters time only
        _state["paused_until"] = time.monotonic() + PUBLISH_PAUSE_S
        logger.warning(
            "calls %s changed, but Redis did not take the word (%s): waiters re-read on their own",
            ", ".join(str(c) for c in changed),
            exc,
        )


def current_version(call_id: int) -> int | None:
    return Call.objects.filter(pk=call_id).values_list("version", flat=True).first()


def wait_for_change(call_id: int, version: int, wait_s: float) -> int | None:
    """The call's version as soon as it is not `version` any more, or when `wait_s` is over (None: no such call)."""
    deadline = time.monotonic() + max(0.0, min(wait_s, MAX_WAIT_MS / 1000))
    if settings.REDIS_URL:
        try:
            return _wait_redis(call_id, version, deadline)
        except redis.RedisError as exc:
            logger.warning("waiting for call %s without Redis (%s)", call_id, exc)
    return _wait_local(call_id, version, deadline)


def _wait_redis(call_id: int, version: int, deadline: float) -> int | None:
    pubsub = _client("wait").pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(CHANNEL.format(call_id))  # before the first read: a change after it is heard
        while True:
            seen = current_version(call_id)
            left = deadline - time.monotonic()
            if seen != version or left <= 0:
                return seen
            pubsub.get_message(timeout=min(left, REREAD_REDIS_S))
    finally:
        pubsub.close()


def _wait_local(call_id: int, version: int, deadline: float) -> int | None:
    while True:
        generation = _state["generation"]  # read before the version: a change announced after it wakes the wait
        seen = current_version(call_id)
        left = deadline - time.monotonic()
        if seen != version or left <= 0:
            return seen
        with _changed:
            if _state["generation"] == generation:
                _changed.wait(min(left, REREAD_LOCAL_S))


def _client(purpose: str) -> redis.Redis:
    """A Redis client per process and purpose: publishing with short timeouts (it runs after every transition's
    commit), waiting with a read timeout longer than the longest wait."""
    key = (os.getpid(), settings.REDIS_URL, purpose)
    client = _clients.get(key)
    if client is None:
        timeout = 1.0 if purpose == "publish" else MAX_WAIT_MS / 1000 + 10
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1.0, socket_timeout=timeout)
        _clients[key] = client
    return client

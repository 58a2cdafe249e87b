"""Long-lived upstream sessions of stdio MCP servers (docs/mcp-gateway.md, "Upstream processes"): one per gateway
process and provider, started on first use, shared by concurrent calls (the SDK multiplexes requests over one
session), and started again with capped exponential backoff when the process dies — each death counted as a failure
on the breakers of the provider's tools. A call in flight when it died is never sent again: it is UNKNOWN.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp import Client

BACKOFF_FIRST_S = 0.5
BACKOFF_CAP_S = 30.0
STABLE_S = 60.0  # a session that lived this long resets the backoff
WATCH_EVERY_S = 0.25  # how often a live session is checked between calls (no wire traffic: _ended)


def _ended(client: Client) -> bool:
    """Whether the session's receive loop ended (the server closed its stdout: it died). The pinned SDK has no public
    signal for it and the current protocol no ping, so this reads its dispatcher's flag."""
    dispatcher = getattr(client.session, "_dispatcher", None)
    return bool(getattr(dispatcher, "_closed", False))


class UpstreamDown(Exception):
    """The server could not be started (or reached) in time: the call was never sent."""


def backoff_s(deaths_in_a_row: int) -> float:
    """The wait before the next start: 0.5 s doubling per death in a row, at most 30 s."""
    return min(BACKOFF_CAP_S, BACKOFF_FIRST_S * math.pow(2, max(0, deaths_in_a_row - 1)))


class Upstream:
    """One provider's server process and its MCP session, run by `run()` in the pool's task group."""

    def __init__(self, key: Any, connect: Callable[[], Client], on_death: Callable[[Counter], Awaitable[None]]):
        self.key = key
        self.connect = connect
        self.on_death = on_death
        self.client: Client | None = None
        self.started = anyio.Event()  # set on each start attempt's end: up (client set) or failed
        self.deaths = 0  # in a row, for the backoff
        self.starts = 0
        self.in_flight: Counter = Counter()  # registry tool name → calls on the wire now
        self.dead = anyio.Event()
        self.scope = anyio.CancelScope()  # cancelled when the registry changes the provider's command

    async def run(self) -> None:
        with self.scope:
            await self._run()

    async def _run(self) -> None:
        while True:
            began = anyio.current_time()
            try:
                async with self.connect() as client:
                    self.starts += 1
                    self.client, self.dead = client, anyio.Event()
                    self.started.set()
                    await self._watch(client)
            except Exception:  # the process could not start, or its session ended: a death either way
                pass
            self.client = None
            self.deaths = 1 if anyio.current_time() - began > STABLE_S else self.deaths + 1
            in_flight, self.in_flight = self.in_flight, Counter()
            ended, self.started = self.started, anyio.Event()  # a caller arriving now waits for the next start
            ended.set()  # a caller waiting for this start learns it failed
            await self.on_death(in_flight)
            await anyio.sleep(backoff_s(self.deaths))

    async def _watch(self, client: Client) -> None:
        """Until the session ends: a call that saw the connection drop says so; between calls the session's own
        receive loop does (it ends on the server's EOF). No ping: the current protocol has none."""
        while not _ended(client):
            with anyio.move_on_after(WATCH_EVERY_S):
                await self.dead.wait()
            if self.dead.is_set():
                return

    async def session(self, wait_s: float) -> Client:
        """The live session, waiting up to wait_s for a start under way; UpstreamDown when none comes up."""
        if self.client is None:
            with anyio.move_on_after(wait_s):
                await self.started.wait()  # the next start's end: up, or failed (no waiting for the one after)
        if self.client is None:
            raise UpstreamDown(f"the MCP server of {self.key} is not running (restarting after {self.deaths} deaths)")
        return self.client


class UpstreamPool:
    """The gateway process's upstream sessions, by provider; `serve()` is its lifetime (the ASGI lifespan)."""

    def __init__(self):
        self.upstreams: dict[Any, Upstream] = {}
        self.group: anyio.abc.TaskGroup | None = None
        self.thread = 0  # the event loop's: another thread (a command, a test) connects on its own

    async def serve(self, app: Callable[[], Awaitable[None]]) -> None:
        """Run `app` (the ASGI lifespan) with the upstreams' task group open; its end stops every server started."""
        async with anyio.create_task_group() as group:
            self.group, self.thread = group, threading.get_ident()
            try:
                await app()
            finally:
                self.group = None
                self.upstreams.clear()
                group.cancel_scope.cancel()

    def upstream(self, key: Any, connect: Callable[[], Client], on_death) -> Upstream | None:
        """The provider's upstream, started on first use; None outside the pool's lifetime (a connection per call)."""
        if self.group is None or threading.get_ident() != self.thread:
            return None
        found = self.upstreams.get(key)
        if found is None:
            for stale in [k for k in self.upstreams if k[0] == key[0]]:  # the provider's command changed: stop the old
                self.upstreams.pop(stale).scope.cancel()
            found = self.upstreams[key] = Upstream(key, connect, on_death)
            self.group.start_soon(found.run)
        return found


POOL = UpstreamPool()

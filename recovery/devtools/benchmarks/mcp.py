"""The `mcp` benchmark (docs/benchmarks.md, docs/mcp-gateway.md "The gateway's cost"): `tools/call` through the MCP
gateway against the same official client calling the same upstream server directly, in one run. Two servers: the
real mcp-server-git (a read, `git_log`, and a write, `git_create_branch`: `git_commit` needs a change staged before
each call, which 16 concurrent sessions cannot share) and recovery/devtools/mcp_sleep_server.py, whose
read and write each take 50 ms. Each case sequentially on one session, then with 16 concurrent sessions.

Direct: the client starts the server over stdio and calls it (16 sessions: 16 calls in flight on that one session, as
a stdio server has one client). Through the gateway: `manage.py mcp_gateway` in its own process, the client over
Streamable HTTP with a token (16 sessions: 16 clients), the gateway keeping its one stdio session to the server.
Reported per case: median and p95 per call, the time the gateway adds at the median, the ratio, the gateway
process's CPU per call, and the database statements per call (counted in a second, in-process gateway: its
connections are this process's).
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from django.conf import settings
from django.db.backends.signals import connection_created
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from recovery.audit.chain import Actor
from recovery.devtools.drills.stage import database_url
from recovery.devtools.mcp_stage import GIT_SERVER, Gateway, client, git_registry, git_repo
from recovery.registry import load_registry
from recovery.services.tokens import token_create

SESSIONS = 16
NEVER_OPENS = {"min_calls": 1_000_000}
_TICKS = os.sysconf("SC_CLK_TCK")
_ids = itertools.count(1)


def _sleep_server() -> dict:
    return {
        "command": sys.executable,
        "args": ["-m", "recovery.devtools.mcp_sleep_server"],
        "cwd": str(settings.BASE_DIR),
    }


def _registry(repo: Path) -> dict:
    registry = git_registry(repo, {"command": str(GIT_SERVER), "args": ["--repository", str(repo)]}, timeout_s=30)
    registry["providers"].append({"name": "sleep", "mcp": _sleep_server()})
    number = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    branch = {
        "type": "object",
        "properties": {"repo_path": {"type": "string"}, "branch_name": {"type": "string"}},
        "required": ["repo_path", "branch_name"],
    }
    registry["tools"] += [
        {"name": "git.branch", "provider": "git", "side_effect": "write", "risk": "low", "args_schema": branch,
         "mcp": {"tool": "git_create_branch", "ref_regex": "Created branch '([^']+)'"}},
        {"name": "sleep.read", "provider": "sleep", "side_effect": "read", "replay_safe": True,
         "args_schema": number, "mcp": {"tool": "sleep_read"}},
        {"name": "sleep.write", "provider": "sleep", "side_effect": "write", "risk": "low",
         "args_schema": number, "mcp": {"tool": "sleep_write", "ref_path": "id"}},
    ]  # fmt: skip
    for tool in registry["tools"]:
        tool["breaker"] = NEVER_OPENS
    return registry


def _cases(repo: Path) -> list[tuple[str, dict, str, Callable[[int], dict]]]:
    """(case, the server's stdio command, its tool, the arguments of the n-th call): each write's are its own."""
    git = {"command": str(GIT_SERVER), "args": ["--repository", str(repo)]}
    return [
        ("git_log (read)", git, "git_log", lambda n: {"repo_path": str(repo), "max_count": 1}),
        (
            "git_create_branch (write)",
            git,
            "git_create_branch",
            lambda n: {"repo_path": str(repo), "branch_name": f"b{n}"},
        ),
        ("sleep_read 50 ms (read)", _sleep_server(), "sleep_read", lambda n: {"n": n}),
        ("sleep_write 50 ms (write)", _sleep_server(), "sleep_write", lambda n: {"n": n}),
    ]


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed(mcp: Client, tool: str, args: Callable[[int], dict], count: int, out: list[float]) -> None:
    for _ in range(count):
        arguments = args(next(_ids))
        start = time.perf_counter()
        result = await mcp.call_tool(tool, arguments)
        out.append(time.perf_counter() - start)
        if result.is_error:
            raise RuntimeError(f"{tool}: {result.content[0].text if result.content else result}")


async def _direct(server: dict, tool: str, args, count: int, sessions: int, per_session: int) -> list[list[float]]:
    """Sequential, then concurrent calls on one stdio session the client started: [sequential, concurrent]."""
    params = StdioServerParameters(command=server["command"], args=server["args"], cwd=server.get("cwd"))
    sequential: list[float] = []
    concurrent: list[float] = []
    async with Client(stdio_client(params)) as mcp:
        await _timed(mcp, tool, args, 3, [])  # warm-up
        await _timed(mcp, tool, args, count, sequential)
        async with anyio.create_task_group() as group:
            for _ in range(sessions):
                group.start_soon(_timed, mcp, tool, args, per_session, concurrent)
    return [sequential, concurrent]


async def _through(
    url: str, token: str, tool: str, args, count: int, sessions: int, per_session: int, cpu: Callable[[], float]
) -> tuple[list[list[float]], list[float]]:
    """The same through the gateway, `sessions` clients; and the gateway's CPU seconds over each series."""
    sequential: list[float] = []
    concurrent: list[float] = []
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(client(url, token, name=f"bench-{i}")) for i in range(sessions)]
        await _timed(clients[0], tool, args, 3, [])  # warm-up: the gateway's upstream session is open after it
        before = cpu()
        await _timed(clients[0], tool, args, count, sequential)
        middle = cpu()
        async with anyio.create_task_group() as group:
            for mcp in clients:
                group.start_soon(_timed, mcp, tool, args, per_session, concurrent)
        after = cpu()
    return [sequential, concurrent], [middle - before, after - middle]


class GatewayProcess:
    """`manage.py mcp_gateway` on a free port, on this database, in its own process (whose CPU is read)."""

    def __enter__(self) -> GatewayProcess:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
        if settings.REDIS_URL:
            env["REDIS_URL"] = settings.REDIS_URL
        self.log = tempfile.TemporaryFile()
        command = [sys.executable, "manage.py", "mcp_gateway", "--listen", f"127.0.0.1:{self.port}"]
        self.process = subprocess.Popen(
            command, cwd=settings.BASE_DIR, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("the gateway did not start")

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the gateway process itself (not its upstream servers)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS


class StatementCount:
    """Database statements run on every connection opened while it is open: the gateway's worker threads open
    theirs on first use, so an in-process gateway started inside it is counted whole."""

    def __init__(self) -> None:
        self.count = 0

    def _counted(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)

    def _hook(self, sender, connection, **kwargs) -> None:
        if self._counted not in connection.execute_wrappers:  # a thread's wrapper reconnects: hooked once
            connection.execute_wrappers.append(self._counted)

    def __enter__(self) -> StatementCount:
        connection_created.connect(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        connection_created.disconnect(self._hook)


def _statements(url: str, token: str, tool: str, args, count: int, counter: StatementCount) -> float:
    """Database statements per sequential call through the in-process gateway `counter` watches."""

    async def go():
        async with client(url, token, name="bench-statements") as mcp:
            await _timed(mcp, tool, args, 2, [])  # the upstream session opened, the task made
            counter.count = 0
            await _timed(mcp, tool, args, count, [])
            return counter.count

    return anyio.run(go) / count


def _figures(direct: list[float], through: list[float]) -> dict:
    d50, g50 = _percentile(direct, 0.5), _percentile(through, 0.5)
    return {
        "direct_median_ms": round(d50 * 1000, 2),
        "direct_p95_ms": round(_percentile(direct, 0.95) * 1000, 2),
        "gateway_median_ms": round(g50 * 1000, 2),
        "gateway_p95_ms": round(_percentile(through, 0.95) * 1000, 2),
        "added_median_ms": round((g50 - d50) * 1000, 2),
        "ratio_median": round(g50 / d50, 3),
    }


def bench_mcp(
    count: int = 40, *, sessions: int = SESSIONS, per_session: int | None = None, only: tuple[str, ...] = ()
) -> dict:
    """`count` sequential calls per case each way, then `sessions` concurrent sessions of `per_session` calls each
    (default count // 4); `only`: the cases to run (all by default)."""
    per_session = per_session or max(count // 4, 1)
    work = Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    repo = git_repo(work / "repo")
    load_registry(_registry(repo), actor=Actor.system("bench"))
    _, token = token_create(name="bench-mcp", tenants=["acme"], actor=Actor.system("bench"))
    chosen = [case for case in _cases(repo) if not only or case[0] in only]
    cases: dict[str, dict] = {}
    with GatewayProcess() as gateway:
        for name, server, tool, args in chosen:
            direct = anyio.run(_direct, server, tool, args, count, sessions, per_session)
            through, cpu = anyio.run(
                _through, gateway.url, token, tool, args, count, sessions, per_session, gateway.cpu_s
            )
            cases[name] = {}
            for mode, d, g, seconds in zip(("sequential", f"{sessions}_sessions"), direct, through, cpu, strict=True):
                figures = _figures(d, g)
                figures["gateway_cpu_ms_per_call"] = round(seconds * 1000 / len(g), 2)
                figures["calls"] = len(g)
                cases[name][mode] = figures
    with StatementCount() as counter, Gateway() as served:
        for name, _, tool, args in chosen:
            cases[name]["statements_per_call"] = round(_statements(served.url, token, tool, args, 10, counter), 1)
    return {
        "benchmark": "mcp",
        "count": count,
        "sessions": sessions,
        "per_session": per_session,
        "load_average": list(os.getloadavg()),
        "cases": cases,
    }

"""The gateway's long-lived upstream sessions (docs/mcp-gateway.md, "Upstream processes"): one mcp-server-git process
serves call after call; one killed between calls is started again and the next call runs; a server that dies as it
starts opens its tools' breaker; a write in flight when its server died is UNKNOWN, settled by the status tool, and
never executed twice (git's history counts the commits).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import anyio
import httpx2
import pytest

from recovery.audit.chain import Actor
from recovery.devtools.drills.framework import wait
from recovery.devtools.mcp_stage import (
    GIT_SERVER,
    Gateway,
    client,
    commits,
    fault_command,
    forwarded,
    free_port,
    git_registry,
    set_fault,
    stage_file,
)
from recovery.devtools.mcp_stage import run_async as run
from recovery.models import Breaker, BreakerBucket, Call, Tool
from recovery.providers.mcp_upstream import POOL, backoff_s
from recovery.registry import load_registry
from recovery.services.reconcile import reconcile_call
from tests.mcp import agent_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mcp_servers")]


def _load(registry: dict) -> str:
    load_registry(registry, actor=Actor.system("tests"))
    return agent_token()


def _calls(url: str, token: str, *calls):
    async def go():
        async with client(url, token) as mcp:
            return [await mcp.call_tool(name, arguments) for name, arguments in calls]

    return run(go)


def _upstream():
    [upstream] = POOL.upstreams.values()
    return upstream


def test_one_server_process_serves_every_call_and_one_killed_is_started_again(gateway, repo, tmp_path):
    control = tmp_path / "fault.json"
    control.write_text("{}")
    token = _load(git_registry(repo, fault_command([str(GIT_SERVER), "--repository", str(repo)], control)))
    log = ("git_log", {"repo_path": str(repo)})
    assert not any(r.is_error for r in _calls(gateway.url, token, log, log, log))
    upstream = _upstream()
    assert upstream.starts == 1  # three calls, one process
    set_fault(control, "delay", "git_log")  # the first answer held 2 s: the second call overlaps it on the session
    results = []

    async def one():
        async with client(gateway.url, token) as mcp:
            results.append(await mcp.call_tool(*log))

    async def both():
        async with anyio.create_task_group() as group:
            group.start_soon(one)
            group.start_soon(one)

    run(both)
    assert len(results) == 2 and not any(r.is_error for r in results)
    assert upstream.starts == 1 and len(forwarded(control)) == 5
    set_fault(control, "kill", "git_log")  # the proxy kills the server and dies under the call
    (killed,) = _calls(gateway.url, token, log)
    assert killed.is_error
    (after,) = _calls(gateway.url, token, log)
    assert not after.is_error, after  # started again (after its backoff) and the next call ran
    assert upstream.starts == 2
    assert [c.state for c in Call.objects.order_by("pk")][-1] == "COMMITTED"


def test_a_server_that_keeps_dying_opens_its_tools_breaker(gateway, repo):
    breaker = {"window_s": 60, "bucket_s": 10, "min_calls": 3, "failure_rate": 0.5, "cooldown_s": 60}
    dying = {"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]}
    token = _load(git_registry(repo, dying, log={"breaker": breaker}))
    (first,) = _calls(gateway.url, token, ("git_log", {"repo_path": str(repo)}))
    assert first.is_error  # never sent: the server was not up
    log = Tool.objects.get(name="git.log")
    opened = wait(lambda: Breaker.objects.filter(tool=log, state="open").exists(), 10)
    failures = sum(BreakerBucket.objects.filter(tool=log).values_list("failures", flat=True))
    assert opened, failures  # one call, and the deaths of the restarts counted on top of it
    assert failures >= 3 and _upstream().deaths >= 2


def test_a_write_in_flight_when_its_server_died_is_unknown_settled_and_never_executed_twice(gateway, repo, tmp_path):
    control = tmp_path / "fault.json"
    control.write_text("{}")
    token = _load(git_registry(repo, fault_command([str(GIT_SERVER), "--repository", str(repo)], control)))
    stage_file(repo, "a.txt", "a")
    args = {"repo_path": str(repo), "message": "a"}
    _calls(gateway.url, token, ("git_log", {"repo_path": str(repo)}))  # the session is up before the write
    set_fault(control, "drop_reply", "git_commit")  # git commits, then the proxy and its server die
    (lost,) = _calls(gateway.url, token, ("git_commit", args))
    call = Call.objects.get(tool__name="git.commit")
    assert lost.is_error and call.state == "UNKNOWN"
    assert wait(lambda: _upstream().starts == 2, 10)  # restarted; the write was not sent again on it
    (reissued,) = _calls(gateway.url, token, ("git_commit", args))
    assert f"still being confirmed (call {call.pk})" in reissued.content[0].text
    reconcile_call(call.pk, worker="tests")
    call.refresh_from_db()
    assert call.state == "COMMITTED"
    assert commits(repo) == 1
    assert [f["name"] for f in forwarded(control)].count("git_commit") == 1


def test_the_gateways_end_stops_the_server_processes_it_started(repo, tmp_path):
    token = _load(git_registry(repo, {"command": str(GIT_SERVER), "args": ["--repository", str(repo)]}))
    with Gateway() as served:
        _calls(served.url, token, ("git_log", {"repo_path": str(repo)}))
        pids = {int(p) for p in os.popen(f"pgrep -f '[m]cp-server-git --repository {repo}'").read().split()}
        assert len(pids) == 1
    gone = wait(lambda: not os.popen(f"pgrep -f '[m]cp-server-git --repository {repo}'").read().strip(), 10)
    if not gone:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    assert gone


class GatewayProcess:
    """`manage.py mcp_gateway` as its own process on this test's database: what a restart stops and starts again."""

    def __init__(self, port: int):
        self.port, self.url, self.process = port, f"http://127.0.0.1:{port}/mcp", None

    def __enter__(self) -> GatewayProcess:
        from recovery.devtools.drills.stage import database_url
        from tests.servers import ROOT

        env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}  # this process's settings
        command = [sys.executable, str(ROOT / "manage.py"), "mcp_gateway", "--listen", f"127.0.0.1:{self.port}"]
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
        up = wait(lambda: _answers(self.url) or self.process.poll() is not None, 30)
        assert up and self.process.poll() is None, "the gateway process did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=2).status_code == 401
    except httpx2.HTTPError:
        return False


def test_a_reissue_on_a_new_session_after_a_gateway_restart_never_commits_twice(repo):
    token = _load(git_registry(repo, {"command": str(GIT_SERVER), "args": ["--repository", str(repo)]}))
    stage_file(repo, "r.txt", "r")
    args = {"repo_path": str(repo), "message": "r"}

    async def commit(url):
        async with client(url, token, mode="legacy") as mcp:  # a handshake-era client: a session of its own
            return await mcp.call_tool("git_commit", args)

    async def read(url):
        async with client(url, token, mode="2026-07-28", name="desk") as mcp:  # no session: the (token, client) task
            return await mcp.call_tool("git_log", {"repo_path": str(repo)})

    port = free_port()
    with GatewayProcess(port) as first:
        done = run(commit, first.url)
        run(read, first.url)
    assert not done.is_error, done
    with GatewayProcess(port) as again:  # the old session is gone: the client starts a new one
        reissued = run(commit, again.url)
        run(read, again.url)
    before, after = Call.objects.filter(tool__name="git.log").order_by("pk")
    assert before.task_id == after.task_id  # found again in the database
    call = Call.objects.get(tool__name="git.commit")
    assert call.state == "COMMITTED" and commits(repo) == 1
    assert not reissued.is_error and reissued.structured_content["recovery"]["replayed_from_call"] == call.pk
    assert f"Already done as call {call.pk}" in reissued.content[0].text


def test_a_registry_change_of_the_command_stops_the_old_server_and_starts_the_new(gateway, repo, tmp_path):
    server = {"command": str(GIT_SERVER), "args": ["--repository", str(repo)]}
    token = _load(git_registry(repo, server))
    log = ("git_log", {"repo_path": str(repo)})
    _calls(gateway.url, token, log)
    old = _upstream()
    load_registry(git_registry(repo, {**server, "cwd": str(tmp_path)}), actor=Actor.system("tests"))
    (after,) = _calls(gateway.url, token, log)
    assert not after.is_error
    new = _upstream()  # the one upstream left
    assert new is not old and new.starts == 1
    assert wait(lambda: len(os.popen(f"pgrep -f '[m]cp-server-git --repository {repo}'").read().split()) == 1, 10)


def test_a_repeat_after_the_window_on_another_session_is_named_as_a_duplicate_intent(gateway, repo):
    server = {"command": str(GIT_SERVER), "args": ["--repository", str(repo)]}
    token = _load(git_registry(repo, server, window_s=1))
    args = {"repo_path": str(repo), "message": "s"}

    async def commit():
        async with client(gateway.url, token, mode="legacy") as mcp:  # each a session, and so a task, of its own
            return await mcp.call_tool("git_commit", args)

    stage_file(repo, "s.txt", "s")
    assert not run(commit).is_error
    time.sleep(1.2)
    stage_file(repo, "t.txt", "t")  # something to commit: a repeat that slipped through would make a second commit
    repeat = run(commit)
    call = Call.objects.get()
    assert repeat.is_error and repeat.structured_content["recovery"]["decision"]["route"] == "duplicate_intent"
    assert repeat.structured_content["recovery"]["decision"]["call_id"] == call.pk
    assert f"call {call.pk}" in repeat.content[0].text and commits(repo) == 1


def test_the_restart_backoff_doubles_from_half_a_second_up_to_thirty():
    assert [backoff_s(n) for n in (1, 2, 3, 4, 6, 7, 20)] == [0.5, 1, 2, 4, 16, 30, 30]


def test_a_server_that_dies_between_calls_is_noticed_and_started_again_before_the_next_call(gateway, repo):
    token = _load(git_registry(repo, {"command": str(GIT_SERVER), "args": ["--repository", str(repo)]}))
    log = ("git_log", {"repo_path": str(repo)})
    _calls(gateway.url, token, log)
    [pid] = [int(p) for p in os.popen(f"pgrep -f '[m]cp-server-git --repository {repo}'").read().split()]
    os.kill(pid, signal.SIGKILL)  # the server this test's gateway started, by its id
    assert wait(lambda: _upstream().starts == 2, 10)  # noticed with no call on the wire, and started again
    (after,) = _calls(gateway.url, token, log)
    assert not after.is_error
    assert [c.state for c in Call.objects.order_by("pk")] == ["COMMITTED", "COMMITTED"]

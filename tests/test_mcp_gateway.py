"""The MCP recovery gateway (docs/mcp-gateway.md) against MCP servers nobody here wrote — mcp-server-git and
mcp-server-time, pinned and installed by `make test` into .venv-mcp — driven by the official `mcp` client over
Streamable HTTP, with our fault proxy (recovery/devtools/mcp_fault_proxy.py) between the gateway and git where a
fault is needed. Effects are counted from git's own history: one commit per executed call.
"""

from __future__ import annotations

import json
import ssl
import time
from io import StringIO
from pathlib import Path

import httpx2
import pytest
from django.core.management import call_command
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from recovery.audit.chain import Actor
from recovery.devtools.mcp_stage import (
    GIT_SERVER,
    client,
    commits,
    fault_command,
    forwarded,
    git,
    git_registry,
    set_fault,
    stage_file,
    time_registry,
)
from recovery.devtools.mcp_stage import (
    run_async as run,
)
from recovery.models import Call, Task, Tool
from recovery.registry import load_registry, validate_registry
from recovery.services.reconcile import reconcile_call
from tests.conftest import missing_service
from tests.mcp import agent_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mcp_servers")]


def _token() -> str:
    return agent_token()


def _git_through_proxy(repo, control, **options) -> str:
    server = fault_command([str(GIT_SERVER), "--repository", str(repo)], control)
    load_registry(git_registry(repo, server, **options), actor=Actor.system("tests"))
    return _token()


def _calls(url: str, token: str, *calls, meta=None):
    """Each (tool, arguments) called in turn on one connection; the results."""

    async def go():
        async with client(url, token) as mcp:
            return [await mcp.call_tool(name, arguments, meta=meta) for name, arguments in calls]

    return run(go)


def _recovery(result) -> dict:
    return result.structured_content["recovery"]


def test_reads_of_the_time_server_run_every_time_and_show_as_calls(gateway):
    load_registry(time_registry(), actor=Actor.system("tests"))
    token = _token()

    async def go():
        async with client(gateway.url, token) as mcp:
            listed = [tool.name for tool in (await mcp.list_tools()).tools]
            first = await mcp.call_tool("get_current_time", {"timezone": "UTC"})
            again = await mcp.call_tool("get_current_time", {"timezone": "UTC"})
            return listed, first, again

    listed, first, again = run(go)
    assert listed == ["get_current_time"]
    assert not first.is_error and first.structured_content["timezone"] == "UTC"
    assert _recovery(first)["call_state"] == "COMMITTED"
    assert _recovery(again)["call_id"] != _recovery(first)["call_id"]  # a read always executes
    calls = list(Call.objects.order_by("pk"))
    assert [c.state for c in calls] == ["COMMITTED", "COMMITTED"]
    assert calls[0].task_id == calls[1].task_id
    assert calls[0].task.agent == "mcp:tests"


def test_a_token_is_required(gateway):
    answer = httpx2.post(gateway.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert answer.status_code == 401
    answer = httpx2.post(gateway.url, json={}, headers={"Authorization": "Bearer rc_not_a_token"})
    assert answer.status_code == 401


def test_a_commit_is_committed_with_its_hash_and_a_reissue_answers_it_without_a_second_commit(gateway, repo, control):
    token = _git_through_proxy(repo, control)
    stage_file(repo, "a.txt", "one")
    args = {"repo_path": str(repo), "message": "add a"}
    first, again = _calls(gateway.url, token, ("git_commit", args), ("git_commit", args))
    assert not first.is_error, first
    call = Call.objects.get()
    assert call.state == "COMMITTED"
    assert call.provider_ref == git(repo, "rev-parse", "HEAD").strip()
    assert f"Recovery-Intent: {call.idempotency_key}" in git(repo, "log", "-1", "--format=%B")
    assert not again.is_error
    assert "Already done as call" in again.content[0].text
    assert _recovery(again)["replayed_from_call"] == call.pk
    assert commits(repo) == 1
    assert len(forwarded(control)) == 1


def test_a_lost_reply_is_confirmed_by_the_status_tool_and_the_reissue_never_commits_twice(gateway, repo, control):
    token = _git_through_proxy(repo, control)
    stage_file(repo, "b.txt", "two")
    args = {"repo_path": str(repo), "message": "add b"}
    set_fault(control, "drop_reply", "git_commit")
    (lost,) = _calls(gateway.url, token, ("git_commit", args))
    assert lost.is_error
    call = Call.objects.get()
    assert call.state == "UNKNOWN"
    assert _recovery(lost)["failure"]["class"] == "outcome_unknown"
    (reissued,) = _calls(gateway.url, token, ("git_commit", args))
    assert reissued.is_error and f"still being confirmed (call {call.pk})" in reissued.content[0].text
    receipt = reconcile_call(call.pk, worker="tests")
    call.refresh_from_db()
    assert call.state == "COMMITTED", receipt
    assert receipt.observed == "committed"
    (settled,) = _calls(gateway.url, token, ("git_commit", args))
    assert not settled.is_error and _recovery(settled)["replayed_from_call"] == call.pk
    assert commits(repo) == 1
    assert [f["name"] for f in forwarded(control)] == ["git_commit", "git_log"]  # the commit forwarded once


def test_a_call_dropped_before_the_server_is_proven_not_committed_by_the_status_tool(gateway, repo, control):
    token = _git_through_proxy(repo, control)
    stage_file(repo, "c.txt", "three")
    set_fault(control, "drop_before", "git_commit")
    (lost,) = _calls(gateway.url, token, ("git_commit", {"repo_path": str(repo), "message": "add c"}))
    assert lost.is_error
    call = Call.objects.get()
    assert call.state == "UNKNOWN"
    reconcile_call(call.pk, worker="tests")
    call.refresh_from_db()
    assert call.state in ("RETRYABLE", "FAILED_PERMANENT")
    assert commits(repo) == 0


def test_a_deliberate_repeat_after_the_window_is_named_as_a_duplicate_intent(gateway, repo, control):
    token = _git_through_proxy(repo, control, window_s=1)
    stage_file(repo, "d.txt", "four")
    args = {"repo_path": str(repo), "message": "add d"}
    (first,) = _calls(gateway.url, token, ("git_commit", args))
    assert not first.is_error
    time.sleep(1.2)
    (repeat,) = _calls(gateway.url, token, ("git_commit", args))
    call = Call.objects.get()
    assert repeat.is_error
    assert _recovery(repeat)["decision"] == {"route": "duplicate_intent", "call_id": call.pk, "retry_after_ms": None}
    assert f"call {call.pk}" in repeat.content[0].text
    assert commits(repo) == 1 and len(forwarded(control)) == 1


def test_arguments_the_schema_refuses_are_never_forwarded(gateway, repo, control):
    token = _git_through_proxy(repo, control)
    (refused,) = _calls(gateway.url, token, ("git_commit", {"repo_path": str(repo), "message": ""}))
    assert refused.is_error
    assert _recovery(refused)["failure"]["class"] == "invalid_arguments"
    assert forwarded(control) == []


def test_the_task_is_the_one_named_in_meta(gateway, repo, control):
    token = _git_through_proxy(repo, control)
    meta = {"io.recoveryconsole/task": "release-42"}
    _calls(gateway.url, token, ("git_log", {"repo_path": str(repo)}), meta=meta)
    assert Call.objects.get().task == Task.objects.get(external_id="release-42")


def test_the_shipped_nginx_location_passes_mcp_to_the_gateway(gateway, tmp_path):
    from recovery.devtools.drills.servers import Nginx

    if not Path(Nginx.BINARY).exists():
        missing_service("needs Debian's nginx (apt-get install nginx): the front is tested for real")
    load_registry(time_registry(), actor=Actor.system("tests"))
    token = _token()
    address = f"127.0.0.1:{gateway.port}"
    with Nginx(["127.0.0.1:9"], static_root=tmp_path, workdir=tmp_path / "nginx", mcp_gateway=address) as front:
        context = ssl.create_default_context(cafile=str(front.certificate))

        async def go():
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, verify=context)
            async with Client(streamable_http_client(front.tls_url + "/mcp", http_client=http), cache=None) as mcp:
                return await mcp.call_tool("get_current_time", {"timezone": "UTC"})

        result = run(go)
    assert not result.is_error and _recovery(result)["call_state"] == "COMMITTED"


def test_load_tools_from_mcp_writes_a_stub_of_the_live_tools_for_review(repo, control):
    _git_through_proxy(repo, control)
    out = StringIO()
    call_command("load_tools", "--from-mcp", "git", stdout=out)
    stub = json.loads(out.getvalue())
    tools = {tool["mcp"]["tool"]: tool for tool in stub["tools"]}
    commit, log = tools["git_commit"], tools["git_log"]
    assert set(commit["args_schema"]["properties"]) == {"repo_path", "message"}
    # What the registry does not describe is a high-risk, non-replay-safe write, whatever the server hints.
    assert (log["side_effect"], log["risk"], log["replay_safe"]) == ("write", "high", False)
    assert log["mcp"]["annotations"]["readOnlyHint"] is True
    assert validate_registry(stub) == []
    assert forwarded(control) == []  # listing calls no tool


@pytest.mark.parametrize("exposed", [False, True])
def test_unregistered_tools_are_offered_only_when_the_provider_says_so_as_high_risk_writes(
    gateway, repo, control, exposed
):
    server = fault_command([str(GIT_SERVER), "--repository", str(repo)], control)
    registry = git_registry(repo, {**server, "expose_unregistered": exposed})
    load_registry(registry, actor=Actor.system("tests"))
    token = _token()

    async def go():
        async with client(gateway.url, token) as mcp:
            listed = [tool.name for tool in (await mcp.list_tools()).tools]
            return listed, await mcp.call_tool("git_status", {"repo_path": str(repo)})

    listed, status = run(go)
    assert ("git_status" in listed) is exposed and {"git_commit", "git_log"} <= set(listed)
    if not exposed:
        assert status.is_error and "not a tool offered here" in status.content[0].text
        assert forwarded(control) == [] and not Tool.objects.filter(name="git.git_status").exists()
        return
    tool = Tool.objects.get(name="git.git_status")
    assert (tool.side_effect, tool.risk, tool.replay_safe) == ("write", "high", False)
    assert tool.mcp["annotations"]["readOnlyHint"] is True  # kept as the server's hint, never acted on
    assert tool.mcp["unregistered"] is True  # the console's tool and call pages say exposed-unregistered
    # A write with no reference to confirm it by: a person looks at it, whatever the server's hint says.
    assert Call.objects.get(tool=tool).state == "HUMAN_REVIEW"
    assert [f["name"] for f in forwarded(control)] == ["git_status"]

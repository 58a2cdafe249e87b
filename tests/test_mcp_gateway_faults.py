"""The gateway's outcome table and admission (docs/mcp-gateway.md) on mcp-server-git, faults from our proxy
(recovery/devtools/mcp_fault_proxy.py): a hang past the timeout, an upstream killed mid-call, a server that never
starts, the server's own errors on a write and on a read, a refusal code, arguments only the server refuses, a
success text the registry calls an error, a breaker that opens; and the calls on the console's pages.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.devtools.drills.framework import wait
from recovery.devtools.mcp_stage import (
    GIT_SERVER,
    client,
    commits,
    fault_command,
    forwarded,
    git_registry,
    set_fault,
    stage_file,
)
from recovery.devtools.mcp_stage import (
    run_async as run,
)
from recovery.models import Call
from recovery.models.roles import REVIEWER
from recovery.registry import load_registry
from recovery.services.actions import action_preview
from recovery.services.errors import Refusal
from recovery.services.reconcile import reconcile_call
from recovery.services.tokens import token_create
from tests.console import make_people, signed_in
from tests.mcp import agent_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mcp_servers")]


def _load(repo, control, **options) -> str:
    server = fault_command([str(GIT_SERVER), "--repository", str(repo)], control)
    load_registry(git_registry(repo, server, **options), actor=Actor.system("tests"))
    return agent_token()


def _call(url: str, token: str, name: str, arguments: dict):
    async def go():
        async with client(url, token) as mcp:
            return await mcp.call_tool(name, arguments)

    return run(go)


def _recovery(result) -> dict:
    return result.structured_content["recovery"]


def test_a_hang_past_the_timeout_is_an_unknown_write_not_resent(gateway, repo, control):
    token = _load(repo, control, timeout_s=1)
    stage_file(repo, "a.txt", "a")
    set_fault(control, "hang", "git_commit")
    result = _call(gateway.url, token, "git_commit", {"repo_path": str(repo), "message": "a"})
    assert result.is_error and _recovery(result)["failure"]["class"] == "outcome_unknown"
    call = Call.objects.get()
    assert call.state == "UNKNOWN"
    assert call.attempts.get().error_kind == "read_timeout"
    assert len(forwarded(control)) == 1


def test_an_upstream_killed_mid_call_is_an_unknown_write_that_the_status_tool_settles(gateway, repo, control):
    token = _load(repo, control)
    stage_file(repo, "b.txt", "b")
    set_fault(control, "kill", "git_commit")
    result = _call(gateway.url, token, "git_commit", {"repo_path": str(repo), "message": "b"})
    assert result.is_error
    call = Call.objects.get()
    assert call.state == "UNKNOWN"
    reconcile_call(call.pk, worker="tests")
    call.refresh_from_db()
    # Whether git got to commit before it died is for its history to say, never for a guess.
    assert (call.state, commits(repo)) in (("COMMITTED", 1), ("RETRYABLE", 0), ("FAILED_PERMANENT", 0))


def test_a_server_that_never_starts_proves_the_write_was_not_sent(gateway, repo, tmp_path):
    server = {"command": str(tmp_path / "no-such-server")}
    load_registry(git_registry(repo, server), actor=Actor.system("tests"))
    _, token = token_create(name="agent", tenants=["acme"], actor=Actor.system("tests"))
    result = _call(gateway.url, token, "git_commit", {"repo_path": str(repo), "message": "c"})
    assert result.is_error
    call = Call.objects.get()
    assert call.attempts.get().sent is False
    assert call.state in ("RETRYABLE", "FAILED_PERMANENT")
    assert _recovery(result)["failure"]["stage"] == "before_send"


def test_a_write_the_server_answers_with_is_error_is_unknown_until_the_status_tool_says_not_committed(
    gateway, repo, control
):
    token = _load(repo, control)
    result = _call(gateway.url, token, "git_commit", {"repo_path": str(repo), "message": "nothing staged"})
    assert result.is_error
    call = Call.objects.get()
    assert call.state == "UNKNOWN"
    reconcile_call(call.pk, worker="tests")
    call.refresh_from_db()
    assert call.state in ("RETRYABLE", "FAILED_PERMANENT")
    assert commits(repo) == 0


def test_a_refusal_code_in_the_servers_error_is_refused_and_nothing_executed(gateway, repo, control):
    token = _load(repo, control, commit={"refusal_codes": ["No changes staged for commit"]})
    result = _call(gateway.url, token, "git_commit", {"repo_path": str(repo), "message": "nothing staged"})
    assert result.is_error
    assert _recovery(result)["failure"]["class"] == "unrecoverable"
    assert Call.objects.get().state == "FAILED_PERMANENT"


def test_a_read_the_server_answers_with_is_error_is_transient_and_its_breaker_counts_it(gateway, repo, control):
    breaker = {"window_s": 60, "bucket_s": 10, "min_calls": 1, "failure_rate": 0.5, "cooldown_s": 60}
    token = _load(repo, control, log={"breaker": breaker})
    outside = {"repo_path": "/not/the/repository"}
    first = _call(gateway.url, token, "git_log", outside)
    assert first.is_error and _recovery(first)["failure"]["class"] == "transient"
    denied = _call(gateway.url, token, "git_log", {"repo_path": str(repo)})
    assert denied.is_error
    decision = _recovery(denied)["decision"]
    assert decision["call_id"] == Call.objects.order_by("-pk").first().pk and decision["route"]
    assert "Traceback" not in denied.content[0].text
    assert [f["arguments"] for f in forwarded(control)] == [outside]  # the denied read never left


def test_arguments_only_the_server_refuses_are_a_transient_read(gateway, repo, control):
    loose = {"type": "object", "properties": {"repo_path": {}, "max_count": {}}, "required": ["repo_path"]}
    token = _load(repo, control, log={"args_schema": loose})
    result = _call(gateway.url, token, "git_log", {"repo_path": str(repo), "max_count": "many"})
    assert result.is_error  # mcp-server-git answers its own validation error as isError, not JSON-RPC -32602
    assert _recovery(result)["failure"]["class"] == "transient"
    assert Call.objects.get().attempts.get().http_status == 502


def test_a_json_rpc_invalid_params_error_is_invalid_arguments_and_nothing_executed(gateway, repo, control):
    token = _load(repo, control, commit={"mcp": {"tool": "git_no_such_tool"}})
    stage_file(repo, "g.txt", "g")
    result = _call(gateway.url, token, "git_no_such_tool", {"repo_path": str(repo), "message": "g"})
    assert result.is_error
    call = Call.objects.get()
    assert call.attempts.get().error_code == "invalid_params"  # the server's -32602 for a tool it does not have
    assert _recovery(result)["failure"]["class"] == "invalid_arguments"
    assert call.state != "UNKNOWN" and commits(repo) == 0


def test_a_success_whose_text_the_registry_calls_an_error_is_an_invalid_result_for_a_person(gateway, repo, control):
    token = _load(repo, control, commit={"mcp": {"tool": "git_commit", "error_pattern": "committed successfully"}})
    stage_file(repo, "e.txt", "e")
    result = _call(gateway.url, token, "git_commit", {"repo_path": str(repo), "message": "e"})
    assert result.is_error
    assert _recovery(result)["failure"]["class"] == "invalid_result"
    assert Call.objects.get().state == "HUMAN_REVIEW"


def test_a_lost_reply_shows_in_the_unknown_queue_and_on_the_call_and_task_pages(gateway, repo, control):
    token = _load(repo, control)
    stage_file(repo, "f.txt", "f")
    set_fault(control, "drop_reply", "git_commit")
    _call(gateway.url, token, "git_commit", {"repo_path": str(repo), "message": "f"})
    call = Call.objects.get()
    reviewer = signed_in(make_people(), REVIEWER)
    for url in ("/queues/unknown/", f"/calls/{call.pk}/", f"/tasks/{call.task_id}/"):
        page = reviewer.get(url)
        assert page.status_code == 200, url
        assert "git.commit" in page.content.decode(), url
    call_page = reviewer.get(f"/calls/{call.pk}/").content.decode()  # an MCP call: its tool's entry and hints
    assert 'data-fact="mcp-registered" data-tool="git.commit" data-value="registered"' in call_page
    assert 'data-hint="readOnlyHint" data-value="not given"' in call_page


def test_an_operators_same_key_replay_of_an_mcp_write_is_refused_as_a_blind_resend(gateway, repo, control):
    token = _load(repo, control, commit={"mcp": {"tool": "git_commit", "error_pattern": "committed successfully"}})
    stage_file(repo, "h.txt", "h")
    _call(gateway.url, token, "git_commit", {"repo_path": str(repo), "message": "h"})
    call = Call.objects.get()
    assert call.state == "HUMAN_REVIEW"
    people = make_people()
    with pytest.raises(Refusal) as refused:
        action_preview(call_id=call.pk, action="replay_same_key", user=people[REVIEWER], actor=Actor.system("t"))
    assert "replay is switched off" in refused.value.message
    assert commits(repo) == 1 and len(forwarded(control)) == 1


def test_a_client_that_gives_up_does_not_cancel_a_forwarded_write(gateway, repo, control):
    token = _load(repo, control)
    stage_file(repo, "i.txt", "i")
    set_fault(control, "delay", "git_commit")

    async def go():
        async with client(gateway.url, token) as mcp:
            with anyio.move_on_after(0.5):  # the client stops waiting and closes its connection
                await mcp.call_tool("git_commit", {"repo_path": str(repo), "message": "i"})

    run(go)
    call = Call.objects.get()
    settled = wait(lambda: Call.objects.get(pk=call.pk).state == "COMMITTED", 15)
    assert settled, Call.objects.get(pk=call.pk).state  # the gateway kept the call and recorded what came back
    assert commits(repo) == 1 and len(forwarded(control)) == 1


def test_the_task_is_the_traceparents_trace_else_the_session(gateway, repo, control):
    token = _load(repo, control)
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    meta = {"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}

    async def go(mode, meta):
        async with client(gateway.url, token, mode=mode) as mcp:
            await mcp.call_tool("git_log", {"repo_path": str(repo)}, meta=meta)

    run(go, "auto", meta)
    run(go, "legacy", None)  # a handshake-era client: its MCP session names the task
    first, second = Call.objects.order_by("pk")
    assert first.task.external_id == f"trace:{trace}"
    assert second.task.external_id.startswith("mcp-session:")


def test_a_clients_task_closes_after_fifteen_idle_minutes_and_the_next_call_opens_another(gateway, repo, control):
    token = _load(repo, control)

    async def go():
        async with client(gateway.url, token, mode="2026-07-28", name="desk") as mcp:  # no session: (token, client)
            await mcp.call_tool("git_log", {"repo_path": str(repo)})

    run(go)
    run(go)
    first = Call.objects.order_by("pk").first()
    assert Call.objects.filter(task=first.task).count() == 2
    Call.objects.filter(task=first.task).update(created_at=timezone.now() - timedelta(minutes=16))
    run(go)
    first.task.refresh_from_db()
    latest = Call.objects.order_by("-pk").first()
    assert first.task.status == "submitted" and latest.task_id != first.task_id
    assert (first.task.external_id[-2:], latest.task.external_id[-2:]) == (":1", ":2")


def test_a_reissue_while_the_write_is_in_flight_is_told_it_is_in_progress(gateway, repo, control):
    token = _load(repo, control)
    stage_file(repo, "j.txt", "j")
    set_fault(control, "delay", "git_commit")
    args = {"repo_path": str(repo), "message": "j"}
    results = {}

    async def one(label: str, after_s: float):
        await anyio.sleep(after_s)
        async with client(gateway.url, token) as mcp:
            results[label] = await mcp.call_tool("git_commit", args)

    async def go():
        async with anyio.create_task_group() as group:
            group.start_soon(one, "first", 0)
            group.start_soon(one, "reissue", 1.0)  # while the server's answer is held

    run(go)
    call = Call.objects.get()
    assert not results["first"].is_error and call.state == "COMMITTED"
    assert results["reissue"].is_error and f"in progress (call {call.pk})" in results["reissue"].content[0].text
    assert commits(repo) == 1 and len(forwarded(control)) == 1

"""The MCP tasks extension on the gateway (docs/mcp-gateway.md, "Tasks"): a client that declares
`io.modelcontextprotocol/tasks` gets a task handle for a held write instead of "waiting for approval", polls it with
`tasks/get` while a reviewer and an approver decide it in the console, and receives the one execution's result;
`tasks/cancel` withdraws a hold nobody approved. The official SDK client, mcp-server-git behind our fault proxy (which
logs every tools/call it forwards), a real RQ worker; effects counted from git's own history.
"""

from __future__ import annotations

import threading
import time
from typing import Literal

import anyio
import pytest
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Request, RequestParams, Result

from recovery.devtools.drills.framework import wait
from recovery.devtools.mcp_stage import client, commits, forwarded, stage_file
from recovery.devtools.mcp_stage import run_async as run
from recovery.models import ActionRequest, Call
from tests.test_mcp_gateway_holds import TASK, _decide, _hold_of, _load, _work

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mcp_servers")]
TASKS = "io.modelcontextprotocol/tasks"


class TaskHandle(Result):
    """The `CreateTaskResult` the gateway may answer a tools/call with (resultType "task")."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class DetailedTask(Result):
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    result: dict | None = None


class TaskRef(RequestParams):
    task_id: str


class GetTask(Request[TaskRef, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskRef
    name_param = "taskId"


class CancelTask(Request[TaskRef, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskRef
    name_param = "taskId"


async def task_get(session, task_id: str) -> DetailedTask:
    return await session.send_request(GetTask(params=TaskRef(task_id=task_id)), DetailedTask)


class Tasks(ClientExtension):
    """A client that follows a task handle to its end, as the extension describes: `tasks/get` at the suggested pace
    until a terminal status; what it saw on the way is kept in `seen`."""

    identifier = TASKS

    def __init__(self) -> None:
        self.seen: list[DetailedTask | TaskHandle] = []

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.follow)]

    async def follow(self, handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
        self.seen.append(handle)
        while True:
            await anyio.sleep((handle.poll_interval_ms or 1000) / 1000)
            task = await task_get(ctx.session, handle.task_id)
            self.seen.append(task)
            if task.status == "completed":
                return CallToolResult.model_validate(task.result)
            if task.status in ("failed", "cancelled"):
                raise RuntimeError(f"task {task.task_id} {task.status}: {task.status_message}")


def _commit_args(repo, message: str) -> dict:
    return {"repo_path": str(repo), "message": message}


def test_a_client_that_declares_tasks_follows_a_held_write_to_its_one_execution(
    gateway, repo, control, people, rq_queue
):
    token = _load(repo, control, hold_s=20)
    stage_file(repo, "release.txt", "7")
    tasks = Tasks()
    results: list = []

    async def call():
        async with client(gateway.url, token, extensions=[tasks]) as mcp:
            results.append(TASKS in (mcp.server_capabilities.extensions or {}))  # the gateway advertises it
            results.append(await mcp.call_tool("git_commit", _commit_args(repo, "release 7"), meta=TASK))

    following = threading.Thread(target=lambda: run(call))
    started = time.monotonic()
    following.start()
    assert wait(lambda: len(tasks.seen) >= 2, 15, every_s=0.1)  # the handle, then a tasks/get
    handle, polled = tasks.seen[0], tasks.seen[1]
    call_row = Call.objects.get()
    assert handle.status == "working" and handle.task_id == f"recovery-call-{call_row.pk}"
    assert handle.status_message == f"waiting for approval: call {call_row.pk}"
    assert handle.ttl_ms is None and handle.poll_interval_ms == 1000  # the call is the task: it does not expire
    assert polled.status == "working" and call_row.state == "READY" and call_row.attempts_count == 0
    assert forwarded(control) == [] and commits(repo) == 0  # nothing sent while held

    _decide(people, _hold_of(call_row.pk))
    _work(rq_queue)  # the worker executes the approved call once, whether or not anyone polls
    following.join(timeout=30)
    assert not following.is_alive()
    advertised, result = results
    assert advertised is True
    assert result.is_error is False and result.structured_content["recovery"]["call_state"] == "COMMITTED"
    assert tasks.seen[-1].status == "completed" and tasks.seen[-2].status == "working"
    assert commits(repo) == 1 and [c["name"] for c in forwarded(control)] == ["git_commit"]
    assert time.monotonic() - started < 30

    async def again():  # the handle lost, the call re-issued: the kept result, never a second execution
        async with client(gateway.url, token, extensions=[Tasks()]) as mcp:
            return await mcp.call_tool("git_commit", _commit_args(repo, "release 7"), meta=TASK)

    reissued = run(again)
    assert reissued.is_error is False and "executed once" in reissued.content[0].text
    assert commits(repo) == 1 and len(forwarded(control)) == 1 and Call.objects.count() == 1


def _handle(url: str, token: str, repo, message: str) -> TaskHandle:
    async def go():
        async with client(url, token, extensions=[Tasks()]) as mcp:
            return await mcp.session.call_tool("git_commit", _commit_args(repo, message), meta=TASK, allow_claimed=True)

    return run(go)


def _on_task(url: str, token: str, request, *, extensions=None):
    """The answer to one tasks/* request; a JSON-RPC error is raised as MCPError (outside the client's task group)."""

    async def go():
        async with client(url, token, extensions=extensions if extensions is not None else [Tasks()]) as mcp:
            try:
                return await mcp.session.send_request(
                    request, DetailedTask if request.method == "tasks/get" else Result
                )
            except MCPError as error:
                return error

    answer = run(go)
    if isinstance(answer, MCPError):
        raise answer
    return answer


def test_tasks_cancel_withdraws_a_hold_nobody_approved_and_it_never_runs(gateway, repo, control, people, rq_queue):
    token = _load(repo, control, hold_s=20)
    stage_file(repo, "notes.txt", "draft")
    started = time.monotonic()
    handle = _handle(gateway.url, token, repo, "draft notes")
    assert time.monotonic() - started < 3  # a handle comes back at once: no hold on the request
    assert handle.status == "working"
    _on_task(gateway.url, token, CancelTask(params=TaskRef(task_id=handle.task_id)))

    task = _on_task(gateway.url, token, GetTask(params=TaskRef(task_id=handle.task_id)))
    call_row = Call.objects.get()
    assert task.status == "cancelled" and "cancelled by its client" in task.status_message
    assert call_row.state == "FAILED_PERMANENT"  # through the transition function, as every refused hold
    hold = ActionRequest.objects.get(call=call_row, action="execute_held")
    assert hold.status == "withdrawn"
    _work(rq_queue)
    assert forwarded(control) == [] and commits(repo) == 0


def test_an_approved_hold_is_not_cancelled_and_the_task_completes(gateway, repo, control, people, rq_queue):
    token = _load(repo, control, hold_s=20)
    stage_file(repo, "ship.txt", "1")
    handle = _handle(gateway.url, token, repo, "ship it")
    _decide(people, _hold_of(Call.objects.get().pk))
    _on_task(gateway.url, token, CancelTask(params=TaskRef(task_id=handle.task_id)))  # acknowledged, too late
    _work(rq_queue)
    task = _on_task(gateway.url, token, GetTask(params=TaskRef(task_id=handle.task_id)))
    assert task.status == "completed" and task.result["isError"] is False
    assert commits(repo) == 1 and len(forwarded(control)) == 1


def test_rejected_hold_completes_the_task_with_the_refusal(gateway, repo, control, people, rq_queue):
    token = _load(repo, control, hold_s=20)
    stage_file(repo, "risky.txt", "x")
    handle = _handle(gateway.url, token, repo, "risky")
    _decide(people, _hold_of(Call.objects.get().pk), verb="reject")
    task = _on_task(gateway.url, token, GetTask(params=TaskRef(task_id=handle.task_id)))
    assert task.status == "completed" and task.result["isError"] is True  # a tool-level refusal, not a failed task
    assert "was rejected" in task.result["content"][0]["text"]
    assert forwarded(control) == [] and commits(repo) == 0


def test_tasks_methods_answer_only_declaring_clients_and_known_tasks(gateway, repo, control, people):
    token = _load(repo, control, hold_s=20)
    stage_file(repo, "a.txt", "a")
    handle = _handle(gateway.url, token, repo, "a")
    again = _handle(gateway.url, token, repo, "a")  # the handle lost, the call re-issued: the same task
    assert again.task_id == handle.task_id and again.status == "working" and Call.objects.count() == 1
    get = GetTask(params=TaskRef(task_id=handle.task_id))
    with pytest.raises(MCPError) as undeclared:
        _on_task(gateway.url, token, get, extensions=[])
    assert undeclared.value.error.code == -32021  # missing required client capability
    for unknown in ("recovery-call-999999", "someone-else", f"recovery-call-{handle.task_id[14:]}0"):
        with pytest.raises(MCPError) as missing:
            _on_task(gateway.url, token, GetTask(params=TaskRef(task_id=unknown)))
        assert missing.value.error.code == -32602, unknown
    assert _on_task(gateway.url, token, get).status == "working"


def test_a_client_without_the_extension_is_answered_as_before(gateway, repo, control, people):
    token = _load(repo, control, hold_s=20)
    stage_file(repo, "b.txt", "b")

    async def go():
        async with client(gateway.url, token) as mcp:
            return await mcp.call_tool("git_commit", _commit_args(repo, "b"), meta=TASK)

    started = time.monotonic()
    answer = run(go)
    assert time.monotonic() - started < 3
    assert answer.is_error and answer.content[0].text.startswith("waiting for approval: call ")

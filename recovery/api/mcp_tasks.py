"""The MCP tasks extension on the gateway (`io.modelcontextprotocol/tasks`, 2026-07-28; docs/mcp-gateway.md, "Tasks"):
a client that declares it on a `tools/call` gets a task handle for a held call instead of "waiting for approval", and
follows it with `tasks/get` until a person decides it in the console and its one execution settles. `tasks/cancel`
withdraws a hold nobody approved yet; `tasks/update` is acknowledged and changes nothing: the gateway never asks the
client for input, since an approval is a person's decision in the console, never an answer the client can give.

The task is the held call itself (its id names it), so it is as durable as the call: a client that lost its handle
re-issues the call and gets the same one back, and `tasks/get` resolves for as long as the call is kept.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from recovery.audit.chain import Actor
from recovery.services import mcp_calls, mcp_holds
from recovery.services.actions import cancel_held

TASKS = "io.modelcontextprotocol/tasks"
PREFIX = "recovery-call-"
POLL_MS = 1000  # what the handle suggests; a hold is read again at this pace by a held client too


class TaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


def declared(ctx: Any) -> bool:
    """The client declared the extension on this request (a 2026-07-28 connection: a task handle is a claimed result
    shape, which a legacy wire cannot carry)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS in capabilities.extensions)


def _iso(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _task(held: mcp_holds.Held, status: str, message: str) -> dict:
    moments = [held.call.created_at, held.call.updated_at, held.request.updated_at]
    return {
        "taskId": f"{PREFIX}{held.call.pk}",
        "status": status,
        "statusMessage": message,
        "createdAt": _iso(held.call.created_at),
        "lastUpdatedAt": _iso(max(moment for moment in moments if moment is not None)),
        "ttlMs": None,  # the call is the task: kept as every call is, so the handle never expires
        "pollIntervalMs": POLL_MS,
    }


def handle(call_id: int, text: str) -> dict:
    """The `CreateTaskResult` for a held call: the task is working while people decide it."""
    held = mcp_holds.where(call_id)
    return {"resultType": "task", **_task(held, "working", text)}


def _not_found(task_id: str) -> MCPError:
    return MCPError(code=types.INVALID_PARAMS, message=f"Failed to retrieve task: no task {task_id!r} here")


def _held(task_id: str, tenant) -> mcp_holds.Held:
    """The held call a task id names, of the caller's tenant; a JSON-RPC invalid-params error for any other id. Only
    the gateway holds calls (an MCP tool's approval policy), so a call with a hold is an MCP call."""
    number = task_id.removeprefix(PREFIX)
    if not task_id.startswith(PREFIX) or not number.isdigit():
        raise _not_found(task_id)
    held = mcp_holds.where(int(number))
    if held is None or held.call.tenant_id != tenant.pk:  # never held, or another tenant's
        raise _not_found(task_id)
    return held


def detailed(task_id: str, tenant, result_of) -> dict:
    """`tasks/get`: working while the hold waits or its execution is not settled; completed with the call's result
    (the kept result of the one execution, or the refusal as `isError`); cancelled when the client withdrew it."""
    held = _held(task_id, tenant)
    if held.cancelled:
        return _task(held, "cancelled", held.refusal)
    answer = mcp_calls.held_answer(held.call.pk, held=held) or mcp_calls.absorbed_plain(held.call)
    call = held.call
    if answer.waiting or call.state in mcp_calls.IN_FLIGHT or call.state in mcp_calls.BEING_CONFIRMED:
        return _task(held, "working", answer.text)
    result = result_of(answer).model_dump(by_alias=True, mode="json", exclude_none=True)
    return {**_task(held, "completed", answer.text), "result": result}


def cancel(task_id: str, tenant, actor: Actor) -> dict:
    """`tasks/cancel`: withdraws the hold while nobody approved it; acknowledged either way (cooperative)."""
    held = _held(task_id, tenant)
    cancel_held(held.call.pk, actor)
    return {}


def update(task_id: str, tenant) -> dict:
    """`tasks/update`: acknowledged; the gateway never asks for input, so no response is outstanding."""
    _held(task_id, tenant)
    return {}


def install(server, run, caller_of, result_of) -> None:
    """Serve the extension on the gateway's lowlevel server: advertised in its capabilities, its three methods
    answered for clients that declared it (-32021 otherwise), each a database step on `run`."""
    server.extensions[TASKS] = {}

    def method(fn):
        async def handler(ctx: Any, params: TaskParams) -> dict:
            require_client_extension(ctx, TASKS)

            def step():
                caller = caller_of(ctx, {})
                return fn(params.task_id, caller)

            return await run(step)

        return handler

    server.add_request_handler(
        "tasks/get", TaskParams, method(lambda task_id, caller: detailed(task_id, caller.tenant, result_of))
    )
    server.add_request_handler(
        "tasks/cancel",
        TaskParams,
        method(lambda task_id, caller: cancel(task_id, caller.tenant, Actor.for_token(caller.token))),
    )
    server.add_request_handler(
        "tasks/update", UpdateParams, method(lambda task_id, caller: update(task_id, caller.tenant))
    )

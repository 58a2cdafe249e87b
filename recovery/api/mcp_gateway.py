"""The MCP recovery gateway (docs/mcp-gateway.md): an MCP server on the official SDK, Streamable HTTP at /mcp behind
a bearer API token (its tenant is the calls' tenant), offering the registry's MCP tools and passing every `tools/call`
through the same services as the JSON API: registered, admitted, forwarded once, its outcome classified.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import anyio
import mcp_types as types
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from recovery.api import mcp_tasks
from recovery.audit.chain import Actor
from recovery.models import Call, Tool
from recovery.providers.mcp import facts_of_forward, forward
from recovery.providers.mcp import list_tools as upstream_tools
from recovery.providers.mcp_upstream import POOL
from recovery.services import mcp_calls
from recovery.services.tokens import token_authenticate

TOKEN = "recovery.token"
PROGRESS_EVERY_S = 1.0  # a held client hears from the gateway at least this often (the promise is every 2 s)


async def _db(fn, *args):
    """A database step on a worker thread (Django's ORM is synchronous), on that thread's connection.

    The connection is kept for the thread's next step, as a web worker keeps its own between requests (CONN_MAX_AGE,
    health-checked, closed when too old or broken): opening one per step cost four connection set-ups per call, and
    no prepared statement ever outlived its step (`manage.py bench mcp`, docs/mcp-gateway.md "The gateway's cost").
    """

    def run():
        close_old_connections()
        try:
            return fn(*args)
        finally:
            with _KEPT_LOCK:
                _KEPT.add(connections[DEFAULT_DB_ALIAS])

    return await anyio.to_thread.run_sync(run)


# The worker threads' connections kept between steps, closed when the gateway ends (its lifespan): the threads may
# outlive it (a test's gateway), and their connections must not.
_KEPT: set = set()
_KEPT_LOCK = threading.Lock()


def close_kept_connections() -> None:
    with _KEPT_LOCK:
        kept = list(_KEPT)
        _KEPT.clear()
    for wrapper in kept:
        wrapper.inc_thread_sharing()  # closed from this thread: Django's way to let it
        try:
            wrapper.close()
        finally:
            wrapper.dec_thread_sharing()


def _caller(ctx: Any, meta: dict) -> mcp_calls.Caller:
    request = ctx.request
    token = request.scope[TOKEN]
    tenant = min(token.tenant_list, key=lambda owner: owner.pk)  # read with the token: no statement
    params = ctx.session.client_params
    info = params.client_info if params is not None else meta.get(types.CLIENT_INFO_META_KEY)
    name = getattr(info, "name", None) or (info.get("name") if isinstance(info, dict) else "") or ""
    version = getattr(info, "version", None) or (info.get("version") if isinstance(info, dict) else "") or ""
    return mcp_calls.Caller(
        token=token,
        tenant=tenant,
        client_name=str(name),
        client_version=str(version),
        session_id=request.headers.get("mcp-session-id", ""),
        traceparent=str(meta.get("traceparent") or request.headers.get("traceparent", "")),
    )


def offered(tools: list[Tool]) -> dict[str, Tool]:
    """Tools by the name offered: the server's own, prefixed by the provider's name where two servers share it."""
    names = [tool.mcp["tool"] for tool in tools]
    return {
        (f"{t.provider.name}_{t.mcp['tool']}" if names.count(t.mcp["tool"]) > 1 else t.mcp["tool"]): t for t in tools
    }


def _schema(tool: Tool) -> dict:
    return tool.args_schema if tool.args_schema.get("type") == "object" else {"type": "object"}


def _listed(name: str, tool: Tool) -> types.Tool:
    return types.Tool(name=name, description=tool.description or None, input_schema=_schema(tool))


# The input schema of each tool by the name offered, as this process last read it from the registry (every listing
# and every call reads the tenant's tools): what the SDK checks a call's Mcp-Param-* headers against before dispatch.
# Without it the SDK runs the whole tools/list handler — a database read — before every tools/call (`bench mcp`,
# docs/mcp-gateway.md "The gateway's cost"). A name not read yet has none: that call's headers go unchecked (the SDK
# fails open the same way when a listing fails); its arguments are checked against the registry's schema regardless.
_SCHEMAS: dict[str, dict] = {}


def _remember(tools: dict[str, Tool]) -> None:
    _SCHEMAS.update({name: _schema(tool) for name, tool in tools.items()})


def input_schema(name: str) -> dict | None:
    return _SCHEMAS.get(name)


async def _unregistered(registered: dict[str, Tool], providers: list) -> dict[str, tuple[Any, Any]]:
    """The tools of `expose_unregistered` servers the registry does not describe, by the name offered: (provider,
    the server's listing). Their annotations are never passed on or acted on."""
    found: dict[str, tuple[Any, Any]] = {}
    for provider in providers:
        known = {t.mcp["tool"] for t in registered.values() if t.provider_id == provider.pk}
        for listed in await upstream_tools(provider):
            if listed.name not in known:
                clash = listed.name in registered or listed.name in found
                found[f"{provider.name}_{listed.name}" if clash else listed.name] = (provider, listed)
    return found


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    def read():
        caller = _caller(ctx, {})
        return offered(mcp_calls.offered_tools(caller.tenant)), mcp_calls.exposing_providers(caller.tenant)

    tools, exposing = await _db(read)
    _remember(tools)
    listed = [_listed(name, tool) for name, tool in tools.items()]
    for name, (_, tool) in (await _unregistered(tools, exposing)).items():
        listed.append(types.Tool(name=name, description=tool.description, input_schema=tool.input_schema))
    return types.ListToolsResult(tools=listed)


def _result(text: str, *, is_error: bool, recovery: dict, upstream: Any = None) -> types.CallToolResult:
    structured: dict = {}
    content: list = [types.TextContent(text=text)]
    if upstream is not None:
        content = list(upstream.content)
        if isinstance(upstream.structured_content, dict):
            structured = dict(upstream.structured_content)
    structured["recovery"] = recovery
    return types.CallToolResult(content=content, structured_content=structured, is_error=is_error)


def _absorbed(answer: mcp_calls.Answer) -> types.CallToolResult:
    text = answer.text
    if answer.result is not None:
        text = f"{text}\n{json.dumps(answer.result, sort_keys=True)}"
    return _result(text, is_error=answer.is_error, recovery=answer.recovery)


def _answered(begun: mcp_calls.Begun, done, outcome: dict) -> types.CallToolResult:
    recovery = {
        "call_id": begun.call.pk,
        "call_state": outcome["call_state"],
        "failure": outcome["failure"],
        "decision": outcome["decision"],
        "provider_ref": outcome["provider_ref"] or None,
    }
    if outcome["call_state"] == "COMMITTED" or (outcome["failure"] is None and done.result is not None):
        return _result("", is_error=False, recovery=recovery, upstream=done.result)
    message = (outcome["failure"] or {}).get("public_message") or f"The call ended {outcome['call_state']}."
    return _result(message, is_error=True, recovery=recovery)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult | dict:
    meta = dict(params.meta or {})
    arguments = params.arguments or {}

    def start(tool: Tool | None = None):
        caller = _caller(ctx, meta)
        tools = offered(mcp_calls.offered_tools(caller.tenant))
        _remember(tools)
        tool = tool or tools.get(params.name)
        if tool is None:
            return caller, tools, mcp_calls.exposing_providers(caller.tenant)
        return caller, tools, mcp_calls.begin(caller, tool, arguments, meta)

    caller, tools, begun = await _db(start)
    if isinstance(begun, list):  # not a registry tool: one of an expose_unregistered server's, or none
        found = (await _unregistered(tools, begun)).get(params.name)
        if found is None:
            return _absorbed(mcp_calls.Answer(f"{params.name!r} is not a tool offered here.", True, {}))
        provider, listed = found
        wire = listed.model_dump(by_alias=True, exclude_none=True)
        tool = await _db(mcp_calls.register_unregistered, provider, wire, Actor.for_token(caller.token))
        caller, tools, begun = await _db(start, tool)
    if isinstance(begun, mcp_calls.Answer):
        if begun.waiting and mcp_tasks.declared(ctx):  # a task handle instead of a wait (docs/mcp-gateway.md, "Tasks")
            return await _db(mcp_tasks.handle, begun.recovery["call_id"], begun.text)
        if begun.waiting and _progress_token(ctx, params) is not None:
            begun = await _hold(ctx, begun)
        return _absorbed(begun)
    with anyio.CancelScope(shield=True):  # a client that disconnects does not cancel a forwarded write
        done = await forward(begun.tool.provider, begun.tool.mcp["tool"], begun.arguments, begun.meta, begun.tool.name)
        outcome = await _db(mcp_calls.finish, begun, facts_of_forward(begun.tool, done), caller)
    return _answered(begun, done, outcome)


def _progress_token(ctx: Any, params: Any) -> str | int | None:
    """The client's `params._meta.progressToken`: only a client that sent one is held while its call waits."""
    for meta in (getattr(ctx, "meta", None), params.meta):
        if isinstance(meta, dict):
            token = meta.get("progress_token", meta.get("progressToken"))
            if isinstance(token, str | int) and not isinstance(token, bool):
                return token
    return None


async def _hold(ctx: Any, answer: mcp_calls.Answer) -> mcp_calls.Answer:
    """Hold a client that sent a progressToken while its call waits for approval (docs/mcp-gateway.md, "Approval
    holds"): `notifications/progress` every PROGRESS_EVERY_S, the hold read again each time, up to the tool's
    `hold_s`; then where it stands — the kept result, the refusal, or still "waiting for approval: call N"."""
    call_id = answer.recovery["call_id"]
    started = anyio.current_time()
    while answer.waiting and anyio.current_time() - started < answer.hold_s:
        waited = anyio.current_time() - started
        await ctx.session.report_progress(round(waited, 1), answer.hold_s, answer.text)
        await anyio.sleep(min(PROGRESS_EVERY_S, max(0.0, answer.hold_s - waited)))
        answer = await _db(mcp_calls.held_answer, call_id) or await _db(_where_it_stands, call_id)
    return answer


def _where_it_stands(call_id: int) -> mcp_calls.Answer:
    return mcp_calls.absorbed_plain(Call.objects.get(pk=call_id))


def mcp_server() -> Server:
    server = Server(
        "recovery-console",
        version="1",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=input_schema,
    )
    mcp_tasks.install(server, _db, _caller, _absorbed)
    return server


class BearerToken:
    """The API token in `Authorization: Bearer`, read before the MCP app sees the request: 401 without a live one."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, raw = header.partition(" ")
        token = await _db(token_authenticate, raw.strip()) if scheme.lower() == "bearer" and raw.strip() else None
        if token is None:
            body = {"error": "unauthenticated", "message": "send a valid API token: Authorization: Bearer <token>"}
            response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            return await response(scope, receive, send)
        scope[TOKEN] = token
        return await self.app(scope, receive, send)


def gateway_app(host: str = "127.0.0.1") -> Starlette:
    """The gateway's ASGI app: /mcp, stateful Streamable HTTP (a legacy client's session names its task)."""
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = mcp_server().streamable_http_app(streamable_http_path="/mcp", transport_security=security, host=host)
    return UpstreamLifespan(BearerToken(app))


class UpstreamLifespan:
    """The gateway's lifetime is its upstream sessions' (recovery/providers/mcp_upstream.py): opened with the app's
    lifespan, and every server process it started stopped when it ends."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)
        try:
            await POOL.serve(lambda: self.app(scope, receive, send))
        finally:
            await anyio.to_thread.run_sync(close_kept_connections)  # Django's close() is synchronous only

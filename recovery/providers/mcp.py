"""MCP servers as providers (docs/mcp-gateway.md): connecting to one (a stdio command the registry names, or a
Streamable HTTP URL), listing its tools, forwarding one `tools/call` with no retry underneath, turning what came back
into the wire facts classification reads, and asking a tool's status tool what became of a write.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from recovery.engine.reconcile import Observation
from recovery.engine.redact import redact
from recovery.engine.types import ErrorFacts, Facts
from recovery.engine.validation import MISSING, resolve
from recovery.models import Call, Provider, Tool
from recovery.providers.mcp_upstream import POOL, Upstream, UpstreamDown
from recovery.providers.status import StatusAnswer, outbound_headers

INVALID_PARAMS = -32602  # JSON-RPC: the arguments were refused, nothing executed
KEY_META = "io.modelcontextprotocol/idempotency-key"  # the key forwarded to servers that understand it (SEP-3182)
DEFAULT_TIMEOUT_S = 30
CONNECT_S = 15  # at least this long for a stdio server to start and answer the handshake


def server_of(provider: Provider) -> StdioServerParameters | str:
    """How to reach the provider's server: its command (environment variables passed by name) or its URL."""
    mcp = provider.mcp
    if "url" in mcp:
        return mcp["url"]
    env = {name: os.environ[name] for name in mcp.get("env_names", []) if name in os.environ}
    return StdioServerParameters(command=mcp["command"], args=list(mcp.get("args", [])), env=env, cwd=mcp.get("cwd"))


def client_for(provider: Provider) -> Client:
    """A client of the provider's server; Streamable HTTP carries the provider's auth header."""
    server = server_of(provider)
    if isinstance(server, str):
        headers, _ = outbound_headers(provider)
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(provider.read_timeout_s))
        return Client(streamable_http_client(server, http_client=http), cache=None)
    return Client(server, cache=None)


def timeout_of(provider: Provider) -> float:
    return float(provider.mcp.get("call_timeout_s", DEFAULT_TIMEOUT_S))


async def list_tools(provider: Provider) -> list[Any]:
    """The server's tools/list: over the gateway's kept session of a stdio server, else on a connection of its own."""
    upstream = _pooled(provider)
    if upstream is not None:
        client = await upstream.session(max(provider.connect_timeout_s, CONNECT_S))
        return list((await client.list_tools()).tools)
    async with client_for(provider) as client:
        return list((await client.list_tools()).tools)


@dataclass
class Forwarded:
    """What became of one forwarded call: the server's result, or the error the exchange ended with."""

    result: Any = None  # a CallToolResult
    error: BaseException | None = None
    connected: bool = False  # the connection to the server was up when the call was sent
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None


async def forward_once(provider: Provider, name: str, arguments: dict, meta: dict) -> Forwarded:
    """Send one `tools/call` on a connection of its own (a stdio server started for it); never retried. Shielded: a
    client that disconnects does not cancel a forwarded write."""
    done = Forwarded()
    call_s = timeout_of(provider)
    with anyio.CancelScope(shield=True):
        try:
            # The server's start and handshake have their own allowance; the call's timeout counts from its send.
            with anyio.fail_after(max(provider.connect_timeout_s, CONNECT_S) + call_s + 1):
                async with client_for(provider) as client:
                    done.connected = True
                    with anyio.fail_after(call_s):  # nested in the client's scopes: counted from the send
                        done.result = await client.call_tool(name, arguments, meta=meta or None)
        except Exception as exc:  # every way the exchange can end is a fact for classification
            done.error = _leaf(exc)
    done.finished_at = datetime.now(UTC)
    return done


async def forward(provider: Provider, name: str, arguments: dict, meta: dict, tool: str = "") -> Forwarded:
    """Send one `tools/call` of registry tool `tool`; never retried. A stdio server's call goes over the gateway
    process's long-lived session of it (recovery/providers/mcp_upstream.py), else on a connection of its own."""
    upstream = _pooled(provider)
    if upstream is None:
        return await forward_once(provider, name, arguments, meta)
    done = Forwarded()
    with anyio.CancelScope(shield=True):
        try:
            client = await upstream.session(max(provider.connect_timeout_s, CONNECT_S))
        except UpstreamDown as exc:
            done.error = exc  # the request provably never left
        else:
            done.connected = True
            await _call_on(upstream, client, done, tool, (name, arguments, meta, timeout_of(provider)))
    done.finished_at = datetime.now(UTC)
    return done


async def _call_on(upstream: Upstream, client: Client, done: Forwarded, tool: str, call: tuple) -> None:
    name, arguments, meta, call_s = call
    counted = upstream.in_flight
    counted[tool] += 1
    lost = True
    try:
        with anyio.fail_after(call_s):
            done.result = await client.call_tool(name, arguments, meta=meta or None)
        lost = False
    except TimeoutError as exc:
        done.error, lost = exc, False  # the session lives on; the call is UNKNOWN all the same
    except MCPError as exc:
        done.error = exc
        lost = exc.error.code == CONNECTION_CLOSED
    except Exception as exc:  # the stream broke under the call
        done.error = _leaf(exc)
    if lost:
        upstream.dead.set()  # its death is counted on the call's own report, not again on its tool's breaker
    else:
        counted[tool] -= 1


def _pooled(provider: Provider) -> Upstream | None:
    """The gateway process's session of a stdio provider's server (None: a Streamable HTTP one, or not the gateway)."""
    if "url" in provider.mcp:
        return None
    return POOL.upstream(_pool_key(provider), lambda: client_for(provider), _deaths_counted(provider.pk))


def _pool_key(provider: Provider) -> tuple:
    return (provider.pk, json.dumps(provider.mcp, sort_keys=True))


def _deaths_counted(provider_id: int):
    async def on_death(in_flight: Counter) -> None:
        await anyio.to_thread.run_sync(_count_death, provider_id, {name for name, n in in_flight.items() if n > 0})

    return on_death


def _count_death(provider_id: int, reported: set[str]) -> None:
    """A death of the provider's server: one failure on the breaker of each of its tools (but those whose call died
    with it: that call's report counts it)."""
    from django.db import close_old_connections, connections

    from recovery.services.breakers import breaker_record

    close_old_connections()
    try:
        now = datetime.now(UTC)
        for tool in Tool.objects.filter(provider_id=provider_id).exclude(name__in=reported):
            breaker_record(tool, counts_as_failure=True, probe=False, now=now)
    finally:
        connections.close_all()


def _leaf(exc: BaseException) -> BaseException:
    """The error itself, out of the task groups the SDK's transports wrap it in."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _text(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content if getattr(block, "type", "") == "text")


def provider_ref(tool: Tool, result: Any) -> str | None:
    """The write's reference: a structuredContent path, or the first group of a regular expression over the text."""
    spec = tool.mcp
    if spec.get("ref_path") and isinstance(result.structured_content, dict):
        value = resolve(result.structured_content, spec["ref_path"])
        if value is not MISSING and value is not None:
            return str(value)
    if spec.get("ref_regex"):
        found = re.search(spec["ref_regex"], _text(result))
        if found:
            return found.group(1) if found.groups() else found.group(0)
    return None


def result_body(result: Any) -> dict:
    """What is kept of a result: its structured content, else its text."""
    if isinstance(result.structured_content, dict):
        return result.structured_content
    return {"text": _text(result)}


def _timing(done: Forwarded) -> dict:
    return {"started_at": done.started_at, "finished_at": done.finished_at}


def facts_of_forward(tool: Tool, done: Forwarded) -> Facts:
    """The wire facts of a forwarded call (docs/mcp-gateway.md's outcome table)."""
    if done.error is not None:
        return _error_facts(done)
    result = done.result
    text = _text(result)
    if result.is_error:
        code = next((c for c in tool.refusal_codes if c in text), None)
        if code is not None:
            return Facts(sent=True, http_status=422, error=ErrorFacts(code=code, message=redact(text)), **_timing(done))
        return Facts(
            sent=True, http_status=502, error=ErrorFacts(code="mcp_is_error", message=redact(text)), **_timing(done)
        )
    if tool.mcp.get("error_pattern") and re.search(tool.mcp["error_pattern"], text):
        # A success whose text says it failed: a write's reference is not trusted from it (the missing-reference hard
        # stop: invalid result, a person looks); a read's answer is not used (transient).
        if tool.side_effect == "read":
            error = ErrorFacts(code="mcp_error_text", message=redact(text))
            return Facts(sent=True, http_status=502, error=error, **_timing(done))
        return Facts(sent=True, http_status=200, result={"mcp_error_text": True}, **_timing(done))
    return Facts(
        sent=True,
        http_status=200,
        result=result_body(result),
        provider_request_id=provider_ref(tool, result),
        **_timing(done),
    )


def _error_facts(done: Forwarded) -> Facts:
    exc = done.error
    message = redact(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, MCPError) and exc.error.code == INVALID_PARAMS:
        return Facts(
            sent=True, http_status=422, error=ErrorFacts(code="invalid_params", message=message), **_timing(done)
        )
    if not done.connected:
        # The server never answered the connection: the request provably never left.
        return Facts(
            connection_opened=False,
            sent=False,
            error=ErrorFacts(kind="connection_refused", message=message),
            **_timing(done),
        )
    timed_out = isinstance(exc, TimeoutError) or (isinstance(exc, MCPError) and exc.error.code == REQUEST_TIMEOUT)
    kind = "read_timeout" if timed_out else "reset"
    return Facts(connection_opened=True, sent=None, error=ErrorFacts(kind=kind, message=message), **_timing(done))


def upstream_request(tool: Tool, arguments: dict, key: str) -> dict:
    """The exact `tools/call` the gateway sends for this call: the server, its tool name, the arguments as sent (a
    marker's trailer included) and the `_meta` carrying the intent key."""
    return {
        "server": tool.provider.name,
        "tool": tool.mcp["tool"],
        "arguments": forwarded_arguments(tool, arguments, key),
        "_meta": {KEY_META: key},
    }


def forwarded_arguments(tool: Tool, arguments: dict, key: str) -> dict:
    """The arguments sent: a write whose tool carries a marker gets the intent key appended as a trailer."""
    marker = tool.mcp.get("marker")
    if not marker or tool.side_effect != "write" or not isinstance(arguments.get(marker["argument"]), str):
        return dict(arguments)
    text = arguments[marker["argument"]].rstrip("\n")
    return {**arguments, marker["argument"]: f"{text}\n\n{marker['trailer']}: {key}\n"}


# --- the status tool -------------------------------------------------------------------------------------------------


def _fill(template: str, call: Call) -> str:
    values = {"key": call.idempotency_key, "ref": call.provider_ref or ""}
    values.update({f"args.{k}": str(v) for k, v in (call.arguments or {}).items()})
    return re.sub(r"\{([a-z_.0-9]+)\}", lambda m: values.get(m.group(1), m.group(0)), template)


def status_arguments(tool: Tool, call: Call) -> dict:
    spec = tool.mcp["status_tool"]
    return {name: _fill(v, call) if isinstance(v, str) else v for name, v in spec.get("arguments", {}).items()}


def read_status_result(tool: Tool, call: Call, result: Any) -> StatusAnswer:
    """The status tool's answer mapped: the marker found is committed (its count the effects), a pending pattern is
    pending, anything else not committed. The match rests on the intent key the call carried, never on content."""
    spec, text = tool.mcp["status_tool"], _text(result)
    record = {"method": "tools/call", "url": spec["tool"], "headers": {}}
    response = {"status": 200, "body": redact(text[:4000])}
    if result.is_error:
        return StatusAnswer(observed=Observation.FAILED, request=record, response=response, error=redact(text))
    marker = re.escape(call.idempotency_key)
    found = re.findall(spec["committed_regex"].replace("{key}", marker), text)
    if found:
        ref = provider_ref(tool, result) or ""
        return StatusAnswer(
            observed=Observation.COMMITTED, effects=len(found), provider_ref=ref, request=record, response=response
        )
    pending = spec.get("pending_regex")
    if pending and re.search(pending, text):
        return StatusAnswer(observed=Observation.PENDING, request=record, response=response)
    return StatusAnswer(observed=Observation.NOT_COMMITTED, effects=0, request=record, response=response)


def query_mcp_status(tool: Tool, call: Call) -> StatusAnswer:
    """Call the tool's status tool once, on a connection of its own (the reconcile worker's thread)."""
    spec = tool.mcp["status_tool"]
    arguments = status_arguments(tool, call)
    done = anyio.run(forward_once, tool.provider, spec["tool"], arguments, {})
    if done.error is not None:
        error = redact(f"{type(done.error).__name__}: {done.error}")
        record = {"method": "tools/call", "url": spec["tool"], "headers": {}}
        return StatusAnswer(observed=Observation.FAILED, request=record, error=error, endpoint_failed=True)
    return read_status_result(tool, call, done.result)

"""The gateway with the reference memory server (npm, writes without keys) and mcp-server-time (reads): each one's
happy path, a re-issue and one fault (docs/mcp-gateway.md); and a stdio client through the bridge of the client
distribution (recovery-mcp-stdio). The memory server deduplicates by content, so its file
cannot show a double execution: effects are counted from the calls our fault proxy forwarded.
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from recovery.audit.chain import Actor
from recovery.devtools.mcp_stage import (
    MEMORY_SERVER,
    ROOT,
    TIME_SERVER,
    client,
    fault_command,
    forwarded,
    memory_registry,
    run_async,
    set_fault,
    time_registry,
)
from recovery.models import Call
from recovery.registry import load_registry
from recovery.services.reconcile import reconcile_call
from recovery.services.tokens import token_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mcp_servers")]
ADA = {"entities": [{"name": "Ada", "entityType": "person", "observations": ["likes tea"]}]}


@pytest.fixture
def memory(tmp_path, control, monkeypatch) -> str:
    monkeypatch.setenv("MEMORY_FILE_PATH", str(tmp_path / "memory.jsonl"))
    load_registry(memory_registry(fault_command([str(MEMORY_SERVER)], control)), actor=Actor.system("tests"))
    _, token = token_create(name="agent", tenants=["acme"], actor=Actor.system("tests"))
    return token


def _calls(url: str, token: str, *calls):
    async def go():
        async with client(url, token) as mcp:
            return [await mcp.call_tool(name, arguments) for name, arguments in calls]

    return run_async(go)


def _recovery(result) -> dict:
    return result.structured_content["recovery"]


def test_a_memory_write_commits_with_its_reference_and_a_reissue_is_answered_not_sent(
    gateway, memory, control, tmp_path
):
    created, again, graph = _calls(
        gateway.url, memory, ("create_entities", ADA), ("create_entities", ADA), ("read_graph", {})
    )
    assert not created.is_error
    call = Call.objects.get(tool__name="memory.create_entities")
    assert (call.state, call.provider_ref) == ("COMMITTED", "Ada")
    assert not again.is_error and _recovery(again)["replayed_from_call"] == call.pk
    assert [e["name"] for e in graph.structured_content["entities"]] == ["Ada"]
    assert [f["name"] for f in forwarded(control)] == ["create_entities", "read_graph"]  # the write went once
    assert [json.loads(line)["name"] for line in (tmp_path / "memory.jsonl").read_text().splitlines()] == ["Ada"]


def test_a_memory_write_whose_reply_is_lost_goes_to_a_person_and_is_never_sent_again(gateway, memory, control):
    set_fault(control, "drop_reply", "create_entities")
    lost, reissued = _calls(gateway.url, memory, ("create_entities", ADA), ("create_entities", ADA))
    call = Call.objects.get()
    assert lost.is_error and call.state == "UNKNOWN"
    assert reissued.is_error and f"still being confirmed (call {call.pk})" in reissued.content[0].text
    reconcile_call(call.pk, worker="tests")
    call.refresh_from_db()
    assert call.state == "HUMAN_REVIEW"  # no status tool: a person settles it, with the evidence
    assert [f["name"] for f in forwarded(control)] == ["create_entities"]


def test_a_time_read_whose_server_is_killed_mid_call_is_transient_and_the_next_read_runs(gateway, control):
    registry = time_registry()
    registry["providers"][0]["mcp"] = fault_command([str(TIME_SERVER), "--local-timezone", "UTC"], control)
    load_registry(registry, actor=Actor.system("tests"))
    _, token = token_create(name="agent", tenants=["acme"], actor=Actor.system("tests"))
    set_fault(control, "kill", "get_current_time")
    killed, read = _calls(gateway.url, token, *[("get_current_time", {"timezone": "UTC"})] * 2)
    assert killed.is_error and _recovery(killed)["failure"]["class"] == "transient"
    assert not read.is_error and read.structured_content["timezone"] == "UTC"
    assert len(forwarded(control)) == 2  # a read always executes, also after a failure


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_stdio_client_reaches_the_gateway_through_the_bridge(gateway, mode):
    load_registry(time_registry(), actor=Actor.system("tests"))
    _, token = token_create(name="agent", tenants=["acme"], actor=Actor.system("tests"))
    bridge = StdioServerParameters(
        command=sys.executable,
        args=["-m", "recovery_client.mcp_stdio", "--url", gateway.url, "--token-env", "RECOVERY_TOKEN"],
        env={"RECOVERY_TOKEN": token, "PYTHONPATH": str(ROOT / "clients" / "python" / "src")},
    )

    async def go():
        async with Client(bridge, mode=mode, cache=None) as mcp:
            listed = [tool.name for tool in (await mcp.list_tools()).tools]
            return listed, await mcp.call_tool("get_current_time", {"timezone": "UTC"})

    listed, result = run_async(go)
    assert listed == ["get_current_time"]
    assert not result.is_error and _recovery(result)["call_state"] == "COMMITTED"
    assert Call.objects.get().state == "COMMITTED"


def test_the_openai_agents_sdk_calls_the_gateways_tools_as_an_agents_tools(gateway):
    agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (requirements-adoption.txt)")
    from agents.mcp import MCPServerStreamableHttp
    from agents.tool_context import ToolContext

    load_registry(time_registry(), actor=Actor.system("tests"))
    _, token = token_create(name="agent", tenants=["acme"], actor=Actor.system("tests"))
    params = {"url": gateway.url, "headers": {"Authorization": f"Bearer {token}"}}

    async def go():
        server = MCPServerStreamableHttp(params=params, client_session_timeout_seconds=30)
        await server.connect()
        try:
            agent = agents.Agent(name="clock", mcp_servers=[server])
            (tool,) = await agent.get_all_tools(agents.RunContextWrapper(context=None))
            payload = json.dumps({"timezone": "UTC"})
            context = ToolContext(context=None, tool_name=tool.name, tool_call_id="c-1", tool_arguments=payload)
            return tool.name, await tool.on_invoke_tool(context, payload)
        finally:
            await server.cleanup()

    name, answer = run_async(go)
    assert name == "get_current_time"
    assert '"timezone": "UTC"' in str(answer) or "'timezone': 'UTC'" in str(answer)
    assert Call.objects.get().state == "COMMITTED"


def test_an_upstream_over_streamable_http_gets_the_providers_auth(gateway, monkeypatch):
    """An upstream server by URL (here a small one on the SDK, which counts what it executed and which token it
    saw), with the provider's bearer auth from the environment."""
    import threading

    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp.server.transport_security import TransportSecuritySettings

    from recovery.devtools.mcp_stage import free_port

    executed: list[str] = []
    tokens: set[str] = set()
    upstream = MCPServer("counter")

    @upstream.tool()
    def bump(label: str) -> dict:
        """Count one."""
        executed.append(label)
        return {"label": label, "count": len(executed)}

    def with_auth(app):
        async def check(scope, receive, send):
            if scope["type"] == "http":
                headers = dict(scope["headers"])
                tokens.add(headers.get(b"authorization", b"").decode())
            return await app(scope, receive, send)

        return check

    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = with_auth(upstream.streamable_http_app(transport_security=security))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        monkeypatch.setenv("COUNTER_TOKEN", "counter-secret")
        registry = {
            "tenants": [{"name": "acme", "tools": "*"}],
            "providers": [
                {
                    "name": "counter",
                    "auth": {"kind": "bearer", "secret_env": "COUNTER_TOKEN"},
                    "mcp": {"url": f"http://127.0.0.1:{port}/mcp"},
                }
            ],
            "tools": [
                {
                    "name": "counter.bump",
                    "provider": "counter",
                    "side_effect": "write",
                    "args_schema": {"type": "object", "properties": {"label": {"type": "string"}}},
                    "mcp": {"tool": "bump", "ref_path": "count", "ref_regex": '"count": (\\d+)'},
                }
            ],
        }
        load_registry(registry, actor=Actor.system("tests"))
        _, token = token_create(name="agent", tenants=["acme"], actor=Actor.system("tests"))
        first, again = _calls(gateway.url, token, ("bump", {"label": "x"}), ("bump", {"label": "x"}))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    call = Call.objects.get()
    assert not first.is_error and (call.state, call.provider_ref) == ("COMMITTED", "1")
    assert _recovery(again)["replayed_from_call"] == call.pk
    assert executed == ["x"]  # executed once
    assert tokens == {"Bearer counter-secret"}


def test_a_read_whose_text_matches_the_error_pattern_is_not_used(gateway):
    registry = time_registry()
    registry["tools"][0]["mcp"]["error_pattern"] = '"timezone": "UTC"'
    load_registry(registry, actor=Actor.system("tests"))
    _, token = token_create(name="agent", tenants=["acme"], actor=Actor.system("tests"))
    (result,) = _calls(gateway.url, token, ("get_current_time", {"timezone": "UTC"}))
    assert result.is_error and _recovery(result)["failure"]["class"] == "transient"
    assert Call.objects.get().state != "COMMITTED"

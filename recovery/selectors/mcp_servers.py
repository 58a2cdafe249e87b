"""The MCP servers of the registry and their tools, as the breakers page lists them (docs/mcp-gateway.md, "The
console's view"): how each server is reached, whether the gateway exposes the tools the registry does not describe,
and each tool — registered or exposed-unregistered, the server's untrusted hints. Two statements."""

from __future__ import annotations

from dataclasses import dataclass, field

from recovery.models import Provider, Tool
from recovery.providers.mcp import DEFAULT_TIMEOUT_S
from recovery.registry.mcp import REISSUE_WINDOW_S


@dataclass(frozen=True)
class McpServer:
    name: str
    transport: str  # "stdio" or "Streamable HTTP"
    target: str  # the command and its arguments, or the URL
    expose_unregistered: bool
    reissue_window_s: int
    call_timeout_s: int
    tools: list[Tool] = field(default_factory=list)


def mcp_servers() -> list[McpServer]:
    servers = []
    providers = list(Provider.objects.exclude(mcp={}).order_by("name"))
    tools = Tool.objects.filter(provider__in=providers).exclude(mcp={}).order_by("name")
    by_provider: dict[int, list[Tool]] = {}
    for tool in tools:
        by_provider.setdefault(tool.provider_id, []).append(tool)
    for provider in providers:
        mcp = provider.mcp
        stdio = bool(mcp.get("command"))
        target = " ".join([str(mcp.get("command", "")), *map(str, mcp.get("args", []))]) if stdio else mcp.get("url")
        servers.append(
            McpServer(
                name=provider.name,
                transport="stdio" if stdio else "Streamable HTTP",
                target=str(target or ""),
                expose_unregistered=bool(mcp.get("expose_unregistered")),
                reissue_window_s=int(mcp.get("reissue_window_s", REISSUE_WINDOW_S)),
                call_timeout_s=int(mcp.get("call_timeout_s", DEFAULT_TIMEOUT_S)),
                tools=by_provider.get(provider.pk, []),
            )
        )
    return servers

"""The registry's MCP entries (docs/mcp-gateway.md): a provider that is an MCP server (a stdio command or a Streamable
HTTP URL) and the MCP tool a registry tool stands for (its reference, error text, marker and status tool).
"""

from __future__ import annotations

import re
from typing import Any

from recovery.registry.checks import (
    Context,
    Key,
    boolean,
    check_object,
    child,
    choice,
    dotted,
    env_name,
    integer,
    string,
    string_list,
)

REISSUE_WINDOW_S = 300  # a re-issue of the same write intent within it is absorbed (docs/mcp-gateway.md)
HOLD_S = 120  # how long the gateway holds a client that sent a progressToken while its call waits for approval
TOOL_APPROVAL = ("required", "none")  # a tool's own policy
PROVIDER_APPROVAL = ("high_risk_writes", "none")  # a provider's, for every high-risk write of it


def _regex(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, str) or not value or len(value) > 500:
        ctx.error(path, "must be a regular expression of 1 to 500 characters")
        return False
    try:
        re.compile(value)
    except re.error as exc:
        ctx.error(path, f"is not a regular expression: {exc}")
        return False
    return True


def _url(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, str) or not re.match(r"^https?://[^/@\s]+(/\S*)?$", value):
        ctx.error(path, "must be an http:// or https:// URL without credentials (the Streamable HTTP endpoint)")
        return False
    return True


def _object(spec: dict[str, Key], what: str) -> Key:
    def check(ctx: Context, value: Any, path: str) -> bool:
        passed = check_object(ctx, value, path, spec, what)
        return passed is not None and passed == set(value)

    return Key(check)


def _annotations(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, dict) or not all(isinstance(v, bool | str | None) for v in value.values()):
        ctx.error(path, "must be an object of the server's hints (readOnlyHint, destructiveHint, ...)")
        return False
    return True


def _arguments(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, dict):
        ctx.error(path, "must map each argument of the status tool to a value or a template ({args.x}, {key}, {ref})")
        return False
    return True


MCP_PROVIDER = {
    "command": Key(string(500, empty=False)),
    "args": Key(string_list(string(500))),
    "cwd": Key(string(500, empty=False)),
    "env_names": Key(string_list(env_name)),  # the variables passed on to the server, by name: values never here
    "url": Key(_url),
    "expose_unregistered": Key(boolean),
    "reissue_window_s": Key(integer(1, 86_400)),
    "call_timeout_s": Key(integer(1, 3_600)),
    "approval": Key(choice(*PROVIDER_APPROVAL)),
    "hold_s": Key(integer(1, 3_600)),
}
MARKER = {
    "argument": Key(dotted, required=True),  # the text argument the intent key is appended to
    "trailer": Key(string(100, empty=False), required=True),  # e.g. "Recovery-Intent": a git trailer
}
STATUS_TOOL = {
    "tool": Key(string(200, empty=False), required=True),
    "arguments": Key(_arguments),
    "committed_regex": Key(_regex, required=True),  # matched with the key in place of {key}
    "pending_regex": Key(_regex),
}
MCP_TOOL = {
    "tool": Key(string(200, empty=False), required=True),  # the server's own name for it
    "ref_path": Key(dotted),  # where structuredContent holds the provider's reference
    "ref_regex": Key(_regex),  # or a regular expression over the text whose first group is it
    "error_pattern": Key(_regex),  # a success whose text matches it is an invalid result
    "marker": _object(MARKER, "an MCP marker"),
    "status_tool": _object(STATUS_TOOL, "an MCP status tool"),
    "annotations": Key(_annotations),
    "unregistered": Key(boolean),  # added by the gateway from tools/list (expose_unregistered), not by an admin
    "approval": Key(choice(*TOOL_APPROVAL)),
    "hold_s": Key(integer(1, 3_600)),
}


def check_mcp_providers(ctx: Context, providers: list) -> None:
    for i, provider in enumerate(providers):
        if isinstance(provider, dict):
            _check_provider(ctx, provider, child(child("$", "providers"), i))


def _check_provider(ctx: Context, provider: dict, path: str) -> None:
    """An MCP provider has exactly one of a command and a URL; any other provider needs its base_url."""
    mcp = provider.get("mcp")
    if not isinstance(mcp, dict):
        if "base_url" not in provider:
            ctx.error(child(path, "base_url"), "required in a provider (or mcp, for an MCP server)")
        return
    if ("command" in mcp) == ("url" in mcp):
        ctx.error(child(path, "mcp"), "needs exactly one of command (a stdio server) and url (Streamable HTTP)")


def check_mcp_tool(ctx: Context, tool: dict, path: str) -> None:
    """An MCP tool has no HTTP request; any other tool needs one."""
    if "mcp" not in tool and "request" not in tool:
        ctx.error(child(path, "request"), "required in a tool (or mcp, for a tool of an MCP server)")
    if "mcp" in tool and "request" in tool:
        ctx.error(child(path, "request"), "an MCP tool is called over MCP: remove request")


def needs_approval(tool) -> bool:
    """Whether the tool's calls are held for an approval before their first attempt (docs/mcp-gateway.md, "Approval
    holds"): the tool's own `approval`, else its provider's `high_risk_writes` for a high-risk write."""
    own = (tool.mcp or {}).get("approval")
    if own:
        return own == "required"
    provider = (tool.provider.mcp or {}).get("approval")
    return provider == "high_risk_writes" and tool.side_effect == "write" and tool.risk == "high"


def hold_seconds(tool) -> int:
    """How long the gateway holds a waiting client (with a progressToken) on a held call of `tool`."""
    return int((tool.mcp or {}).get("hold_s") or (tool.provider.mcp or {}).get("hold_s") or HOLD_S)


HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


def registry_stub(provider: str, listed: list[dict]) -> dict:
    """Registry tools for an MCP server's tools/list, for an admin to review before loading: each a high-risk,
    non-replay-safe write (what a tool the registry does not describe is), its args_schema the tool's inputSchema,
    the server's annotations kept as untrusted hints, never used to choose side_effect."""
    tools = []
    for item in listed:
        hints = {key: value for key, value in (item.get("annotations") or {}).items() if key in HINTS}
        mcp: dict = {"tool": item["name"]}
        if hints:
            mcp["annotations"] = hints
        tools.append(
            {
                "name": f"{provider}.{item['name']}"[:100],
                "provider": provider,
                "description": (item.get("description") or "")[:2000],
                "side_effect": "write",
                "risk": "high",
                "replay_safe": False,
                "args_schema": item.get("inputSchema") or {"type": "object"},
                "mcp": mcp,
            }
        )
    return {"tools": tools}

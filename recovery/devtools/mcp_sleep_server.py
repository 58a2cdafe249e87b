"""A small real MCP server for the `mcp` benchmark (docs/benchmarks.md): stdio, on the official SDK, with a read and
a write that each take 50 ms, so the gateway's cost can be set against a tool that does work. The write answers the
reference it made in `structuredContent.id` (the registry's `ref_path`).

    python -m recovery.devtools.mcp_sleep_server
"""

from __future__ import annotations

import itertools
from typing import TypedDict

import anyio
from mcp.server.mcpserver import MCPServer

SLEEP_S = 0.05
server = MCPServer("recovery-bench-sleep", version="1")
_made = itertools.count(1)


class Read(TypedDict):
    n: int


class Made(TypedDict):
    id: str
    n: int


@server.tool()
async def sleep_read(n: int) -> Read:
    """Wait 50 ms and answer n."""
    await anyio.sleep(SLEEP_S)
    return {"n": n}


@server.tool()
async def sleep_write(n: int) -> Made:
    """Wait 50 ms and answer the id of what it made."""
    await anyio.sleep(SLEEP_S)
    return {"id": f"made-{next(_made)}", "n": n}


if __name__ == "__main__":
    server.run("stdio")

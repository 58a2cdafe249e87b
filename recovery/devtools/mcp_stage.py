"""What the MCP gateway's tests and drill share (docs/mcp-gateway.md): the pinned MCP servers (`make test` installs
them into .venv-mcp and tests/mcp-memory),
a throwaway git repository, the registry entries for them, the gateway served on a free port in this process, and
the fault-injecting MCP proxy (recovery/devtools/mcp_fault_proxy.py) between the gateway and an upstream server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent.parent
MCP_BIN = ROOT / ".venv-mcp" / "bin"
GIT_SERVER = MCP_BIN / "mcp-server-git"
TIME_SERVER = MCP_BIN / "mcp-server-time"
MEMORY_SERVER = ROOT / "tests" / "mcp-memory" / "node_modules" / ".bin" / "mcp-server-memory"
FAULT_PROXY = ROOT / "recovery" / "devtools" / "mcp_fault_proxy.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "tests@example.com")
    git(path, "config", "user.name", "tests")
    git(path, "commit", "-q", "--allow-empty", "-m", "start")  # git_log answers an error on a repository without one
    return path


def stage_file(repo: Path, name: str, text: str) -> None:
    (repo / name).write_text(text)
    git(repo, "add", name)


def commits(repo: Path) -> int:
    """The commits made after the repository's first: one per executed git_commit."""
    return int(git(repo, "rev-list", "--count", "HEAD").strip()) - 1


def fault_command(upstream: list[str], control: Path) -> dict:
    """The registry's stdio command for `upstream` behind the fault proxy, which reads its fault from `control`."""
    return {"command": sys.executable, "args": [str(FAULT_PROXY), "--control", str(control), "--", *upstream]}


def set_fault(control: Path, fault: str, tool: str = "", once: bool = True) -> None:
    control.write_text(json.dumps({"fault": fault, "tool": tool, "once": once}))


def forwarded(control: Path) -> list[dict]:
    """The `tools/call` requests the proxy forwarded upstream (its log beside the control file)."""
    log = control.with_suffix(".log")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def git_registry(
    repo: Path, server: dict, *, window_s: int = 300, timeout_s: int = 10, name: str = "git", **extra: dict
) -> dict:
    """The registry entries of docs/mcp-gateway.md for mcp-server-git, with `server` ({command, args}) as its
    command, as provider `name` with tools `<name>.commit` and `<name>.log` for tenant acme; `commit={...}` /
    `log={...}` add or replace keys of those tools."""
    repo_arg = {"type": "string", "minLength": 1}
    registry = {
        "tenants": [{"name": "acme", "tools": "*"}],
        "providers": [{"name": name, "mcp": {**server, "reissue_window_s": window_s, "call_timeout_s": timeout_s}}],
        "tools": [
            {
                "name": f"{name}.commit",
                "provider": name,
                "description": "Record the staged changes as a commit.",
                "side_effect": "write",
                "risk": "high",
                "args_schema": {
                    "type": "object",
                    "properties": {"repo_path": repo_arg, "message": {"type": "string", "minLength": 1}},
                    "required": ["repo_path", "message"],
                },
                "reconcile": {"first_check_s": 0, "max_checks": 3},
                "mcp": {
                    "tool": "git_commit",
                    "ref_regex": "with hash ([0-9a-f]{40})",
                    "error_pattern": "^Error committing",
                    "marker": {"argument": "message", "trailer": "Recovery-Intent"},
                    "status_tool": {
                        "tool": "git_log",
                        "arguments": {"repo_path": "{args.repo_path}", "max_count": 50},
                        "committed_regex": "Recovery-Intent: {key}\\b",
                    },
                },
            },
            {
                "name": f"{name}.log",
                "provider": name,
                "description": "Show the commit history.",
                "side_effect": "read",
                "replay_safe": True,
                "args_schema": {
                    "type": "object",
                    "properties": {"repo_path": repo_arg, "max_count": {"type": "integer", "minimum": 1}},
                    "required": ["repo_path"],
                },
                "mcp": {"tool": "git_log"},
            },
        ],
    }
    for tool, name in ((registry["tools"][0], "commit"), (registry["tools"][1], "log")):
        tool.update(extra.get(name, {}))
    return registry


def time_registry() -> dict:
    return {
        "tenants": [{"name": "acme", "tools": "*"}],
        "providers": [{"name": "time", "mcp": {"command": str(TIME_SERVER), "args": ["--local-timezone", "UTC"]}}],
        "tools": [
            {
                "name": "time.now",
                "provider": "time",
                "description": "The current time in a timezone.",
                "side_effect": "read",
                "replay_safe": True,
                "args_schema": {
                    "type": "object",
                    "properties": {"timezone": {"type": "string", "minLength": 1}},
                    "required": ["timezone"],
                },
                "mcp": {"tool": "get_current_time", "annotations": {"readOnlyHint": True}},
            }
        ],
    }


def memory_registry(server: dict) -> dict:
    """The reference memory server (npm), `server` ({command, args}) its command; its file named by MEMORY_FILE_PATH,
    passed on by name. It has no status tool: an unknown write goes to a person."""
    entity = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "entityType": {"type": "string"},
            "observations": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "entityType", "observations"],
    }
    return {
        "tenants": [{"name": "acme", "tools": "*"}],
        "providers": [{"name": "memory", "mcp": {**server, "env_names": ["MEMORY_FILE_PATH"]}}],
        "tools": [
            {
                "name": "memory.create_entities",
                "provider": "memory",
                "description": "Create entities in the knowledge graph.",
                "side_effect": "write",
                "args_schema": {
                    "type": "object",
                    "properties": {"entities": {"type": "array", "items": entity, "minItems": 1}},
                    "required": ["entities"],
                },
                "mcp": {"tool": "create_entities", "ref_path": "entities.0.name"},
            },
            {
                "name": "memory.read_graph",
                "provider": "memory",
                "description": "Read the whole knowledge graph.",
                "side_effect": "read",
                "replay_safe": True,
                "args_schema": {"type": "object", "properties": {}},
                "mcp": {"tool": "read_graph", "annotations": {"readOnlyHint": True}},
            },
        ],
    }


class Gateway:
    """The gateway's ASGI app under uvicorn on a free port, in a thread of this process (the test's database)."""

    def __init__(self):
        from recovery.api.mcp_gateway import gateway_app

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        config = uvicorn.Config(gateway_app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Gateway:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def client(
    url: str, token: str, *, mode: str = "auto", name: str = "tests", version: str = "1", extensions=None
) -> Client:
    import httpx2
    from mcp_types import Implementation

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30))
    return Client(
        streamable_http_client(url, http_client=http),
        mode=mode,
        cache=None,
        client_info=Implementation(name=name, version=version),
        extensions=extensions,
    )


def run_async(fn, *args):
    return anyio.run(fn, *args)


def missing_servers() -> str | None:
    """Why the MCP servers cannot run here, or None."""
    for path in (GIT_SERVER, TIME_SERVER):
        if not path.exists():
            return f"needs {path.name} in .venv-mcp (make test installs it)"
    if not MEMORY_SERVER.exists():
        return "needs the memory server in tests/mcp-memory (make test installs it with npm)"
    if not os.access(GIT_SERVER, os.X_OK):
        return "mcp-server-git is not executable"
    return None

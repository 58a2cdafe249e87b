"""What the MCP gateway's test modules share (docs/mcp-gateway.md): the servers' check (each module names it in its
pytestmark), a served gateway, a throwaway git repository, the fault proxy's control file and an agent's token."""

from __future__ import annotations

import pytest

from recovery.audit.chain import Actor
from recovery.devtools.mcp_stage import Gateway, git_repo, missing_servers
from recovery.services.tokens import token_create
from tests.conftest import missing_service

__all__ = ["agent_token", "control", "gateway", "mcp_servers", "repo"]  # tests/conftest.py offers the fixtures


@pytest.fixture
def mcp_servers():
    """Skip (or fail under REQUIRE_SERVICES=1) with the reason when the pinned MCP servers are not installed."""
    reason = missing_servers()
    if reason:
        missing_service(reason)


@pytest.fixture
def gateway():
    with Gateway() as served:
        yield served


@pytest.fixture
def repo(tmp_path):
    return git_repo(tmp_path / "repo")


@pytest.fixture
def control(tmp_path):
    """The fault proxy's control file: no fault until a test writes one."""
    path = tmp_path / "fault.json"
    path.write_text("{}")
    return path


def agent_token() -> str:
    """An API token of tenant acme, as an agent's MCP client sends it."""
    _, raw = token_create(name="agent", tenants=["acme"], actor=Actor.system("tests"))
    return raw

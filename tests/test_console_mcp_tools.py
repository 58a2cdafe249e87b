"""The console shows an MCP tool's annotations as the server's untrusted hints, and whether the registry describes
the tool or the gateway exposed it unregistered (docs/mcp-gateway.md), on the tool page and an MCP call's page."""

from __future__ import annotations

import re

import pytest

from recovery.audit.chain import Actor
from recovery.devtools.mcp_stage import time_registry
from recovery.models import Tool
from recovery.models.roles import VIEWER
from recovery.registry import load_registry
from tests.console import make_people, signed_in

pytestmark = pytest.mark.django_db


def _registry() -> dict:
    registry = time_registry()
    exposed = {
        "name": "time.convert_time",
        "provider": "time",
        "side_effect": "write",
        "risk": "high",
        "replay_safe": False,
        "args_schema": {"type": "object"},
        "mcp": {
            "tool": "convert_time",
            "annotations": {"readOnlyHint": True, "destructiveHint": False},
            "unregistered": True,
        },
    }
    registry["tools"].append(exposed)
    return registry


def _hints(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-fact="mcp-hint" data-hint="(\w+)" data-value="([^"]*)"', html))


def test_the_tool_page_shows_the_servers_hints_as_untrusted_and_whether_the_tool_is_registered():
    load_registry(_registry(), actor=Actor.system("tests"))
    viewer = signed_in(make_people(), VIEWER)
    now = viewer.get(f"/operations/tools/{Tool.objects.get(name='time.now').pk}/").content.decode()
    assert 'data-fact="mcp-registered" data-tool="time.now" data-value="registered"' in now
    assert _hints(now) == {
        "readOnlyHint": "true",
        "destructiveHint": "not given",
        "idempotentHint": "not given",
        "openWorldHint": "not given",
    }
    assert "untrusted hints, shown here and never acted on" in now
    exposed = viewer.get(f"/operations/tools/{Tool.objects.get(name='time.convert_time').pk}/").content.decode()
    assert 'data-value="exposed-unregistered"' in exposed
    assert _hints(exposed)["readOnlyHint"] == "true" and _hints(exposed)["destructiveHint"] == "false"
    assert "a high-risk, non-replay-safe write" in exposed  # what it is treated as, whatever it hints


def test_the_breakers_page_says_for_each_mcp_tool_whether_it_is_registered_and_what_the_server_hints():
    load_registry(_registry(), actor=Actor.system("tests"))
    page = signed_in(make_people(), VIEWER).get("/operations/breakers/").content.decode()
    assert 'data-fact="mcp-registered" data-tool="time.now" data-value="registered"' in page
    assert 'data-fact="mcp-registered" data-tool="time.convert_time" data-value="exposed-unregistered"' in page
    hints = re.findall(r'data-fact="mcp-hint" data-tool="([\w.]+)" data-hint="(\w+)" data-value="([^"]*)"', page)
    assert ("time.now", "readOnlyHint", "true") in hints and ("time.convert_time", "destructiveHint", "false") in hints
    assert "untrusted hints, never acted on" in page


def test_a_tool_that_is_not_an_mcp_tool_shows_no_mcp_section():
    from tests.sandbox import sandbox_registry

    load_registry(sandbox_registry("http://127.0.0.1:9"), actor=Actor.system("tests"))
    viewer = signed_in(make_people(), VIEWER)
    page = viewer.get(f"/operations/tools/{Tool.objects.filter(mcp={}).first().pk}/")
    assert page.status_code == 200 and 'id="mcp-tool"' not in page.content.decode()

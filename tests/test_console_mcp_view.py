"""The console's view of the MCP gateway (docs/mcp-gateway.md, "The console's view"): calls made through a real
gateway to mcp-server-git and mcp-server-time by the official client are marked as such (server, client name and
version, how the task was chosen) on the queue, task and call pages, the exact tools/call is on the call page and on
an action's preview, the servers and their tools are on the breakers page, the day's traffic on the overview; the
metrics (page, JSON, Prometheus) count gateway calls, absorbed re-issues, holds and approval waits; the task's audit
export carries the MCP events.
"""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from recovery.audit.chain import Actor
from recovery.devtools.mcp_stage import GIT_SERVER, client, git_registry, stage_file, time_registry
from recovery.devtools.mcp_stage import run_async as run
from recovery.models import Call, McpCall
from recovery.models.roles import REVIEWER, VIEWER
from recovery.registry import load_registry
from recovery.services.metrics import metrics_fold
from recovery.services.tokens import token_create
from tests.console import make_people, signed_in
from tests.mcp import agent_token
from tests.test_metrics_endpoints import bearer, samples

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mcp_servers")]

TASK_META = "io.recoveryconsole/task"


def _registry(repo) -> dict:
    registry = git_registry(repo, {"command": str(GIT_SERVER), "args": ["--repository", str(repo)]})
    time = time_registry()
    registry["providers"] += time["providers"]
    registry["tools"] += time["tools"]
    return registry


def _story(gateway, repo) -> dict:
    """Through the gateway, as client "console-agent" 2.5.1: a commit and its re-issue (the token and the client's
    name name the task), a commit that fails upstream (UNKNOWN), and a read of the time server in a task named in
    _meta."""
    load_registry(_registry(repo), actor=Actor.system("tests"))
    token = agent_token()
    stage_file(repo, "a.txt", "one")
    commit = {"repo_path": str(repo), "message": "add a"}
    broken = {"repo_path": str(repo / "nowhere"), "message": "not here"}

    async def go():
        async with client(gateway.url, token, name="console-agent", version="2.5.1") as mcp:
            first = await mcp.call_tool("git_commit", commit)
            again = await mcp.call_tool("git_commit", commit)
            failed = await mcp.call_tool("git_commit", broken)
            read = await mcp.call_tool("get_current_time", {"timezone": "UTC"}, meta={TASK_META: "named-task"})
            return first, again, failed, read

    first, again, failed, read = run(go)
    ids = [r.structured_content["recovery"].get("call_id") for r in (first, again, failed, read)]
    assert ids[0] == ids[1] and "Already done as call" in again.content[0].text  # the re-issue was absorbed
    return {
        "commit": Call.objects.get(pk=ids[0]),
        "failed": Call.objects.get(pk=ids[2]),
        "read": Call.objects.get(pk=ids[3]),
    }


def test_gateway_calls_are_marked_with_their_origin_and_request_on_every_page(gateway, repo):
    story = _story(gateway, repo)
    commit, failed, read = story["commit"], story["failed"], story["read"]
    origin = McpCall.objects.get(call=commit)
    assert (origin.server, origin.tool, origin.client_name, origin.client_version) == (
        "git",
        "git_commit",
        "console-agent",
        "2.5.1",
    )
    # The current protocol has no session: the task is the (token, client name) pair's
    assert origin.identity_source == "pair" and origin.reissues_absorbed == 1
    assert McpCall.objects.get(call=read).identity_source == "meta"
    request = origin.request
    assert (request["server"], request["tool"]) == ("git", "git_commit")
    assert request["_meta"] == {"io.modelcontextprotocol/idempotency-key": commit.idempotency_key}
    assert request["arguments"]["message"].endswith(f"Recovery-Intent: {commit.idempotency_key}\n")
    assert failed.state == "UNKNOWN"

    people = make_people()
    viewer = signed_in(people, VIEWER)
    page = viewer.get(f"/calls/{commit.pk}/").content.decode()
    assert 'id="mcp-origin" data-fact="mcp" data-value="git"' in page
    assert 'data-fact="mcp-client" data-value="console-agent 2.5.1"' in page
    assert 'data-fact="mcp-identity" data-value="pair"' in page
    assert 'data-fact="mcp-reissues" data-value="1"' in page
    shown = re.search(r'<pre class="json" id="mcp-request" tabindex="0">(.*?)</pre>', page, re.S).group(1)
    assert json.loads(shown.replace("&quot;", '"').replace("&#x27;", "'")) == request
    assert 'id="mcp-origin"' not in viewer.get(f"/calls/{_not_mcp_call()}/").content.decode()

    task_page = viewer.get(f"/tasks/{read.task_id}/").content.decode()
    assert 'data-fact="mcp" data-value="time"' in task_page and "task by named in _meta" in task_page
    queue = viewer.get("/queues/calls/").content.decode()
    rows = dict(re.findall(r'<tr id="call-(\d+)".*?data-fact="mcp" data-value="(\w+)"', queue))
    assert rows == {str(commit.pk): "git", str(failed.pk): "git", str(read.pk): "time"}
    assert "console-agent 2.5.1; task by the (token, client name) pair" in queue

    reviewer = signed_in(people, REVIEWER)
    preview = reviewer.post(f"/calls/{failed.pk}/actions/escalate/preview/", follow=True).content.decode()
    planned = re.search(r'<pre class="json" id="plan-mcp-request" tabindex="0">(.*?)</pre>', preview, re.S)
    assert json.loads(planned.group(1).replace("&quot;", '"')) == McpCall.objects.get(call=failed).request

    breakers = viewer.get("/operations/breakers/").content.decode()
    assert 'data-fact="mcp-server-tool" data-server="git" data-tool="git.commit" data-value="registered"' in breakers
    assert 'data-fact="mcp-expose" data-server="time" data-value="not exposed"' in breakers
    assert 'data-tool="time.now"' in breakers and "readOnlyHint true" in breakers

    metrics_fold()
    overview = viewer.get("/overview/").content.decode()
    assert 'data-fact="gateway-calls" data-value="3"' in overview
    servers = dict(re.findall(r'data-fact="gateway-server" data-server="(\w+)" data-value="(\d+)"', overview))
    assert servers == {"git": "2", "time": "1"}


def _not_mcp_call() -> int:
    """A call of the same tenant made through the JSON API's services, not the gateway."""
    from recovery.models import Tenant
    from recovery.services.calls import call_add
    from recovery.services.tasks import task_create

    actor = Actor.system("tests")
    task, _ = task_create(
        tenant=Tenant.objects.get(name="acme"), external_id="api-task", agent="a", goal="g", budget={}, actor=actor
    )
    added = call_add(
        task=task,
        step_index=1,
        depends_on=[],
        tool_name="time.now",
        arguments={"timezone": "UTC"},
        idempotency_key="k1",
        actor=actor,
    )
    return added.call.pk


def test_the_metrics_and_the_audit_export_count_gateway_calls_and_reissues(gateway, repo):
    story = _story(gateway, repo)
    people = make_people()
    metrics_fold()

    _, raw = token_create(name="scraper", tenants=["acme"], scope="metrics", actor=Actor.system("tests"))
    figures = {f["key"]: f for f in Client().get("/api/v1/metrics", **bearer(raw)).json()["figures"]}
    assert figures["gateway_calls"]["value"] == 3
    assert {x["label"]: x["value"] for x in figures["gateway_calls"]["by_label"]} == {"git": 2, "time": 1}
    assert figures["reissues_absorbed"]["value"] == 1
    assert (
        figures["mcp_holds"]["value"] == 0 and figures["approval_wait"]["count"] == 0
    )  # holds: test_mcp_gateway_holds

    scraped = samples(Client().get("/metrics", **bearer(raw)).content.decode())
    assert scraped[("recovery_mcp_gateway_calls_total", (("server", "git"), ("tool", "git.commit")))] == 2
    assert scraped[("recovery_mcp_gateway_calls_total", (("server", "time"), ("tool", "time.now")))] == 1
    assert scraped[("recovery_mcp_reissues_absorbed_total", (("server", "git"), ("tool", "git.commit")))] == 1

    page = signed_in(people, VIEWER).get("/overview/metrics/").content.decode()
    for key in ("gateway_calls", "reissues_absorbed", "mcp_holds", "approval_wait"):
        assert f'data-figure="{key}"' in page

    exported = signed_in(people, VIEWER).get(f"/audit/export/?task={story['commit'].task_id}&format=jsonl")
    events = [json.loads(line) for line in b"".join(exported.streaming_content).decode().splitlines()]
    added = [e for e in events if e["action"] == "call.added"]
    assert [e["evidence"]["mcp"]["client_name"] for e in added] == ["console-agent", "console-agent"]
    assert {e["evidence"]["mcp"]["identity_source"] for e in added} == {"pair"}
    absorbed = [e for e in events if e["action"] == "mcp.reissue_absorbed"]
    assert len(absorbed) == 1 and absorbed[0]["call_id"] == story["commit"].pk
    assert absorbed[0]["evidence"]["server"] == "git" and absorbed[0]["evidence"]["client_version"] == "2.5.1"

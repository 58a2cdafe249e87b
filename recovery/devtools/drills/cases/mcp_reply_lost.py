"""MCP reply lost (docs/mcp-gateway.md): a git commit made through the MCP gateway, its reply dropped by the fault
proxy after mcp-server-git committed; the client re-issues it as the protocol says, the gateway absorbs the re-issue,
the status tool (git_log, by the intent key's trailer) settles the call COMMITTED, and the repository holds 1 commit.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from recovery.audit.chain import Actor
from recovery.devtools.drills.framework import PATIENCE_S, Run, wait
from recovery.devtools.drills.stage import DRILL_TENANT
from recovery.devtools.mcp_stage import (
    GIT_SERVER,
    Gateway,
    client,
    commits,
    fault_command,
    forwarded,
    git_registry,
    git_repo,
    run_async,
    set_fault,
    stage_file,
)
from recovery.models import Call, Receipt, Tenant
from recovery.registry import load_registry

PROVIDER = "drill-git"


def _register(repo: Path, control: Path) -> None:
    """The drill's git server behind the fault proxy, its tools added to the drills tenant's capabilities."""
    registry = git_registry(repo, fault_command([str(GIT_SERVER), "--repository", str(repo)], control), name=PROVIDER)
    registry["tools"][0]["reconcile"] = {"first_check_s": 0, "max_checks": 5}
    tenant = Tenant.objects.get(name=DRILL_TENANT)
    names = sorted({*tenant.tools.values_list("name", flat=True), *(tool["name"] for tool in registry["tools"])})
    registry["tenants"] = [{"name": DRILL_TENANT, "display_name": tenant.display_name, "sandbox": True, "tools": names}]
    load_registry(registry, actor=Actor.system("drill"))


def _commit(url: str, token: str, arguments: dict, task: str):
    async def go():
        async with client(url, token, name="drill-agent") as mcp:
            return await mcp.call_tool("git_commit", arguments, meta={"io.recoveryconsole/task": task})

    return run_async(go)


def play(run: Run) -> None:
    with tempfile.TemporaryDirectory(prefix="drill-mcp-") as workdir:
        repo, control = git_repo(Path(workdir) / "repo"), Path(workdir) / "fault.json"
        _register(repo, control)
        stage_file(repo, "release.txt", run.tag)
        arguments = {"repo_path": str(repo), "message": f"release {run.tag}"}
        set_fault(control, "drop_reply", "git_commit")
        with Gateway() as gateway:
            lost = _commit(gateway.url, run.stage.token, arguments, run.key("mcp-task"))
            call = Call.objects.filter(task__external_id=run.key("mcp-task")).get()
            run.calls.append((call.idempotency_key, call.pk))
            reissued = _commit(gateway.url, run.stage.token, arguments, run.key("mcp-task"))
            settled = wait(lambda: Call.objects.get(pk=call.pk).state == "COMMITTED", PATIENCE_S, every_s=0.25)
            again = _commit(gateway.url, run.stage.token, arguments, run.key("mcp-task"))
        run.effects = {call.idempotency_key: commits(repo)}
        _checks(run, call, lost, reissued, again, settled, forwarded(control))


def _checks(run: Run, call: Call, lost, reissued, again, settled: bool, sent: list[dict]) -> None:
    text = reissued.content[0].text if reissued.content else ""
    run.check(
        "the reply was lost: the client saw an unknown outcome",
        expected={"is_error": True, "class": "outcome_unknown"},
        observed={
            "is_error": lost.is_error,
            "class": ((lost.structured_content or {}).get("recovery", {}).get("failure") or {}).get("class"),
        },
    )
    run.check(
        "the re-issue was absorbed, not sent",
        expected={"is_error": True, "says": f"still being confirmed (call {call.pk})"},
        observed={
            "is_error": reissued.is_error,
            "says": f"still being confirmed (call {call.pk})"
            if f"still being confirmed (call {call.pk})" in text
            else text,
        },
    )
    receipts = list(Receipt.objects.filter(call_id=call.pk, applied=True).values_list("observed", flat=True))
    run.check(
        "settled by the status tool",
        expected={"settled": True, "receipts": ["committed"]},
        observed={"settled": settled, "receipts": receipts},
    )
    replayed = ((again.structured_content or {}).get("recovery") or {}).get("replayed_from_call")
    run.check("a later re-issue answers the recorded result", expected=call.pk, observed=replayed)
    run.check("git_commit forwarded once", expected=1, observed=sum(1 for f in sent if f["name"] == "git_commit"))

"""The MCP gateway's approval hold and a killed upstream (docs/mcp-gateway.md), on mcp-server-git behind the fault
proxy, as drill `mcp-reply-lost` does:

- mcp-approval-hold: a git commit whose tool the registry holds for an approval; the client (with a progressToken)
  is held for the tool's hold_s and told "waiting for approval: call N"; only then a reviewer requests the stored
  preview and a second person approves it; a worker executes it once; the client's re-issue receives that one
  execution's result; the repository holds 1 commit.
- mcp-upstream-killed: the server commits and is killed before its answer leaves: the call is UNKNOWN, the status
  tool settles it COMMITTED, the gateway starts the server again for the next call; 1 commit.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from recovery.audit.chain import Actor
from recovery.devtools.drills.cases.mcp_reply_lost import PROVIDER
from recovery.devtools.drills.framework import PATIENCE_S, Run, wait
from recovery.devtools.drills.stage import DRILL_TENANT, drill_people
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
from recovery.models import ActionRequest, Call, Receipt, Tenant
from recovery.registry import load_registry
from recovery.services.actions import action_approve, action_request

HOLD_S = 2  # the drill's client is held this long, then answered "waiting for approval"


def _register(repo: Path, control: Path, **mcp) -> None:
    """The drill's git server behind the fault proxy (`mcp` added to its commit tool's MCP object)."""
    registry = git_registry(repo, fault_command([str(GIT_SERVER), "--repository", str(repo)], control), name=PROVIDER)
    registry["tools"][0]["reconcile"] = {"first_check_s": 0, "max_checks": 5}
    registry["tools"][0]["mcp"].update(mcp)
    tenant = Tenant.objects.get(name=DRILL_TENANT)
    names = sorted({*tenant.tools.values_list("name", flat=True), *(tool["name"] for tool in registry["tools"])})
    registry["tenants"] = [{"name": DRILL_TENANT, "display_name": tenant.display_name, "sandbox": True, "tools": names}]
    load_registry(registry, actor=Actor.system("drill"))


def _call(url: str, token: str, tool: str, arguments: dict, task: str, progress: list | None = None):
    async def heard(done, total, message):
        progress.append((done, total, message))

    async def go():
        async with client(url, token, name="drill-agent") as mcp:
            callback = heard if progress is not None else None
            meta = {"io.recoveryconsole/task": task}
            return await mcp.call_tool(tool, arguments, progress_callback=callback, meta=meta)

    return run_async(go)


def _text(result) -> str:
    return result.content[0].text if result.content else ""


def _recovery(result) -> dict:
    return (result.structured_content or {}).get("recovery") or {}


def play_hold(run: Run) -> None:
    with tempfile.TemporaryDirectory(prefix="drill-mcp-hold-") as workdir:
        repo, control = git_repo(Path(workdir) / "repo"), Path(workdir) / "fault.json"
        _register(repo, control, approval="required", hold_s=HOLD_S)
        stage_file(repo, "hold.txt", run.tag)
        arguments, task = {"repo_path": str(repo), "message": f"held release {run.tag}"}, run.key("mcp-hold")
        progress: list = []
        with Gateway() as gateway:
            first = _call(gateway.url, run.stage.token, "git_commit", arguments, task, progress)
            first_ended = time.time()
            call = Call.objects.filter(task__external_id=task).get()
            run.calls.append((call.idempotency_key, call.pk))
            hold = ActionRequest.objects.get(call=call, action="execute_held")
            _approve(run, hold)
            settled = wait(lambda: Call.objects.get(pk=call.pk).state == "COMMITTED", PATIENCE_S, every_s=0.25)
            again = _call(gateway.url, run.stage.token, "git_commit", arguments, task)
        run.effects = {call.idempotency_key: commits(repo)}
        hold.refresh_from_db()
        _hold_checks(run, call, hold, (first, first_ended, progress), again, settled, forwarded(control))


def _approve(run: Run, hold: ActionRequest) -> None:
    people = drill_people()
    reviewer, approver = people.reviewer, people.approvers[0]
    reason = "drill: the held commit, read in its preview"
    action_request(
        request_id=hold.pk, user=reviewer, actor=Actor.for_user(reviewer), reason=reason, plan_hash=hold.plan_hash
    )
    action_approve(request_id=hold.pk, user=approver, actor=Actor.for_user(approver), reason="drill: approved")
    run.log(f"  held call requested by {reviewer.get_username()}, approved by {approver.get_username()}")


def _hold_checks(run: Run, call: Call, hold: ActionRequest, waited: tuple, again, settled: bool, sent: list) -> None:
    first, first_ended, progress = waited
    run.check(
        "the client was held, heard progress, and was told it waits",
        expected={"is_error": True, "says": f"waiting for approval: call {call.pk}", "progress": True},
        observed={"is_error": first.is_error, "says": _text(first), "progress": len(progress) >= 1},
    )
    run.check(
        "approved by a second person after the client's wait ended",
        expected={"status": "executed", "two people": True, "after the wait": True},
        observed={
            "status": hold.status,
            "two people": bool(hold.decided_by_id) and hold.decided_by_id != hold.requested_by_id,
            "after the wait": bool(hold.decided_at) and hold.decided_at.timestamp() > first_ended,
        },
    )
    run.check("executed once by a worker", expected=True, observed=settled)
    run.check(
        "the re-issue received the one execution's result",
        expected={"is_error": False, "replayed_from_call": call.pk, "result": True},
        observed={
            "is_error": again.is_error,
            "replayed_from_call": _recovery(again).get("replayed_from_call"),
            "result": "with hash" in _text(again),
        },
    )
    run.check("git_commit forwarded once", expected=1, observed=sum(1 for f in sent if f["name"] == "git_commit"))


def play_killed(run: Run) -> None:
    with tempfile.TemporaryDirectory(prefix="drill-mcp-killed-") as workdir:
        repo, control = git_repo(Path(workdir) / "repo"), Path(workdir) / "fault.json"
        _register(repo, control)
        stage_file(repo, "killed.txt", run.tag)
        arguments, task = {"repo_path": str(repo), "message": f"release {run.tag}"}, run.key("mcp-killed")
        set_fault(control, "kill_after_reply", "git_commit")
        with Gateway() as gateway:
            lost = _call(gateway.url, run.stage.token, "git_commit", arguments, task)
            call = Call.objects.filter(task__external_id=task).get()
            run.calls.append((call.idempotency_key, call.pk))
            settled = wait(lambda: Call.objects.get(pk=call.pk).state == "COMMITTED", PATIENCE_S, every_s=0.25)
            later = _call(gateway.url, run.stage.token, "git_log", {"repo_path": str(repo)}, task)
        run.effects = {call.idempotency_key: commits(repo)}
        _killed_checks(run, call, lost, later, settled, forwarded(control))


def _killed_checks(run: Run, call: Call, lost, later, settled: bool, sent: list) -> None:
    run.check(
        "the server died mid-call: the client saw an unknown outcome",
        expected={"is_error": True, "class": "outcome_unknown"},
        observed={"is_error": lost.is_error, "class": (_recovery(lost).get("failure") or {}).get("class")},
    )
    receipts = list(Receipt.objects.filter(call_id=call.pk, applied=True).values_list("observed", flat=True))
    run.check(
        "settled by the status tool",
        expected={"settled": True, "receipts": ["committed"]},
        observed={"settled": settled, "receipts": receipts},
    )
    names = [f["name"] for f in sent]
    run.check(
        "the server was started again for the next call",
        expected={"answered": True, "git_log after the kill": True},
        observed={
            "answered": not later.is_error and call.idempotency_key in _text(later),
            "git_log after the kill": "git_log" in names[names.index("git_commit") + 1 :]
            if "git_commit" in names
            else False,
        },
    )
    run.check("git_commit forwarded once", expected=1, observed=names.count("git_commit"))

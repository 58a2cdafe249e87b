"""Approval holds of the MCP gateway (docs/mcp-gateway.md, "Approval holds") on mcp-server-git behind our fault proxy
(which logs every tools/call it forwards): a held write waits READY while a reviewer and a different approver decide
it through the console's views, a worker (a real RQ worker) executes it once, and the client's re-issue gets that
one execution's result; effects counted from git's own history.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.test import Client
from django.urls import reverse
from rq import SimpleWorker

from recovery.audit.chain import Actor
from recovery.devtools.drills.framework import wait
from recovery.devtools.mcp_stage import (
    GIT_SERVER,
    client,
    commits,
    fault_command,
    forwarded,
    git_registry,
    set_fault,
    stage_file,
)
from recovery.devtools.mcp_stage import run_async as run
from recovery.models import ActionRequest, AuditEvent, Call
from recovery.models.roles import APPROVER, REVIEWER
from recovery.registry import load_registry
from recovery.registry.checks import RegistryInvalid
from recovery.services.actions import action_request, actions_expire_due
from recovery.services.metrics import metrics_fold
from recovery.services.tokens import token_create
from recovery.services.users import user_save_with_roles
from tests.console import PASSWORD, signed_in
from tests.mcp import agent_token
from tests.test_metrics_endpoints import bearer, samples

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mcp_servers")]
TASK = {"io.recoveryconsole/task": "release-7"}


def _load(repo, control, *, hold_s: int = 4, timeout_s: int = 10, **policy) -> str:
    server = fault_command([str(GIT_SERVER), "--repository", str(repo)], control)
    registry = git_registry(repo, server, timeout_s=timeout_s)
    registry["tools"][0]["mcp"].update({"approval": "required", "hold_s": hold_s, **policy})
    load_registry(registry, actor=Actor.system("tests"))
    return agent_token()


def _commit(url: str, token: str, message: str, repo, *, progress: list | None = None, mode: str = "auto"):
    async def go():
        async with client(url, token, mode=mode) as mcp:
            callback = None
            if progress is not None:

                async def callback(done, total, text):
                    progress.append((time.monotonic(), done, total, text))

            return await mcp.call_tool(
                "git_commit", {"repo_path": str(repo), "message": message}, progress_callback=callback, meta=TASK
            )

    return run(go)


@pytest.fixture
def both(people):
    """A person with the reviewer and the approver roles: they may request and approve, never their own request."""
    user, _ = user_save_with_roles(
        username="both", roles=[REVIEWER, APPROVER], password=PASSWORD, actor=Actor.system("t")
    )
    people["both"] = user
    return user


def _recovery(result) -> dict:
    return result.structured_content["recovery"]


def _hold_of(call_id: int) -> ActionRequest:
    return ActionRequest.objects.get(call_id=call_id, action="execute_held")


def _decide(people, hold: ActionRequest, verb: str = "approve", approver: str = "approver") -> None:
    """A reviewer requests the stored preview and a different person decides it, through the console's views."""
    requested = signed_in(people, "reviewer").post(
        reverse("console:action-request", args=[hold.pk]),
        {"reason": "the release needs it", "plan_hash": hold.plan_hash},
    )
    assert requested.status_code == 302, requested.content.decode()[:2000]
    decided = signed_in(people, approver).post(
        reverse(f"console:action-{verb}", args=[hold.pk]), {f"{verb}-reason": "checked the commit message"}
    )
    assert decided.status_code == 302, decided.content.decode()[:2000]


def call_moves(call_id: int) -> list[str]:
    events = AuditEvent.objects.filter(call_id=call_id, action="call.transition").exclude(from_state="")
    return list(events.order_by("seq").values_list("to_state", flat=True))


def _work(queue) -> None:
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


def test_a_held_write_is_approved_in_the_console_while_the_client_waits_and_runs_once(
    gateway, repo, control, people, rq_queue
):
    token = _load(repo, control, hold_s=20)
    stage_file(repo, "release.txt", "7")
    progress: list = []
    answers: list = []
    waiting = threading.Thread(
        target=lambda: answers.append(_commit(gateway.url, token, "release 7", repo, progress=progress))
    )
    started = time.monotonic()
    waiting.start()
    assert wait(lambda: ActionRequest.objects.filter(action="execute_held").exists(), 15, every_s=0.1)
    call = Call.objects.get()
    assert call.state == "READY" and call.attempts_count == 0  # held: no attempt, no new state
    assert call.gate_decisions.filter(reason="approval_required", dry_run=False).exists()
    hold = _hold_of(call.pk)
    body = hold.plan["requests"][0]["body"]  # the exact tools/call, the key in _meta and the message's trailer
    assert (body["name"], body["_meta"]["io.modelcontextprotocol/idempotency-key"]) == (
        "git_commit",
        call.idempotency_key,
    )
    assert body["arguments"]["message"].endswith(f"Recovery-Intent: {call.idempotency_key}\n")
    shown = signed_in(people, "reviewer").get(reverse("console:action", args=[hold.pk])).content.decode()
    assert "tools/call" in shown and "mcp://git" in shown and call.idempotency_key in shown
    page = signed_in(people, "reviewer").get(reverse("console:call", args=[call.pk])).content.decode()
    assert 'data-action="execute_held" data-allowed="yes"' in page
    assert wait(lambda: len(progress) >= 2, 10, every_s=0.1)  # the client hears while it waits
    assert forwarded(control) == [] and commits(repo) == 0  # nothing was sent while held

    again_previewed = signed_in(people, "reviewer").post(
        reverse("console:action-preview", args=[call.pk, "execute_held"])
    )
    assert again_previewed.status_code == 302  # a reviewer's own preview of the same call: not another intent
    _decide(people, hold)
    _work(rq_queue)
    waiting.join(timeout=30)
    (first,) = answers
    assert not first.is_error, first
    assert "Approved and executed once" in first.content[0].text and "with hash" in first.content[0].text
    gaps = [b[0] - a[0] for a, b in zip([(started,), *progress], progress, strict=False)]
    assert max(gaps) <= 2.0, gaps  # at least every 2 s
    assert all(p[2] == 20 and p[3] == f"waiting for approval: call {call.pk}" for p in progress)

    again = _commit(gateway.url, token, "release 7", repo)
    assert not again.is_error and _recovery(again)["replayed_from_call"] == call.pk
    assert again.content[0].text.split("\n", 1)[1] == first.content[0].text.split("\n", 1)[1]  # the kept result
    assert commits(repo) == 1
    assert [f["name"] for f in forwarded(control)] == ["git_commit"]
    call.refresh_from_db()
    assert call.state == "COMMITTED" and call.attempts_count == 1
    hold.refresh_from_db()
    assert hold.status == "executed" and hold.decided_by.username == "approver"


def test_a_handshake_era_client_is_held_with_progress_too(gateway, repo, control):
    token = _load(repo, control, hold_s=2)
    stage_file(repo, "l.txt", "l")
    progress: list = []
    result = _commit(gateway.url, token, "l", repo, progress=progress, mode="legacy")
    call = Call.objects.get()
    assert result.is_error and result.content[0].text == f"waiting for approval: call {call.pk}"
    assert len(progress) >= 2 and progress[-1][2] == 2


def test_without_a_progress_token_the_answer_comes_within_3_s_with_the_call_id(gateway, repo, control):
    token = _load(repo, control, hold_s=60)
    stage_file(repo, "a.txt", "a")
    started = time.monotonic()
    result = _commit(gateway.url, token, "a", repo)
    took = time.monotonic() - started
    call = Call.objects.get()
    assert took < 3.0, took
    assert result.is_error and result.content[0].text == f"waiting for approval: call {call.pk}"
    assert _recovery(result)["call_id"] == call.pk and _recovery(result)["decision"]["route"] == "request_approval"
    assert call.state == "READY"


def test_a_reissue_after_approval_gets_the_kept_result_and_nothing_runs_twice(gateway, repo, control, people, rq_queue):
    token = _load(repo, control, hold_s=1)
    stage_file(repo, "b.txt", "b")
    first = _commit(gateway.url, token, "b", repo, progress=[])  # waits 1 s, then told it is still waiting
    call = Call.objects.get()
    assert first.is_error and first.content[0].text == f"waiting for approval: call {call.pk}"
    _decide(people, _hold_of(call.pk))
    _work(rq_queue)
    _work(rq_queue)  # a duplicate job finds the request executed: nothing more
    for _ in range(2):
        again = _commit(gateway.url, token, "b", repo)
        assert not again.is_error and "Approved and executed once" in again.content[0].text
    assert commits(repo) == 1 and len(forwarded(control)) == 1
    assert Call.objects.count() == 1


def test_differing_arguments_make_a_second_hold_and_approving_one_refuses_the_other(
    gateway, repo, control, people, rq_queue
):
    token = _load(repo, control, hold_s=1)
    stage_file(repo, "c.txt", "c")
    _commit(gateway.url, token, "first wording", repo)
    _commit(gateway.url, token, "second wording", repo)
    one, two = Call.objects.order_by("pk")
    page = signed_in(people, "approver").get(reverse("console:approvals")).content.decode()
    held = page[page.index('id="held-calls"') :]
    group = held[held.index('class="hold-group"') :]
    assert f"call {one.pk}" in group and f"call {two.pk}" in group and "2 holds" in group
    assert "waiting" in held

    _decide(people, _hold_of(two.pk))
    _work(rq_queue)
    one.refresh_from_db()
    two.refresh_from_db()
    assert (one.state, two.state) == ("FAILED_PERMANENT", "COMMITTED")
    assert _hold_of(one.pk).status == "stale"
    refused = _commit(gateway.url, token, "first wording", repo)
    assert refused.is_error and f"call {two.pk}" in refused.content[0].text and "Refused" in refused.content[0].text
    assert commits(repo) == 1 and len(forwarded(control)) == 1
    assert one.attempts_count == 0  # never executed


def test_a_rejected_hold_is_answered_the_refusal_and_never_runs(gateway, repo, control, people, rq_queue):
    token = _load(repo, control, hold_s=1)
    stage_file(repo, "d.txt", "d")
    _commit(gateway.url, token, "d", repo)
    call = Call.objects.get()
    _decide(people, _hold_of(call.pk), verb="reject")
    _work(rq_queue)
    result = _commit(gateway.url, token, "d", repo)
    assert result.is_error and "rejected: checked the commit message" in result.content[0].text
    assert _recovery(result)["decision"]["route"] == "stop"
    call.refresh_from_db()
    assert call.state == "FAILED_PERMANENT" and commits(repo) == 0 and forwarded(control) == []

    # The hold is counted, with its wait from the denial to the decision, in JSON and Prometheus alike.
    metrics_fold()
    _, raw = token_create(name="scraper", tenants=["acme"], scope="metrics", actor=Actor.system("tests"))
    figures = {f["key"]: f for f in Client().get("/api/v1/metrics", **bearer(raw)).json()["figures"]}
    assert figures["mcp_holds"]["value"] == 1
    assert figures["approval_wait"]["count"] == 1 and 0 <= figures["approval_wait"]["median"] < 60
    scraped = samples(Client().get("/metrics", **bearer(raw)).content.decode())
    assert scraped[("recovery_mcp_holds_total", (("server", "git"),))] == 1
    assert scraped[("recovery_mcp_holds_waiting", ())] == 0
    assert scraped[("recovery_mcp_approval_wait_seconds_bucket", (("le", "60.0"),))] == 1


def test_the_reviewer_who_requested_a_hold_cannot_approve_it(gateway, repo, control, people, both):
    token = _load(repo, control, hold_s=1)
    stage_file(repo, "e.txt", "e")
    _commit(gateway.url, token, "e", repo)
    hold = _hold_of(Call.objects.get().pk)
    action_request(request_id=hold.pk, user=both, actor=Actor.for_user(both), reason="go", plan_hash=hold.plan_hash)
    refused = signed_in(people, "both").post(
        reverse("console:action-approve", args=[hold.pk]), {"approve-reason": "mine"}
    )
    assert refused.status_code == 409
    hold.refresh_from_db()
    assert hold.status == "requested" and forwarded(control) == []


@pytest.mark.django_db  # no server, no gateway: the loader alone
@pytest.mark.parametrize(
    ("where", "value", "path"),
    [
        ("tool", "sometimes", "$.tools[0].mcp.approval"),
        ("provider", "required", "$.providers[0].mcp.approval"),
        ("tool_hold", 0, "$.tools[0].mcp.hold_s"),
    ],
)
def test_a_bad_approval_value_is_a_field_level_error_and_loads_nothing(repo, control, where, value, path):
    registry = git_registry(repo, fault_command([str(GIT_SERVER)], control))
    target = registry["providers"][0]["mcp"] if where == "provider" else registry["tools"][0]["mcp"]
    target["hold_s" if where == "tool_hold" else "approval"] = value
    with pytest.raises(RegistryInvalid) as raised:
        load_registry(registry, actor=Actor.system("tests"))
    assert path in {error.path for error in raised.value.errors}, raised.value.errors
    assert not Call.objects.exists()
    from recovery.models import Tool

    assert not Tool.objects.filter(name="git.commit").exists()


def test_a_provider_policy_holds_its_high_risk_writes_only(gateway, repo, control):
    registry = git_registry(repo, fault_command([str(GIT_SERVER), "--repository", str(repo)], control))
    registry["providers"][0]["mcp"]["approval"] = "high_risk_writes"
    load_registry(registry, actor=Actor.system("tests"))
    token = agent_token()
    stage_file(repo, "f.txt", "f")
    held = _commit(gateway.url, token, "f", repo)
    assert held.is_error and held.content[0].text.startswith("waiting for approval")

    async def log():
        async with client(gateway.url, token) as mcp:
            return await mcp.call_tool("git_log", {"repo_path": str(repo)})

    assert not run(log).is_error  # a read is not held


def test_an_approved_execution_that_times_out_is_unknown_and_settled_by_the_status_tool_never_resent(
    gateway, repo, control, people, rq_queue
):
    token = _load(repo, control, hold_s=1, timeout_s=1)  # the execution times out 1 s after sending
    stage_file(repo, "g.txt", "g")
    _commit(gateway.url, token, "g", repo)
    call = Call.objects.get()
    set_fault(control, "hang", "git_commit")
    _decide(people, _hold_of(call.pk))
    _work(rq_queue)  # the execution times out after sending; the reconcile job it enqueues asks the status tool
    call.refresh_from_db()
    moves = call_moves(call.pk)
    assert moves == ["SENT", "UNKNOWN", "COMMITTED"], moves
    assert call.attempts.get().error_kind == "read_timeout" and _hold_of(call.pk).status == "executed"
    assert list(call.receipts.filter(applied=True).values_list("observed", flat=True)) == ["committed"]
    assert commits(repo) == 1
    assert [f["name"] for f in forwarded(control)].count("git_commit") == 1  # never re-sent
    done = _commit(gateway.url, token, "g", repo)
    assert not done.is_error and f"Approved and executed once as call {call.pk}" in done.content[0].text


def test_a_hold_nobody_decides_in_time_is_answered_the_refusal(gateway, repo, control, settings):
    settings.RECOVERY_ACTION_TTL_S = 1
    token = _load(repo, control, hold_s=1)
    stage_file(repo, "h.txt", "h")
    _commit(gateway.url, token, "h", repo)
    time.sleep(1.2)
    result = _commit(gateway.url, token, "h", repo)
    assert result.is_error and "was not approved before its hold expired" in result.content[0].text
    actions_expire_due()  # the periodic job: the request expired, the held call ends
    call = Call.objects.get()
    assert (call.state, _hold_of(call.pk).status) == ("FAILED_PERMANENT", "expired")
    again = _commit(gateway.url, token, "h", repo)
    assert again.is_error and "was not approved before its hold expired" in again.content[0].text
    assert commits(repo) == 0 and forwarded(control) == []

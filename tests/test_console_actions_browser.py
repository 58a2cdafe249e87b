"""Operator actions in a real browser (docs/actions.md): a same-key replay previewed and requested by a reviewer,
approved by an approver in a second browser, executed once by a job against the real sandbox.

The refund is built through the real services and the real sandbox process: a runtime (the API over `live_server`)
sends it, the sandbox commits it and drops the reply (UNKNOWN), the provider's status API stays down until the poll
budget is spent (reconciliation's own job sends it to HUMAN_REVIEW). The console's pages then do the rest: the
reviewer opens the call from the Human review queue, previews "Replay with the same idempotency key" (the plan: the
POST with the original key, the credential masked, the checks) and requests it with a reason; the approver opens
Approvals, reads the plan and approves; the execution job runs on the in-process runner (the embedded default's
jobs), replays with the same key, and the sandbox deduplicates it: its ledger shows exactly one refund for the key.
The call leaves the Human review queue and its timeline tells the whole story. No page raises a CSP violation.

Screenshots: var/test-artifacts/browser/action-preview.png, action-approvals.png, action-executed.png.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests
from django.utils import timezone
from recovery_client import RecoveryClient, facts_from_exception, facts_from_response

from recovery.audit.chain import Actor
from recovery.models import ActionRequest, ActionStatus, Attempt, AuditEvent, Call
from recovery.registry import load_registry
from recovery.services.reconcile import reconcile_due
from recovery.services.tokens import token_create

pytestmark = pytest.mark.django_db(transaction=True)

REGISTRY = Path(__file__).resolve().parent.parent / "recovery" / "fixtures" / "registry.example.json"
API_KEY = "sandbox-test-key"  # tests/sandbox.py's: the sandbox process accepts it, no page may show it
REFUND = {"order_id": "O-8848", "amount_cents": 1250}
REPLAY = "Replay with the same idempotency key"
EXECUTED_WAIT_MS = 15_000  # the job runs at once; the request's status block refreshes every 3 s


@pytest.fixture
def world(sandbox, live_server, monkeypatch):
    """The shipped sandbox registry pointed at the sandbox process (3 quick status checks before human review), and
    a runtime's API client on the live server."""
    monkeypatch.setenv("SANDBOX_API_KEY", API_KEY)
    registry = json.loads(REGISTRY.read_text())
    registry["providers"][0]["base_url"] = sandbox.url
    registry["providers"][0]["read_timeout_s"] = 2
    for tool in registry["tools"]:
        if "reconcile" in tool:
            tool["reconcile"] = {"first_check_s": 0, "backoff": 1, "max_checks": 3, "deadline_s": 600}
    load_registry(registry, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["demo"], actor=Actor.system("tests"))
    return {"client": RecoveryClient(live_server.url, token), "sandbox": sandbox}


def _refund_in_human_review(world) -> tuple[int, str]:
    """A refund the sandbox committed but whose reply was lost (the runtime reports it: UNKNOWN), and whose status
    API stayed down: reconciliation spent its poll budget (3 checks here) and sent it to a person."""
    client, sandbox = world["client"], world["sandbox"]
    task = client.create_task("demo", "ticket-8848", agent="support-bot", goal="Refund order O-8848")
    key = "refund-order-8848"
    call_id = client.add_call(task.id, step=1, tool="refund.create", arguments=REFUND, idempotency_key=key).call_id
    sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    sandbox.fault(route="/refunds/by-key", kind="status_down", status=503)
    attempt = client.admit(call_id, "attempt-1")
    try:
        reply = requests.post(
            f"{sandbox.url}/refunds", json=REFUND, timeout=(2, 3),
            headers={"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": key},
        )  # fmt: skip
        facts = facts_from_response(reply)
    except requests.RequestException as exc:
        facts = facts_from_exception(exc)
    assert client.report(call_id, attempt.attempt_id, facts).call_state == "UNKNOWN"
    # Three checks spend the budget; the in-process runner's own reconcile job may take one of them (or hold the
    # call's lease while this one looks), so check until the call has moved, a bounded number of times.
    for _ in range(30):
        if Call.objects.filter(pk=call_id, state="HUMAN_REVIEW").exists():
            break
        Call.objects.filter(pk=call_id).update(next_check_at=timezone.now())  # no waiting for the schedule
        reconcile_due(worker="tests-reconcile")
        time.sleep(0.1)
    call = Call.objects.get(pk=call_id)
    assert (call.state, call.outcome) == ("HUMAN_REVIEW", "poll_budget_exhausted")
    assert sandbox.ledger(key)["effects"] == 1  # the first request took effect: a blind replay would refund twice
    return call_id, key


def _posts(sandbox, key: str) -> int:
    return len([r for r in sandbox.requests(key=key) if r["method"] == "POST"])


def test_a_reviewer_and_an_approver_replay_a_refund_in_human_review_exactly_once(
    world, runner, open_console, console_people
):
    sandbox = world["sandbox"]
    call_id, key = _refund_in_human_review(world)
    assert _posts(sandbox, key) == 1

    # The reviewer opens the call from the Human review queue and previews the replay.
    alice = open_console()
    alice.sign_in("reviewer", start="/queues/human-review/")
    page = alice.page
    with page.expect_navigation():
        page.locator(f"#call-{call_id} a.open").click()
    assert page.url.endswith(f"/calls/{call_id}/")
    alice.shot("action-call-page")
    with page.expect_navigation():
        page.get_by_role("button", name=f"Preview: {REPLAY}").click()
    assert "/actions/" in page.url
    request = ActionRequest.objects.get(call_id=call_id)
    assert request.status == ActionStatus.PREVIEWED
    plan = page.locator("#plan").inner_text()
    assert f"POST\n{sandbox.url}/refunds" in plan or f"POST {sandbox.url}/refunds" in plan
    assert key in page.locator("#plan-key").inner_text()
    headers = page.locator("#plan table.headers").inner_text()
    assert "Bearer [REDACTED]" in headers and key in headers
    assert API_KEY not in page.content()
    assert page.locator("#checks li.passed").count() == 6 and page.locator("#checks li.failed").count() == 0
    assert _posts(sandbox, key) == 1  # the dry run sent nothing
    alice.shot("action-preview")
    alice.assert_clean()

    page.get_by_label("Reason").fill("The provider keeps the key 24 h: a same-key replay is deduplicated.")
    with page.expect_navigation():
        page.get_by_role("button", name=f"Request “{REPLAY}”").click()
    assert page.locator("#action-status [data-status]").get_attribute("data-status") == "requested"
    assert "waits for a second person with the approver role" in page.locator(".messages").inner_text()
    alice.assert_clean()

    # The approver, in a browser of their own, finds it under Approvals, reads the plan and approves it.
    bob = open_console()
    bob.sign_in("approver", start="/overview/")
    approvals = bob.page.locator("#queue-nav").get_by_role("link", name="Approvals")
    assert approvals.locator(".count").inner_text() == "1"
    with bob.page.expect_navigation():
        approvals.click()
    row = bob.page.locator(f"#approval-{request.pk}")
    assert REPLAY in row.inner_text() and key in row.inner_text() and "6 passed" in row.inner_text()
    assert "reviewer" in row.inner_text() and "deduplicated" in row.inner_text()
    bob.shot("action-approvals")
    bob.assert_clean()
    with bob.page.expect_navigation():
        row.locator("a.open").click()
    assert "Bearer [REDACTED]" in bob.page.locator("#plan").inner_text()
    bob.page.locator("#id_approve-reason").fill("Ledger checked: one refund at most, the key is kept.")
    bob.page.once("dialog", lambda dialog: dialog.accept())  # approving asks for a confirmation, however sent
    with bob.page.expect_navigation():
        bob.page.get_by_role("button", name="Approve", exact=True).click()

    # The job executes it once against the sandbox; the page follows it to the end.
    assert runner.wait_idle(timeout=30)
    # The status block polls while a worker holds the request, and draws the whole page again when it is done.
    bob.page.locator('#action-status [data-status="executed"]').wait_for(timeout=EXECUTED_WAIT_MS)
    assert "HTTP 200 → COMMITTED" in bob.page.locator("#result-what").inner_text()
    assert "action.executed" in bob.page.locator("#history").inner_text()
    bob.shot("action-executed")
    bob.assert_clean()

    request.refresh_from_db()
    call = Call.objects.get(pk=call_id)
    assert request.status == ActionStatus.EXECUTED and request.decided_by == console_people["approver"]
    assert call.state == "COMMITTED"
    assert sandbox.ledger(key)["effects"] == 1  # exactly one refund for the key
    assert _posts(sandbox, key) == 2  # the original and the one replay, both with the same key
    replay = Attempt.objects.get(call_id=call_id, number=2)
    assert request.attempt_id == replay.pk

    # The call left the Human review queue, and its page tells the whole story.
    page.goto("/queues/human-review/")
    assert page.locator(f"#call-{call_id}").count() == 0
    page.goto(f"/calls/{call_id}/")
    assert page.locator(f"#request-{request.pk}").get_attribute("data-status") == "executed"
    timeline = page.locator("#timeline").inner_text()
    story = [
        f"action.previewed\nrequest #{request.pk}",
        "action.requested",
        "action.approved",
        "action.executing",
        "attempt 2 admitted",
        "attempt 2 reported: HTTP 200",
        "→ COMMITTED",
        "action.executed",
    ]
    positions = [_find(timeline, step) for step in story]
    assert positions == sorted(positions), list(zip(story, positions, strict=True))
    steps = set(
        AuditEvent.objects.filter(call_id=call_id, action__startswith="action.").values_list("action", flat=True)
    )
    assert steps == {"action.previewed", "action.requested", "action.approved", "action.executing", "action.executed"}
    alice.assert_clean()


def _find(text: str, step: str) -> int:
    """Where a timeline step appears (the first line of `step` is enough: inner_text keeps the entry's pieces on
    one line or splits them, depending on the layout)."""
    first = step.split("\n", 1)[0]
    at = text.find(first)
    assert at >= 0, f"{first!r} not on the timeline:\n{text}"
    return at

"""The Compensation problems queue and the compensation chain in a real browser (docs/compensation.md, docs/console.md,
docs/console.md): Playwright driving Debian's Chromium against `live_server`, the orders made through the real API
against the real sandbox process (tests/test_compensations.py's `world`).

A reviewer signs in, sees the live count in the navigation, opens the refused cancellation from the Compensation
problems queue with the keyboard (j, Enter) — the cancelled order is not listed — and reads the chain on the call
page: the forward order, the compensation with its own key, its attempt refused by 409 `not_cancellable`, and the
result in words. No page raises a CSP violation or a script error. Screenshots go to
var/test-artifacts/browser/compensation-*.png. The browser is /usr/bin/chromium; without it these tests skip with
that reason, or fail under REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import pytest

from recovery.models import ActionRequest, ActionStatus, Call, CompensationEntry
from recovery.services.compensation_plans import derive_key
from tests import test_compensations as sagas
from tests.test_console_compensations import cancelled, refused_cancel

pytestmark = pytest.mark.django_db(transaction=True)

world = sagas.world  # the fixture
APPROVE_NEW = "Approve new compensation"
EXECUTED_WAIT_MS = 15_000  # the job runs at once; the request's status block refreshes every 3 s


def test_a_reviewer_opens_a_failed_compensation_from_its_queue_reads_the_chain_and_an_approver_lets_it_run_again(
    world, open_console, console_people, runner
):
    done = cancelled(world)
    failed = refused_cancel(world)
    entry = CompensationEntry.objects.get(call=failed)

    alice = open_console()
    alice.sign_in("reviewer", start="/queues/compensation-problems/")
    page = alice.page
    assert page.url.endswith("/queues/compensation-problems/")
    assert page.get_by_role("heading", level=1).inner_text() == "Compensation problems"
    nav = page.get_by_role("link", name="Compensation problems")
    assert nav.get_attribute("aria-current") == "page" and nav.locator(".count").inner_text() == "1"
    assert alice.row_ids() == [failed.pk]  # the cancelled order needs nobody
    assert "compensation 1: failed (refused)" in alice.row(failed).inner_text()
    assert done.pk not in alice.row_ids()
    alice.shot("compensation-queue")

    page.keyboard.press("j")
    assert alice.current_id() == failed.pk
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url.endswith(f"/calls/{failed.pk}/")

    assert "created, not cancelled: the undo failed" in page.locator("#effect-story").inner_text()
    forward = page.locator("#chain-forward").inner_text()
    assert "order.create" in forward and failed.idempotency_key in forward
    compensation = page.locator("#compensation-1")
    text = compensation.inner_text()
    assert "order.cancel" in text and entry.idempotency_key in text and "failed" in text
    attempt = page.locator("#compensation-1-attempt-1").inner_text()
    assert "409" in attempt and "not_cancellable" in attempt and "refusal" in attempt
    result = page.locator("#chain-result").inner_text()
    assert "COMPENSATION_FAILED" in result and "the effect still stands" in result
    # The masked request is one click away, and never carries the provider's key.
    compensation.locator("#compensation-1-attempt-1 summary").click()
    request = compensation.locator("#compensation-1-attempt-1 pre").first.inner_text()
    assert "Idempotency-Key" in request and entry.idempotency_key in request and sagas.API_KEY not in request
    timeline = page.locator("#timeline").inner_text()
    assert "compensation 1 made: order.cancel" in timeline and "result: COMPENSATION_FAILED" in timeline
    assert timeline.index("compensation 1 made") < timeline.index("result: COMPENSATION_FAILED")
    assert "never created" not in page.locator("main").inner_text()
    alice.shot("compensation-call-page")
    alice.assert_clean()

    # The task page shows the call in its group with the same words.
    with page.expect_navigation():
        page.locator("section", has=page.locator("#intent-h")).get_by_role("link", name=failed.task.external_id).click()
    group = page.locator("#fact-compensated").inner_text()
    assert "created, not cancelled: the undo failed" in group and entry.idempotency_key in group
    alice.shot("compensation-task-page")
    alice.assert_clean()

    # The provider would now take the cancellation (the order has not shipped). From the call page the reviewer
    # previews a new compensation: the exact cancel with the ledger's next key, the credential masked; nothing sent.
    sandbox = world["sandbox"]
    sandbox.clear_faults()
    key = derive_key(failed.idempotency_key, 2)
    sent_before = len(sandbox.requests())
    page.goto(f"/calls/{failed.pk}/")
    with page.expect_navigation():
        page.get_by_role("button", name=f"Preview: {APPROVE_NEW}").click()
    request = ActionRequest.objects.get(call=failed, action="approve_new_compensation")
    plan = page.locator("#plan").inner_text()
    assert f"/orders/{failed.provider_ref}/cancel" in plan and key in page.locator("#plan-key").inner_text()
    assert "Bearer [REDACTED]" in page.locator("#plan table.headers").inner_text()
    assert sagas.API_KEY not in page.content()
    assert page.locator("#checks li.failed").count() == 0
    assert "one cancellation expected" in page.locator("main").inner_text()
    assert len(sandbox.requests()) == sent_before  # the dry run sent nothing
    alice.shot("compensation-preview")
    page.get_by_label("Reason").fill("The order has not shipped yet: the provider takes the cancellation now.")
    with page.expect_navigation():
        page.get_by_role("button", name=f"Request “{APPROVE_NEW}”").click()
    assert page.locator("#action-status [data-status]").get_attribute("data-status") == "requested"
    alice.assert_clean()

    # The approver, in a browser of their own, approves it from Approvals; a worker runs it once.
    bob = open_console()
    bob.sign_in("approver", start="/approvals/")
    row = bob.page.locator(f"#approval-{request.pk}")
    assert APPROVE_NEW in row.inner_text() and key in row.inner_text()
    with bob.page.expect_navigation():
        row.locator("a.open").click()
    bob.page.locator("#id_approve-reason").fill("Checked with the provider: one cancellation, under its own key.")
    bob.page.once("dialog", lambda dialog: dialog.accept())  # approving asks for a confirmation, however sent
    with bob.page.expect_navigation():
        bob.page.get_by_role("button", name="Approve", exact=True).click()
    assert runner.wait_idle(timeout=30)
    bob.page.locator('#action-status [data-status="executed"]').wait_for(timeout=EXECUTED_WAIT_MS)
    assert key in bob.page.locator("#result-what").inner_text()
    bob.shot("compensation-executed")
    bob.assert_clean()

    request.refresh_from_db()
    assert request.status == ActionStatus.EXECUTED and request.decided_by == console_people["approver"]
    assert Call.objects.get(pk=failed.pk).state == "COMPENSATED"
    cancels = [r for r in sandbox.requests(key=key) if r["method"] == "POST"]
    assert len(cancels) == 1 and sandbox.ledger(key)["effects"] == 1  # run once
    page.goto("/queues/compensation-problems/")
    assert failed.pk not in alice.row_ids()
    page.goto(f"/calls/{failed.pk}/")
    assert "created, then cancelled" in page.locator("#effect-story").inner_text()
    alice.assert_clean()

"""The Compensation problems queue and the compensation chain in a real browser (SPEC §12, §15.3, §15.5): Playwright
driving Debian's Chromium against `live_server`, the orders made through the real API against the real sandbox
process (tests/test_compensations.py's `world`).

A reviewer signs in, sees the live count in the navigation, opens the refused cancellation from the Compensation
problems queue with the keyboard (j, Enter) — the cancelled order is not listed — and reads the chain on the call
page: the forward order, the compensation with its own key, its attempt refused by 409 `not_cancellable`, and the
result in words. No page raises a CSP violation or a script error. Screenshots go to
var/test-artifacts/browser/compensation-*.png. The browser is /usr/bin/chromium; without it these tests skip with
that reason, or fail under REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import pytest

from recovery.models import CompensationEntry
from tests import test_compensations as sagas
from tests.test_console_compensations import cancelled, refused_cancel

pytestmark = pytest.mark.django_db(transaction=True)

world = sagas.world  # the fixture


def test_a_reviewer_opens_a_failed_compensation_from_its_queue_and_reads_the_chain(world, open_console, console_people):
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

"""The call page in a real browser (docs/console.md): Playwright driving Debian's Chromium against `live_server`.

A reviewer signs in, opens an UNKNOWN refund from the UNKNOWN queue with the keyboard and finds on its page the
intent, every attempt, every receipt, the decision card and the forbidden replay with its reason; the status block's
live refresh announces a new status check. Hostile text from the agent and the provider is shown as text and never
runs, in the full page and in the htmx swap; no page raises a CSP violation.

The refunds are built through the real services (tests.test_console_call_page.unknown_refund), and the browser
fixtures (CSP and script-error recording) come from tests/browser.py. Screenshots go to
var/test-artifacts/browser/call-page-*.png. The browser is /usr/bin/chromium; without it these tests skip with that
reason, or fail under REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import pytest

from recovery.models import Attempt, Receipt
from recovery.providers.status import StatusAnswer
from recovery.services.reconcile import apply_answer
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT
from tests.test_console_call_page import SECRET_DETAIL, hostile_refund, load_refund_registry, unknown_refund

pytestmark = pytest.mark.django_db(transaction=True)

REFRESH_WAIT_MS = 8_000  # the status block refreshes every 5 s


def test_a_reviewer_opens_an_unknown_refund_from_the_queue_and_finds_everything(open_console, console_people):
    load_refund_registry()
    call = unknown_refund()
    apply_answer(call.pk, StatusAnswer(observed="pending", provider_status="pending", http_status=200), worker="w")
    receipts = list(Receipt.objects.filter(call=call).order_by("checked_at", "pk"))
    attempt = Attempt.objects.get(call=call)
    assert len(receipts) == 2

    alice = open_console()
    alice.sign_in("reviewer", start="/queues/unknown/")  # home is the overview; the queue is where reviewers start
    page = alice.page
    assert page.url.endswith("/queues/unknown/")
    page.keyboard.press("j")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url.endswith(f"/calls/{call.pk}/")
    assert page.get_by_role("heading", level=1).inner_text().startswith(f"Call {call.pk}")

    # The intent.
    intent = page.locator("section", has=page.locator("#intent-h"))
    assert "Refund order O-8848: the parcel arrived damaged" in intent.inner_text()
    assert '"amount_cents": 1250' in intent.locator("pre").inner_text()
    status = page.locator("#call-live")
    assert "being confirmed" in status.inner_text() and call.idempotency_key in status.inner_text()
    # Every attempt and every receipt, one row each.
    assert page.locator("#attempts tbody tr").count() == 1
    assert attempt.attempt_id in page.locator("#attempt-1").inner_text()
    assert page.locator("#receipts tbody tr").count() == 2
    for receipt in receipts:
        assert "pending" in page.locator(f"#receipt-{receipt.pk}").inner_text()
    # The decision card and the forbidden replay, with its reason.
    fields = page.locator("#latest-card-fields")  # the card as fields, the decision first; its text form folded
    assert fields.locator("dt").first.inner_text() == "Decision"
    assert fields.locator("dd").first.inner_text() == "reconcile"
    assert not page.locator("#latest-card").is_visible()
    replay = page.locator("#action-replay_same_key")
    assert replay.get_attribute("data-allowed") == "no"
    why = page.locator("li.forbidden-group", has=replay).locator(".why")  # said once for the actions it forbids
    assert "a blind replay is forbidden while the outcome is unknown: reconcile by key first" in why.inner_text()
    reconcile = page.locator("#action-reconcile_now")
    assert reconcile.get_by_role("button", name="Preview: Reconcile now").is_enabled()
    # Each allowed action is a form that previews it (a dry run), never one that executes it.
    targets = page.locator("main form").evaluate_all("fs => fs.map(f => f.getAttribute('action'))")
    previews = [f"/calls/{call.pk}/actions/{name}/preview/" for name in ("reconcile_now", "escalate")]
    assert targets == [f"/calls/{call.pk}/assign/", *previews]  # and the owner's form: assigning is not an action
    assert SECRET_DETAIL in page.locator("section", has=page.locator("#diagnostics-h")).inner_text()
    alice.shot("call-page-unknown-refund")
    alice.assert_clean()

    # A third status check lands while the page is open: the live refresh says so, the evidence stays put.
    apply_answer(call.pk, StatusAnswer(observed="pending", provider_status="pending", http_status=200), worker="w")
    page.locator("#call-live .notice.changed").wait_for(timeout=REFRESH_WAIT_MS)
    assert "1 new status check since the page was drawn" in page.locator("#call-live").inner_text()
    assert page.locator("#receipts tbody tr").count() == 2
    alice.shot("call-page-live-refresh")
    alice.assert_clean()


def test_hostile_text_on_the_call_page_is_shown_as_text_and_never_runs(open_console, console_people):
    load_refund_registry()
    call = hostile_refund(quote="\"'></td></tr><svg onload=window.__pwned=1>")
    apply_answer(
        call.pk,
        StatusAnswer(observed="pending", provider_status=HOSTILE_SCRIPT, provider_ref=HOSTILE_IMG, http_status=200),
        worker="w",
    )

    bob = open_console()
    bob.sign_in("reviewer", start="/queues/unknown/")
    page = bob.page
    with page.expect_navigation():
        page.locator(f"#call-{call.pk} a.open").click()
    main = page.locator("main")
    shown = main.inner_text()
    for text in (HOSTILE_SCRIPT, HOSTILE_IMG, "<svg onload=window.__pwned=1>", f"refund {HOSTILE_SCRIPT}"):
        assert text in shown, text
    assert page.locator("#attempt-1").get_by_text(HOSTILE_IMG, exact=True).count() == 1  # the error code
    assert page.locator("#attempt-1").get_by_text(HOSTILE_SCRIPT, exact=True).count() == 1  # the request id
    assert page.locator("#receipts").get_by_text(HOSTILE_IMG, exact=True).count() >= 1  # a provider status
    # The provider ref, taken from the attempt's provider request id.
    assert page.locator("#call-live").get_by_text(HOSTILE_SCRIPT, exact=True).count() == 1
    assert main.locator("img, script, svg").count() == 0
    bob.shot("call-page-hostile-text")
    bob.assert_clean()

    # The same status block through the live refresh's htmx swap, where markup would be parsed and inserted.
    swapped = page.evaluate(
        """async () => {
            const live = document.getElementById("call-live");
            live.dataset.before = "yes";
            await htmx.ajax("GET", live.getAttribute("hx-get"), {target: "#call-live", swap: "outerHTML"});
            return document.getElementById("call-live").dataset.before === undefined;
        }"""
    )
    assert swapped
    page.locator("#call-live").get_by_text(HOSTILE_SCRIPT, exact=True).wait_for()
    assert main.locator("img, script, svg").count() == 0
    bob.assert_clean()

    # A viewer reads the same page without the diagnostic's content.
    carol = open_console()
    carol.sign_in("viewer", start=f"/calls/{call.pk}/")
    assert "boom" not in carol.page.content()  # the diagnostic text, in any escaping
    assert "their content is for reviewers, approvers and admins" in carol.page.locator("main").inner_text()
    carol.shot("call-page-viewer")
    carol.assert_clean()

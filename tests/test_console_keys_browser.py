"""The decision in three keystrokes (docs/console.md; issue: the operator's hour), in a real browser: with the first row
of the Human review queue focused, a reviewer opens the call (Enter), previews the recommended action (p), types the
reason and requests it (Enter); an approver approves by key with a confirmation; `?` lists the keys.

The call is the refund of tests/test_console_actions_browser.py: committed at the sandbox, its reply lost, its status
API down until the poll budget sent it to a person — the provider deduplicates by the key, so the page recommends the
same-key replay.
"""

from __future__ import annotations

import pytest

from recovery.models import ActionRequest, ActionStatus
from tests.test_console_actions_browser import _refund_in_human_review
from tests.test_console_actions_browser import world as world  # the fixture, found by its name (re-exported)

pytestmark = pytest.mark.django_db(transaction=True)


def test_queue_to_request_takes_three_keystrokes_and_the_reason_and_an_approver_approves_by_key(
    world, runner, open_console, console_people
):
    call_id, _ = _refund_in_human_review(world)
    alice = open_console()
    alice.sign_in("reviewer", start="/queues/human-review/")
    page = alice.page
    page.keyboard.press("j")  # the first row (the one waiting): focused, as the queue's keys start
    assert page.evaluate("document.activeElement.id") == f"call-{call_id}"
    pressed = 0

    with page.expect_navigation():
        page.keyboard.press("Enter")
        pressed += 1
    assert page.url.endswith(f"/calls/{call_id}/")
    recommended = page.locator("[data-recommended]")
    assert recommended.get_attribute("data-action") == "replay_same_key"
    assert "Recommended" in recommended.inner_text() and "deduplicates by this key" in recommended.inner_text()
    assert page.locator("ul.actions li").first.get_attribute("data-recommended") == "yes"  # it leads the list

    with page.expect_navigation():
        page.keyboard.press("p")
        pressed += 1
    assert "/actions/" in page.url
    assert page.evaluate("document.activeElement.name") == "reason"  # the reason is where the keys are
    page.keyboard.type("The provider deduplicates by the key: a same-key replay settles it.")
    with page.expect_navigation():
        page.keyboard.press("Enter")
        pressed += 1

    assert pressed == 3
    request = ActionRequest.objects.get(call_id=call_id)
    assert request.status == ActionStatus.REQUESTED and request.action == "replay_same_key"
    assert request.reason == "The provider deduplicates by the key: a same-key replay settles it."
    alice.assert_clean()

    # `?` lists the keys; Escape closes the list.
    page.keyboard.press("?")
    keys = page.locator("#keys")
    assert keys.is_visible() and "preview the recommended action" in keys.inner_text()
    page.keyboard.press("Escape")
    assert not keys.is_visible()

    bob = open_console()
    bob.sign_in("approver", start=f"/actions/{request.pk}/")
    asked = []

    def answer(dialog) -> None:
        asked.append(dialog.message)
        dialog.dismiss() if len(asked) < 3 else dialog.accept()

    bob.page.on("dialog", answer)
    bob.page.keyboard.press("a")
    assert bob.page.evaluate("document.activeElement.id") == "id_approve-reason"
    bob.page.keyboard.type("Checked: the provider keeps the key for a day.")
    bob.page.keyboard.press("Enter")  # the confirmation, dismissed: nothing is sent
    bob.page.wait_for_timeout(300)
    request.refresh_from_db()
    assert asked == ["Approve this request? A worker then executes it once."] and request.status == "requested"
    bob.page.get_by_role("button", name="Approve", exact=True).click()  # a click asks the same, dismissed
    bob.page.wait_for_timeout(300)
    request.refresh_from_db()
    assert asked == ["Approve this request? A worker then executes it once."] * 2 and request.status == "requested"
    bob.page.locator("#id_approve-reason").focus()
    with bob.page.expect_navigation():
        bob.page.keyboard.press("Enter")  # asked again, accepted
    request.refresh_from_db()
    assert len(asked) == 3 and request.status in ("approved", "executing", "executed")
    bob.assert_clean()

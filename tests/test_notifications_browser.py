"""Assignment, the assignee filter and saved views in a real browser (docs/notifications.md): a reviewer assigns a
row to themselves with the m key, filters the queue to what is assigned to them, saves that view and finds it in the
navigation with its live count — with no CSP violation or script error.

Playwright drives Debian's Chromium against `live_server` with tests/browser.py's fixtures; the screenshot is
var/test-artifacts/browser/saved-view.png.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from recovery.models import Assignment, SavedView

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_reviewer_assigns_with_a_key_filters_by_assignee_and_saves_the_view(open_console, console_people, make_call):
    mine, other = make_call("HUMAN_REVIEW"), make_call("HUMAN_REVIEW")
    console = open_console()
    console.sign_in("reviewer", start="/queues/human-review/")
    page = console.page

    console.row(mine).locator("td.why").click()  # the row becomes the current one
    page.keyboard.press("m")
    expect(console.row(mine).locator(".assignee")).to_have_text("assigned to reviewer")
    assert Assignment.objects.get(call=mine).assignee.username == "reviewer"
    expect(console.row(mine).locator(".assign-me")).to_have_count(0)  # theirs already
    expect(console.row(other).locator(".assign-me")).to_have_count(1)

    page.get_by_label("Assigned").select_option("me")
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(re.compile(r"assigned=me"))
    assert console.row_ids() == [mine.pk]

    page.get_by_label("Save these filters as").fill("Mine")
    page.get_by_role("button", name="Save view").click()
    view = page.locator("#queue-nav li.saved-view")
    expect(view).to_have_attribute("data-value", "1")
    expect(view.get_by_role("link")).to_have_text(re.compile(r"Mine\s+1"))
    assert "assigned=me" in SavedView.objects.get(user__username="reviewer").query.split("&")

    Assignment.objects.create(call=other, assignee=console_people["reviewer"], assigned_by=console_people["reviewer"])
    expect(view).to_have_attribute("data-value", "2", timeout=15_000)  # the navigation's live refresh
    console.shot("saved-view")
    console.assert_clean()

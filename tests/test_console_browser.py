"""The operator console in a real browser (docs/console.md, docs/console.md): Playwright driving Debian's Chromium
against `live_server`. A reviewer signs in through the form, filters the UNKNOWN queue, claims an item from the keyboard
while a second reviewer in another browser context sees it held and cannot take it, the live refresh brings a new
item in (marked new, filters and scroll kept), j / k / Enter move and open; hostile text from agents and providers is
shown as text and never runs, in the console and in the admin; the console's pages raise no CSP violation.

Screenshots of each page go to var/test-artifacts/browser/ (git-ignored), replaced on every run.

The browser is /usr/bin/chromium (`apt-get install chromium`), never one Playwright downloads. Without it these
tests skip with that reason, or fail under REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import Call, Task, Tenant, Tool
from recovery.models.roles import REVIEWER
from recovery.services.users import user_save_with_roles
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT, PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)

REFRESH_WAIT_MS = 8_000  # the queue refreshes every 5 s; a new row must show within one cycle (plus slack)

# The queue as the reader sees it at one instant (one script run, so no refresh can land halfway through).
SNAPSHOT = """() => {
  const ids = (selector) => Array.from(document.querySelectorAll(selector), (r) => Number(r.dataset.id));
  return {
    ids: ids("#rows tr[data-id]"),
    new: ids("#rows tr.new"),
    current: ids("#rows tr.current"),
    refreshes: document.getElementById("rows").getAttribute("hx-get"),
    scrollY: window.scrollY,
  };
}"""


def _aged(call: Call, minutes: float) -> Call:
    """The call as if it had been in its state for `minutes` (queues list the oldest first)."""
    at = timezone.now() - timedelta(minutes=minutes)
    Call.objects.filter(pk=call.pk).update(state_changed_at=at)
    call.state_changed_at = at
    return call


def test_a_reviewer_filters_claims_and_watches_the_unknown_queue(
    open_console, console_people, registry, make_call, task
):
    refund, lookup = registry["refund"], registry["lookup"]
    refunds = [_aged(make_call("UNKNOWN", tool=refund), 300 - i) for i in range(24)]
    lookups = [_aged(make_call("UNKNOWN", tool=lookup), 250 - i) for i in range(4)]
    _aged(make_call("HUMAN_REVIEW"), 30)
    make_call("COMMITTED")
    first = refunds[0]

    # A reviewer opens the UNKNOWN queue, signs in through the form and is brought back to it (home is the overview).
    alice = open_console()
    alice.sign_in("reviewer", start="/queues/unknown/", shot="01-sign-in")
    page = alice.page
    assert page.url.endswith("/queues/unknown/")
    assert alice.row_ids() == [c.pk for c in sorted(refunds + lookups, key=lambda c: (c.state_changed_at, c.pk))]
    assert page.locator('[data-queue="unknown"]').inner_text() == "28"
    alice.shot("02-queue-unknown")
    for slug, name in [("human-review", "Human review"), ("calls", "All calls")]:
        page.get_by_role("navigation", name="Console").get_by_role("link", name=name).click()
        page.wait_for_url(f"**/queues/{slug}/")
        assert page.locator('[aria-current="page"]').inner_text().startswith(name)
        alice.assert_clean()
        alice.shot(f"03-queue-{slug}")

    # Filters: by tool, then by search; the URL carries them and the form shows them.
    page.goto("/queues/unknown/")
    page.get_by_label("Tool").select_option(label="refund.create")
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(re.compile(rf"[?&]tool={refund.pk}(&|$)"))
    assert alice.row_ids() == [c.pk for c in refunds]
    assert page.get_by_label("Tool").input_value() == str(refund.pk)
    filtered_url = page.url

    page.get_by_label("Search").fill(refunds[5].idempotency_key)
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(re.compile(rf"[?&]q={refunds[5].idempotency_key}(&|$)"))
    assert f"tool={refund.pk}" in page.url and alice.row_ids() == [refunds[5].pk]
    assert page.get_by_label("Search").input_value() == refunds[5].idempotency_key
    alice.shot("04-queue-unknown-searched")
    page.get_by_label("Search").press("j")  # typing in a field is not a key command
    assert alice.current_id() is None

    # A second reviewer has the same queue open (its live refresh held back, so what it shows goes stale).
    bob = open_console()
    bob.sign_in("reviewer2")
    bob.page.route(
        re.compile(r"/queues/"),
        lambda route: route.abort() if route.request.headers.get("hx-request") else route.continue_(),
    )
    bob.page.goto(filtered_url)
    assert bob.row(first).locator('[data-action="claim"]').is_visible()

    # The first reviewer claims the first item from the keyboard: j makes it current, c claims it.
    page.goto(filtered_url)
    page.keyboard.press("j")
    assert alice.current_id() == first.pk
    page.keyboard.press("c")
    held = alice.row(first)
    held.locator('[data-action="release"]').wait_for()
    page.locator(f"#call-{first.pk}.claimed:not(.htmx-settling)").wait_for()
    assert held.locator(".holder").inner_text() == "reviewer"
    assert "You hold call" in held.locator(".notice").inner_text()
    assert alice.current_id() == first.pk  # the swapped row stays current
    assert Call.objects.get(pk=first.pk).claimed_by == console_people["reviewer"]
    alice.shot("05-claimed")

    # The second reviewer's stale Claim button is refused, and the refusal is shown on the row.
    bob.row(first).locator('[data-action="claim"]').click()
    bob.row(first).locator(".notice.error").wait_for()
    assert "claimed by reviewer" in bob.row(first).locator(".notice").inner_text()
    assert bob.row(first).locator(".holder").inner_text() == "reviewer"
    assert bob.row(first).locator(".claim-button").count() == 0
    bob.shot("06-claim-refused-for-another-reviewer")
    # Reloaded, the page shows the holder and offers no button for that row (the others are still claimable).
    bob.page.reload()
    assert bob.row(first).locator(".holder").inner_text() == "reviewer"
    assert bob.row(first).locator(".claim-button").count() == 0
    assert bob.row(refunds[1]).locator('[data-action="claim"]').is_visible()
    bob.shot("07-claimed-seen-by-another-reviewer")
    bob.assert_clean()
    assert Call.objects.get(pk=first.pk).claimed_by == console_people["reviewer"]

    # The live refresh: a new UNKNOWN refund arrives and shows, marked new; a lookup (filtered out) does not; the
    # filters, the scroll position and the current row are kept.
    page.evaluate("window.scrollTo(0, 300)")
    scrolled = page.evaluate("window.scrollY")
    assert scrolled > 0  # the page is long enough to scroll
    arriving = make_call("UNKNOWN", tool=refund)
    filtered_out = make_call("UNKNOWN", tool=lookup)
    page.locator(f"#call-{arriving.pk}.new").wait_for(timeout=REFRESH_WAIT_MS)
    seen = page.evaluate(SNAPSHOT)  # in one go: the next refresh (5 s on) knows the row and drops its mark
    assert seen["ids"] == [c.pk for c in refunds] + [arriving.pk] and filtered_out.pk not in seen["ids"]
    assert seen["new"] == [arriving.pk] and seen["current"] == [first.pk]
    assert page.url == filtered_url and f"tool={refund.pk}" in seen["refreshes"]
    assert abs(seen["scrollY"] - scrolled) <= 2
    page.locator('[data-queue="unknown"]').filter(has_text="30").wait_for(timeout=REFRESH_WAIT_MS)  # nav counts too
    alice.shot("08-live-refresh-new-row")

    # j / k move the current row; Enter opens the current row's link.
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("k")
    assert alice.current_id() == refunds[1].pk
    page.keyboard.press("k")
    page.keyboard.press("k")  # stops at the first row
    assert alice.current_id() == first.pk
    page.keyboard.press("j")
    alice.assert_clean()
    with page.expect_navigation():
        page.keyboard.press("Enter")
    # The row links to the call's page.
    assert page.url.endswith(f"/calls/{refunds[1].pk}/")


def test_hostile_text_is_shown_as_text_and_never_runs(open_console, console_people, registry, task, make_call):
    tool = Tool.objects.create(name=HOSTILE_IMG, provider=registry["provider"], side_effect="write", risk="high")
    tenant = Tenant.objects.create(name=f"{HOSTILE_SCRIPT} tenant", sandbox=True, all_tools=True)
    hostile_task = Task.objects.create(tenant=tenant, external_id=HOSTILE_SCRIPT, agent="x", goal=HOSTILE_IMG)
    call = make_call("UNKNOWN", tool=tool, on_task=hostile_task)
    arguments = {"note": HOSTILE_SCRIPT, "html": HOSTILE_IMG, "quote": "\"'></td></tr><svg onload=window.__pwned=1>"}
    holder, _ = user_save_with_roles(
        username="x<b>bold</b>", roles=[REVIEWER], password=PASSWORD, actor=Actor.system("t")
    )
    Call.objects.filter(pk=call.pk).update(
        arguments=arguments, claimed_by=holder, claim_until=timezone.now() + timedelta(minutes=10)
    )

    admin = open_console()
    admin.sign_in("admin", start="/queues/unknown/")
    page = admin.page
    row = admin.row(call)
    for text in (HOSTILE_IMG, HOSTILE_SCRIPT, f"{HOSTILE_SCRIPT} tenant", "x<b>bold</b>"):
        assert row.get_by_text(text, exact=True).is_visible(), text
    assert page.locator("main img, main script, main svg, main b").count() == 0
    admin.shot("09-hostile-text-queue")
    admin.assert_clean()

    # The same rows through the live refresh's htmx swap (where markup would be parsed and inserted).
    swapped = page.evaluate(
        """async () => {
            document.getElementById("rows").dataset.before = "yes";
            await htmx.ajax("GET", location.pathname, {target: "#rows", swap: "outerHTML"});
            return document.getElementById("rows").dataset.before === undefined;
        }"""
    )
    assert swapped
    row.get_by_text(HOSTILE_IMG, exact=True).wait_for()
    assert page.locator("main img, main script, main svg, main b").count() == 0
    admin.assert_clean()

    # The row opens the call's page (j, Enter); the call's admin page shows the arguments as text too.
    page.keyboard.press("j")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url.endswith(f"/calls/{call.pk}/")
    page.goto(f"/admin/recovery/call/{call.pk}/change/")
    content = page.locator("#content")
    shown = content.inner_text()
    for text in (HOSTILE_SCRIPT, HOSTILE_IMG, "<svg onload=window.__pwned=1>"):
        assert text in shown, text
    # The admin's own scripts are files and its icons are /static/ images; nothing from the arguments became markup.
    assert content.locator("script:not([src]), img:not([src^='/static/']), svg, b").count() == 0
    admin.shot("10-hostile-text-admin")
    admin.assert_clean()  # the admin's pages carry the same CSP and raise no violation either

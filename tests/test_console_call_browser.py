"""The call page in a real browser (SPEC §15.5): Playwright driving Debian's Chromium against `live_server`.

A reviewer signs in, opens an UNKNOWN refund from the UNKNOWN queue with the keyboard and finds on its page the
intent, every attempt, every receipt, the decision card and the forbidden replay with its reason; the status block's
live refresh announces a new status check. Hostile text from the agent and the provider is shown as text and never
runs, in the full page and in the htmx swap; no page raises a CSP violation.

The refunds are built through the real services (tests.test_console_call_page.unknown_refund). Screenshots go to
var/test-artifacts/browser/call-page-*.png. The browser is /usr/bin/chromium; without it these tests skip with that
reason, or fail under REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.conf import settings

from recovery.audit import Actor
from recovery.models import Attempt, Receipt
from recovery.providers.status import StatusAnswer
from recovery.roles import REVIEWER, VIEWER, sync_roles
from recovery.services.reconcile import apply_answer
from recovery.services.users import user_save_with_roles
from tests.conftest import missing_service
from tests.test_console_call_page import (
    HOSTILE_IMG,
    HOSTILE_SCRIPT,
    SECRET_DETAIL,
    load_refund_registry,
    unknown_refund,
)

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(settings.VAR_DIR) / "test-artifacts" / "browser"
PASSWORD = "a-long-test-password-42"
REFRESH_WAIT_MS = 8_000  # the status block refreshes every 5 s
CSP_WORDS = ("Content Security Policy", "Content-Security-Policy", "Refused to")
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


@pytest.fixture(scope="module")
def _async_unsafe_allowed() -> Iterator[None]:
    """Playwright's sync API runs an event loop in this thread, which Django's async guard mistakes for an async
    context; nothing here is concurrent with it, so the guard is lifted for this module only (as in
    tests/test_console_browser.py)."""
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if before is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture(scope="module")
def artifacts() -> Path:
    # Shared with the queue's browser tests: only this module's own screenshots are replaced.
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("call-page-*.png"):
        old.unlink()
    return ARTIFACTS


@pytest.fixture(scope="module")
def browser(_async_unsafe_allowed):
    if not os.access(CHROMIUM, os.X_OK):
        missing_service("needs Chromium: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing_service("needs Playwright: pip install -r requirements-dev.txt")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-background-networking"]
        )
        yield launched
        launched.close()


class Console:
    """One person's browser context on the live console, with what its pages complained of."""

    def __init__(self, browser, base_url: str, artifacts: Path):
        self.artifacts = artifacts
        self.context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 800})
        self.context.set_default_timeout(10_000)
        self.context.add_init_script(RECORD_VIOLATIONS)
        self.page = self.context.new_page()
        self.messages: list[str] = []
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.messages.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def sign_in(self, username: str, *, start: str = "/") -> None:
        page = self.page
        page.goto(start)
        assert "/sign-in/?next=" in page.url
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/sign-in/" not in url)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=self.artifacts / f"{name}.png", full_page=True)

    def assert_clean(self) -> None:
        violations = self.page.evaluate("window.__violations || []")
        csp_messages = [m for m in self.messages if any(word in m for word in CSP_WORDS)]
        assert not violations and not csp_messages, (violations, csp_messages)
        assert not self.errors, self.errors
        assert self.page.evaluate("typeof window.__pwned") == "undefined"


@pytest.fixture
def open_console(browser, live_server, artifacts) -> Iterator:
    opened: list[Console] = []

    def open_() -> Console:
        console = Console(browser, live_server.url, artifacts)
        opened.append(console)
        return console

    yield open_
    for console in opened:
        console.context.close()


@pytest.fixture
def people(db):
    # The role groups come from a data migration that an earlier transactional test's flush removed; sync_roles()
    # leaves every app marked as having no models module, so the real ones are put back (see test_console_browser).
    saved = {config.label: config.models_module for config in django_apps.get_app_configs()}
    try:
        sync_roles(django_apps)
    finally:
        for config in django_apps.get_app_configs():
            config.models_module = saved[config.label]
    made = {}
    for name, role in [("reviewer", REVIEWER), ("viewer", VIEWER)]:
        made[name], _ = user_save_with_roles(username=name, roles=[role], password=PASSWORD, actor=Actor.system("t"))
    return made


def test_a_reviewer_opens_an_unknown_refund_from_the_queue_and_finds_everything(open_console, people):
    load_refund_registry()
    call = unknown_refund()
    apply_answer(call.pk, StatusAnswer(observed="pending", provider_status="pending", http_status=200), worker="w")
    receipts = list(Receipt.objects.filter(call=call).order_by("checked_at", "pk"))
    attempt = Attempt.objects.get(call=call)
    assert len(receipts) == 2

    alice = open_console()
    alice.sign_in("reviewer")
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
    assert "decision: reconcile" in page.locator("#latest-card").inner_text()
    replay = page.locator("#action-replay_same_key")
    assert replay.get_attribute("data-allowed") == "no"
    assert "a blind replay is forbidden while the outcome is unknown: reconcile by key first" in replay.inner_text()
    reconcile = page.locator("#action-reconcile_now")
    assert reconcile.get_by_role("button", name="Reconcile now").is_disabled()
    assert page.locator("main form").count() == 0
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


def test_hostile_text_on_the_call_page_is_shown_as_text_and_never_runs(open_console, people):
    load_refund_registry()
    quote = "\"'></td></tr><svg onload=window.__pwned=1>"
    call = unknown_refund(
        arguments={"note": HOSTILE_SCRIPT, "html": HOSTILE_IMG, "quote": quote},
        goal=f"refund {HOSTILE_SCRIPT}",
        error_code=HOSTILE_IMG,
        provider_request_id=HOSTILE_SCRIPT,
        error_message=f"boom {HOSTILE_IMG}",
        receipt_status=HOSTILE_IMG,
        receipt_body={"status": HOSTILE_IMG, "note": HOSTILE_SCRIPT},
    )
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

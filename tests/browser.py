"""Browser-test fixtures shared by every tests/test_*_browser.py module: Playwright driving Debian's Chromium
(/usr/bin/chromium, never a downloaded browser) against Django's `live_server`, one context per person, each page's
CSP violations and script errors recorded, screenshots in var/test-artifacts/browser/ (replaced once per test run).

Without Chromium or Playwright the tests that use `browser` skip with the reason, or fail under REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.conf import settings

from recovery.models.roles import sync_roles
from tests.conftest import missing_service
from tests.console import PASSWORD, make_people

__all__ = [
    "ARTIFACTS", "CHROMIUM", "CSP_WORDS", "Console",
    "artifacts", "async_unsafe_allowed", "browser", "console_people", "open_console", "runner",
]  # fmt: skip

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(settings.VAR_DIR) / "test-artifacts" / "browser"
CSP_WORDS = ("Content Security Policy", "Content-Security-Policy", "Refused to")

# Every page records the CSP violations it saw (the DOM event, which is what the console message reports too).
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


@pytest.fixture(scope="module")
def async_unsafe_allowed() -> Iterator[None]:
    """Playwright's sync API runs an asyncio event loop in this thread (in a greenlet), so Django's guard sees "an
    async context" and refuses the ORM with SynchronousOnlyOperation — on the test's own data setup and on the test
    database's flush at teardown. Nothing here is concurrent with that loop, so the guard is lifted for this
    module only, and put back afterwards. (The live server answers on its own thread, which has no loop.)"""
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if before is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture(scope="session")
def artifacts(request) -> Iterator[Path]:
    """The screenshot directory, emptied once per test run (every browser module adds its pages to it). Under xdist
    each worker runs this fixture: the first to come empties it and stamps it with the run's id, under a lock, so a
    second worker neither empties it again under the first's screenshots nor races it to create it."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}"
    ARTIFACTS.parent.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS.parent / ".browser-artifacts.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = ARTIFACTS / ".run"
        if not stamp.is_file() or stamp.read_text() != run:
            shutil.rmtree(ARTIFACTS, ignore_errors=True)
            ARTIFACTS.mkdir(parents=True)
            stamp.write_text(run)
    yield ARTIFACTS
    shots = sorted(p.name for p in ARTIFACTS.glob("*.png"))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter and capture and shots:
        with capture.global_and_fixture_disabled():  # shown, not captured, even when the tests pass
            reporter.write_line(f"\nbrowser screenshots ({len(shots)}): {ARTIFACTS}/")


@pytest.fixture(scope="module")
def browser(async_unsafe_allowed):
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
    """One browser context (a person at their own browser) on the live console, with what its pages complained of."""

    def __init__(self, browser, base_url: str, artifacts: Path):
        self.base_url, self.artifacts = base_url, artifacts
        self.context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 720})
        self.context.set_default_timeout(10_000)
        self.context.add_init_script(RECORD_VIOLATIONS)
        self.page = self.context.new_page()
        self.messages: list[str] = []
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.messages.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def sign_in(self, username: str, *, start: str = "/", shot: str = "") -> None:
        page = self.page
        page.goto(start)
        assert "/sign-in/?next=" in page.url  # signed out: sent to sign in, and back here afterwards
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        if shot:
            self.shot(shot)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/sign-in/" not in url)  # and its load event

    def shot(self, name: str) -> None:
        self.page.screenshot(path=self.artifacts / f"{name}.png", full_page=True)

    def row(self, call):
        return self.page.locator(f"#call-{call.pk}")

    def row_ids(self) -> list[int]:
        return [int(i) for i in self.page.locator("#rows tr[data-id]").evaluate_all("rs => rs.map(r => r.dataset.id)")]

    def current_id(self) -> int | None:
        ids = self.page.locator("#rows tr.current").evaluate_all("rs => rs.map(r => r.dataset.id)")
        assert len(ids) <= 1, ids
        return int(ids[0]) if ids else None

    def assert_clean(self) -> None:
        """No CSP violation (as an event or a console message), no uncaught script error, nothing hostile ran."""
        violations = self.page.evaluate("window.__violations || []")
        csp_messages = [m for m in self.messages if any(word in m for word in CSP_WORDS)]
        assert not violations and not csp_messages, (violations, csp_messages)
        assert not self.errors, self.errors
        assert self.page.evaluate("typeof window.__pwned") == "undefined"

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def open_console(browser, live_server, artifacts) -> Iterator:
    opened: list[Console] = []

    def open_() -> Console:
        console = Console(browser, live_server.url, artifacts)
        opened.append(console)
        return console

    yield open_
    for console in opened:
        console.close()


@pytest.fixture
def console_people(db) -> dict:
    """tests/console.py's people (one user per role, a second reviewer and a user with no role, each with PASSWORD)
    for a transactional test.

    The role groups come from a data migration, and the flush after an earlier transactional test removed them.
    sync_roles() marks every app as having no models module when it is done (it is written for a migration's
    historical apps); put the real ones back, or later flushes would skip post_migrate."""
    saved = {config.label: config.models_module for config in django_apps.get_app_configs()}
    try:
        sync_roles(django_apps)
    finally:
        for config in django_apps.get_app_configs():
            config.models_module = saved[config.label]
    return make_people()


@pytest.fixture
def runner(settings, monkeypatch):
    """Jobs on a fresh in-process runner (no Redis), as the embedded default runs them, waited for by the test."""
    from recovery.jobs import inprocess

    settings.REDIS_URL = ""
    fresh = inprocess.Runner([])
    monkeypatch.setattr(inprocess, "_runner", fresh)
    yield fresh
    fresh.stop(timeout=30)

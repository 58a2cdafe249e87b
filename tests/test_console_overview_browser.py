"""The overview and operations pages in a real browser (docs/console.md, docs/console.md, docs/metrics.md,
docs/drills.md): a viewer signs in, reads the overview (the UNKNOWN flow chart drawn as inline SVG and coloured by the
page's stylesheet), follows a headline figure to its section of the metrics page, then reads the breakers page and a
drill run whose log and results carry hostile text — shown as text, never run, with no CSP violation anywhere.

Screenshots go to var/test-artifacts/browser/ (overview.png, metrics.png, breakers.png, drill-run.png), replaced on
every run.
Like tests/test_console_browser.py, it drives Debian's Chromium (/usr/bin/chromium) and skips without it (fails under
REQUIRE_SERVICES=1). The browser fixtures come from tests/browser.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.models import Tool
from recovery.services.breakers import breaker_record
from recovery.services.metrics import metrics_fold
from tests.browser import ARTIFACTS
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT
from tests.test_console_operations import drill_result, stored_run
from tests.test_console_overview import add_call, attempt, clock, make_world, settle, unknown

pytestmark = pytest.mark.django_db(transaction=True)
SHOTS = ("overview.png", "metrics.png", "breakers.png", "drill-run.png")


@pytest.fixture
def story(console_people):
    """A day of work as the services leave it: UNKNOWN refunds entered and settled over the last hours, failures of
    several classes, an open breaker, and a stored drill run with hostile text in its results and log; folded into
    the metrics, as the periodic job would."""
    task = make_world()
    for hours in (20, 14, 9, 6, 5, 3, 2):
        call = unknown(task, "refund.create", ago=timedelta(hours=hours, minutes=10))
        if hours % 2 == 0:
            with clock(timedelta(hours=hours - 1)):
                settle(call)
    unknown(task, "email.send", ago=timedelta(minutes=25))
    for _ in range(3):
        attempt(add_call(task, "order.lookup"), {"connection_opened": True, "sent": True, "http_status": 503})
    refund = Tool.objects.get(name="refund.create")
    for _ in range(2):
        breaker_record(refund, counts_as_failure=True, probe=False, now=timezone.now() - timedelta(minutes=4))
    metrics_fold()
    run = stored_run(
        [
            drill_result("timeout after send"),
            drill_result(
                "status API down",
                passed=False,
                keys=3,
                failing=1,
                observed=HOSTILE_IMG,
                error=f"the provider said {HOSTILE_SCRIPT}",
            ),
        ],
        log=f"== status API down ==\n  provider answered {HOSTILE_IMG}\n  {HOSTILE_SCRIPT}\n  FAIL in 12.5 s",
    )
    return {"run": run}


def test_a_viewer_reads_the_overview_the_breakers_and_a_drill_run(open_console, story):
    console = open_console()
    page = console.page
    console.sign_in("viewer", start="/overview/")
    assert page.url.endswith("/overview/")
    assert page.get_by_role("heading", level=1).inner_text() == "Overview"
    assert page.locator('[data-queue="unknown"].tile-count').inner_text() == "4"
    # The chart: one bar per hour and series, coloured by overview.css (no style attribute, no script).
    bars = page.locator("svg.flow-chart rect.bar.entered")
    assert bars.count() == 24
    tallest = max(bars.evaluate_all("rs => rs.map(r => r.getBBox().height)"))
    assert tallest > 50
    assert bars.first.evaluate("r => getComputedStyle(r).fill") == "rgb(180, 35, 24)"
    assert page.get_by_role("img", name="Calls entering and leaving UNKNOWN per hour, last 24 hours").is_visible()
    page.locator("summary", has_text="The numbers per hour").click()  # the chart's numbers, for screen readers
    assert page.locator("#flow-table tbody tr").count() == 24
    assert "refund.create" in page.locator("#breakers-table").inner_text()
    console.assert_clean()
    console.shot("overview")

    # A headline figure opens its section of the metrics page: 7 refunds went UNKNOWN and the email too, of 8 writes.
    page.locator('[data-figure="unknown_outcome_rate"] a').click()
    page.wait_for_url("**/overview/metrics/#unknown_outcome_rate")
    rate = page.locator('section[data-figure="unknown_outcome_rate"]')
    assert rate.locator(".figure-value").inner_text() == "100 %"
    assert rate.locator(".figure-detail").inner_text() == "8 of 8"
    assert (
        rate.locator("svg.metric-chart rect.bar").first.evaluate("r => getComputedStyle(r).fill") == "rgb(10, 88, 202)"
    )
    assert page.locator("section.figure svg.metric-chart").count() == 20
    assert page.get_by_role("link", name="Metrics").get_attribute("aria-current") == "page"
    page.locator("#id_window").select_option("7d")
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url("**/overview/metrics/?window=7d*")
    assert page.locator('section[data-figure="attempts"] tbody tr').count() == 28
    console.assert_clean()
    console.shot("metrics")

    page.goto(page.url.split("/overview/", 1)[0] + "/overview/")
    page.get_by_role("link", name="breakers and retry paths").click()
    page.wait_for_url("**/operations/breakers/")
    refund = page.locator("#breakers tr", has_text="refund.create")
    assert "open" in refund.locator(".breaker").inner_text()
    assert page.locator("#retry-paths-table").is_visible()
    console.assert_clean()
    console.shot("breakers")

    page.get_by_role("link", name="fault drills").click()
    page.wait_for_url("**/operations/drills/")
    page.get_by_role("link", name=f"Run {story['run'].pk}").click()
    page.wait_for_url(f"**/operations/drills/{story['run'].pk}/")
    assert HOSTILE_SCRIPT in page.locator("#run-log").inner_text()  # shown as text...
    assert HOSTILE_IMG in page.locator("#result-table").inner_text()
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0  # ...never markup
    console.assert_clean()
    console.shot("drill-run")
    for name in SHOTS:
        assert (ARTIFACTS / name).stat().st_size > 10_000, name

"""The task page in a real browser (docs/design/tasks.md, docs/console.md "Task"): a viewer signs in, opens a task whose
payment is unknown and whose shipping waits on it, and reads the blocked step, the facts, the budget bars and the audit
trail with its chain verified — with agent-written text shown as text, and no CSP violation.

Playwright drives Debian's Chromium against `live_server` with tests/browser.py's fixtures (CSP and script-error
recording); the screenshot is var/test-artifacts/browser/task-page.png.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.audit.chain import chain_key
from recovery.models import AuditEvent, Step
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT
from tests.test_console_task_page import OUTCOMES, add, make_runtime, open_task, refused, settle

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runtime(db):
    return make_runtime()


def test_a_viewer_reads_a_task_with_a_blocked_step_its_budget_and_its_verified_trail(
    open_console, console_people, runtime
):
    deadline = timezone.now() + timedelta(hours=3)
    task = open_task(
        runtime,
        external_id=HOSTILE_SCRIPT,
        agent=HOSTILE_IMG,
        goal=f"refund order 8848, then ship the replacement {HOSTILE_SCRIPT}",
        budget={"max_rounds": 10, "token_budget": 5000, "write_retry": 2, "deadline": deadline.isoformat()},
    )
    payment = add(runtime, task.id, 1)
    assert settle(runtime, payment.call_id, OUTCOMES["UNKNOWN"], tokens=1200) == "UNKNOWN"
    shipping = add(runtime, task.id, 2, tool="shipment.create", depends_on=[1])
    assert refused(runtime, shipping.call_id) == "blocked_by_dependency"
    Step.objects.filter(task_id=task.id, index=1).update(name="payment")
    Step.objects.filter(task_id=task.id, index=2).update(name=f"shipping {HOSTILE_IMG}")
    events = AuditEvent.objects.filter(chain=chain_key(task.id)).count()

    console = open_console()
    console.sign_in("viewer", start=f"/tasks/{task.id}/")
    page = console.page
    assert page.url.endswith(f"/tasks/{task.id}/")
    main = page.locator("main")

    # The task's own words, as text: its external id in the heading, the agent and the step's name.
    assert page.get_by_role("heading", level=1).inner_text() == f"Task {HOSTILE_SCRIPT}"
    assert main.get_by_text(HOSTILE_IMG, exact=True).first.is_visible()
    assert page.locator("#step-2 .step-name").first.inner_text() == f"shipping {HOSTILE_IMG}"
    assert page.locator("main img, main script, main svg").count() == 0

    # The blocked step, and by which dependency in which state.
    blocked = page.locator("#step-2.blocked .blocked-by")
    assert blocked.inner_text() == "Blocked by step 1 payment (UNKNOWN)"
    assert page.locator("#step-1.blocked").count() == 0
    assert "Step 2 stays blocked until then." in page.locator("#next").inner_text()
    assert f"call {payment.call_id}" in page.locator("#fact-unknown").inner_text()

    # Budget bars: meters with the numbers beside them in words.
    assert page.locator("#budget meter").count() == 4  # rounds, tokens, write retries, time to deadline
    assert page.locator("#meter-tokens").get_attribute("value") == "1200"
    assert page.get_by_label("Tokens", exact=True).evaluate("m => m.max") == 5000
    assert "1200 of 5000 tokens used" in page.locator("#bar-tokens").inner_text()
    assert " left (deadline " in page.locator("#bar-deadline").inner_text()

    # The whole trail, with its chain verified.
    assert page.locator("#chain-status").inner_text() == f"Chain verified: {events} events, intact."
    assert page.locator("#audit tbody tr").count() == events
    created = page.locator("#audit tbody tr").first
    created.locator("summary").click()  # the evidence is a one-line summary that opens on the whole JSON
    assert '"external_id": "<script>window.__pwned=1</script>"' in created.locator("pre").inner_text()
    assert page.get_by_role("link", name=f"call {payment.call_id}").first.get_attribute("href") == (
        f"/calls/{payment.call_id}/"
    )

    console.shot("task-page")
    console.assert_clean()  # no CSP violation, no script error, nothing hostile ran

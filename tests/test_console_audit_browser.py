"""The audit page in a real browser (docs/design/audit.md): an admin signs in, filters the trail by action, opens an
event's evidence, verifies the chain and reads "intact" — with no CSP violation, and the agent's hostile text shown as
text.

Playwright drives Debian's Chromium against `live_server` with tests/browser.py's fixtures (CSP and script-error
recording); the screenshot is var/test-artifacts/browser/audit.png.
"""

from __future__ import annotations

import re

import pytest

from recovery.audit.chain import Actor
from recovery.models import ApiToken, AuditEvent
from recovery.services.claims import call_claim
from recovery.services.tasks import task_create
from recovery.statemachine.transitions import transition_call
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_admin_filters_the_trail_and_verifies_the_chain(open_console, console_people, registry, make_call):
    admin = console_people["admin"]
    console = open_console()
    token = ApiToken.objects.create(name="runtime-1", prefix="rc_abc", digest="0" * 64)
    agent = Actor.for_token(token)
    task, _ = task_create(
        tenant=registry["tenant"], external_id="order-7", agent="demo", goal="refund order 7", budget={}, actor=agent
    )
    call = make_call("READY", on_task=task)
    transition_call(call, "SENT", actor=agent, reason=HOSTILE_SCRIPT, evidence={"html": HOSTILE_IMG, "amount": 800})
    transition_call(call, "UNKNOWN", actor=Actor.job("sweeper"), reason="no outcome within 30 s")
    call_claim(call_id=call.pk, user=admin, actor=Actor.for_user(admin))
    moves = list(AuditEvent.objects.filter(action="call.transition").order_by("-seq").values_list("seq", flat=True))
    assert len(moves) == 2 and AuditEvent.objects.count() > len(moves)

    console.sign_in("admin", start="/audit/")
    page = console.page
    assert page.url.endswith("/audit/")
    assert page.get_by_role("heading", level=1).inner_text() == "Audit trail"

    # Filter by action: the URL carries it, the form keeps it, the rows are exactly the database's.
    page.get_by_label("Action").fill("call.transition")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"[?&]action=call\.transition(&|$)"))
    rows = page.locator("#audit-rows tr[data-seq]")
    assert [int(s) for s in rows.evaluate_all("rs => rs.map(r => r.dataset.seq)")] == moves
    assert set(page.locator("#audit-rows code.action").all_inner_texts()) == {"call.transition"}
    assert page.get_by_label("Action").input_value() == "call.transition"
    export = page.get_by_role("link", name="CSV")
    assert export.get_attribute("href") == "/audit/export/?action=call.transition&format=csv"

    # The agent's text is shown as text, in the reason and in the evidence opened from its summary.
    sent = page.locator(f"#event-{moves[1]}")
    assert sent.get_by_text(HOSTILE_SCRIPT, exact=True).is_visible()
    sent.locator("summary").click()
    assert HOSTILE_IMG in sent.locator("details pre").inner_text()
    assert page.locator("main img, main script, main svg").count() == 0

    # Verify: the check runs, the page says the trail is intact, and the check is recorded as the admin's.
    searched = page.url
    with page.expect_navigation():
        page.get_by_role("button", name="Verify chain").click()
    assert page.url == searched  # back to the same search
    shown = page.get_by_role("status").inner_text()
    assert "The audit trail is intact" in shown, shown
    record = AuditEvent.objects.get(action="audit.verified")
    assert (record.actor_label, record.actor_user_id, record.evidence["ok"]) == ("user:admin", admin.pk, True)
    assert f"{record.evidence['events']} events" in shown

    page.locator(f"#event-{moves[1]} summary").click()
    console.shot("audit")
    console.assert_clean()

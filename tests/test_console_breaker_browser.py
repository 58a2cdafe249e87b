"""Breaker operations in a real browser (docs/breakers.md, docs/actions.md): a reviewer forces a tool's breaker open
from the breakers page after reading the dry run, a runtime's next attempt is refused by admission naming the operator,
the reviewer requests a reset, and an approver in a second browser approves it from Approvals: the breaker closes.

Screenshots: var/test-artifacts/browser/breaker-force-open.png, breaker-reset-approved.png.
"""

from __future__ import annotations

import json

import pytest
from recovery_client import NotAdmitted, RecoveryClient

from recovery.audit.chain import Actor
from recovery.models import Breaker, Tool
from recovery.registry import load_registry
from recovery.services.tokens import token_create
from tests.test_console_actions_browser import API_KEY, REFUND, REGISTRY

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runtime(sandbox, live_server, monkeypatch) -> RecoveryClient:
    monkeypatch.setenv("SANDBOX_API_KEY", API_KEY)
    registry = json.loads(REGISTRY.read_text())
    registry["providers"][0]["base_url"] = sandbox.url
    load_registry(registry, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["demo"], actor=Actor.system("tests"))
    return RecoveryClient(live_server.url, token)


def test_a_reviewer_forces_a_breaker_open_and_an_approver_resets_it(runtime, open_console, console_people):
    tool = Tool.objects.get(name="refund.create")
    alice = open_console()
    alice.sign_in("reviewer", start="/operations/breakers/")
    page = alice.page
    # No call in its window: the tool is on the idle line, its force open one disclosure below it.
    assert "refund.create" in page.locator("#idle-tools p").inner_text()
    page.locator("#idle-tools summary").click()
    with page.expect_navigation():
        page.locator(f"#operator-{tool.pk}").get_by_role("link", name="Force open…").click()
    assert "nothing has changed yet" in page.locator("#dry-run").inner_text()
    assert not Breaker.objects.filter(tool=tool).exists()  # the dry run changed nothing
    page.get_by_label("Reason").fill("INC-7: the provider double-charges, stop all refunds")
    page.get_by_label("I have read what this operation does").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Force open").click()
    assert "forced open by reviewer" in page.locator(f"#operator-{tool.pk}").inner_text()
    assert Breaker.objects.get(tool=tool).state == "forced_open"
    alice.shot("breaker-force-open")
    alice.assert_clean()

    task = runtime.create_task("demo", "ticket-7", agent="support-bot", goal="Refund order O-7")
    call_id = runtime.add_call(task.id, step=1, tool="refund.create", arguments=REFUND, idempotency_key="r-7").call_id
    with pytest.raises(NotAdmitted) as refused:
        runtime.admit(call_id, "attempt-1")
    assert "forced_open by an operator: reviewer" in json.dumps(refused.value.gate)

    with page.expect_navigation():
        page.locator(f"#operator-{tool.pk}").get_by_role("link", name="Request reset…").click()
    page.get_by_label("Reason").fill("INC-7 fixed: the provider confirmed")
    page.get_by_label("I have read what this operation does").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Request reset").click()
    assert "reset requested" in page.locator(f"#operator-{tool.pk}").inner_text()

    bob = open_console()
    bob.sign_in("approver", start="/approvals/")
    with bob.page.expect_navigation():
        bob.page.locator("#resets a.open").first.click()
    bob.page.locator("#approve-form textarea").fill("Checked their status page")
    bob.page.once("dialog", lambda dialog: dialog.accept())  # approving asks for a confirmation, however sent
    with bob.page.expect_navigation():
        bob.page.get_by_role("button", name="Approve reset").click()
    assert Breaker.objects.get(tool=tool).state == "closed"
    assert "reset by approver" in bob.page.locator(f"#operator-{tool.pk}").inner_text()
    bob.shot("breaker-reset-approved")
    bob.assert_clean()

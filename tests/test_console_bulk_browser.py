"""A bulk action in a real browser (docs/console.md): a reviewer filters the Unknown outcome queue, ticks rows (the
ticks survive the live refresh), previews a bulk escalation and requests it; an approver approves it in a second
browser, and the items' results appear on the bulk's page while the worker executes them.

Three refunds are made by a runtime through the API on `live_server` against the real sandbox process: the
sandbox commits each and drops the reply (UNKNOWN), and its status API stays down, so they stay in the queue.

Screenshots: var/test-artifacts/browser/bulk-preview.png, bulk-finished.png.
"""

from __future__ import annotations

import json

import pytest
import requests
from playwright.sync_api import expect
from recovery_client import RecoveryClient, facts_from_exception, facts_from_response

from recovery.audit.chain import Actor
from recovery.models import BulkAction, BulkItem, Call
from recovery.registry import load_registry
from recovery.services.tokens import token_create
from tests.test_console_actions_browser import API_KEY, REFUND, REGISTRY

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unknown_refunds(sandbox, live_server, monkeypatch) -> list[int]:
    monkeypatch.setenv("SANDBOX_API_KEY", API_KEY)
    registry = json.loads(REGISTRY.read_text())
    registry["providers"][0]["base_url"] = sandbox.url
    registry["providers"][0]["read_timeout_s"] = 2
    load_registry(registry, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["demo"], actor=Actor.system("tests"))
    client = RecoveryClient(live_server.url, token)
    sandbox.fault(route="/refunds/by-key", kind="status_down", status=503)
    ids = []
    for n in range(3):
        task = client.create_task("demo", f"ticket-{n}", agent="support-bot", goal=f"Refund order {n}")
        key = f"refund-bulk-{n}"
        call_id = client.add_call(task.id, step=1, tool="refund.create", arguments=REFUND, idempotency_key=key).call_id
        sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
        attempt = client.admit(call_id, f"attempt-{n}")
        headers = {"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": key}
        try:
            facts = facts_from_response(
                requests.post(f"{sandbox.url}/refunds", json=REFUND, headers=headers, timeout=3)
            )
        except requests.RequestException as exc:
            facts = facts_from_exception(exc)
        assert client.report(call_id, attempt.attempt_id, facts).call_state == "UNKNOWN"
        ids.append(call_id)
    return ids


def test_a_reviewer_bulk_escalates_ticked_rows_an_approver_approves_and_results_appear_live(
    unknown_refunds, runner, open_console, console_people
):
    first, second, third = unknown_refunds
    alice = open_console()
    alice.sign_in("reviewer", start="/queues/unknown/")
    page = alice.page
    page.locator("#id_tool").select_option(label="refund.create")
    with page.expect_navigation():
        page.get_by_role("button", name="Apply").click()
    assert "tool=" in page.url
    page.get_by_label(f"Select call {first}").check()
    page.get_by_label(f"Select call {third}").check()
    # The list redraws itself every few seconds: the ticks stay.
    page.evaluate("() => new Promise(done => document.addEventListener('htmx:afterSettle', done, {once: true}))")
    expect(page.get_by_label(f"Select call {first}")).to_be_checked()
    expect(page.get_by_label(f"Select call {third}")).to_be_checked()
    expect(page.get_by_label(f"Select call {second}")).not_to_be_checked()
    page.locator("#bulk-action").select_option(label="Escalate to human review")
    with page.expect_navigation():
        page.get_by_role("button", name="Preview for the selected rows").click()

    bulk = BulkAction.objects.get()
    assert page.url.endswith(f"/bulk/{bulk.pk}/")
    assert set(BulkItem.objects.filter(bulk=bulk).values_list("call_id", flat=True)) == {first, third}
    assert page.locator("#items tbody tr").count() == 2
    assert "2 would run" in page.locator("#counts").inner_text()
    assert Call.objects.filter(pk__in=unknown_refunds, state__in=["UNKNOWN", "STILL_UNKNOWN"]).count() == 3
    alice.shot("bulk-preview")
    alice.assert_clean()
    page.get_by_label("Reason").fill("The status API is down: people settle these two.")
    with page.expect_navigation():
        page.get_by_role("button", name="Request bulk").click()
    assert page.locator("#bulk-progress [data-status]").first.get_attribute("data-status") == "requested"

    bob = open_console()
    bob.sign_in("approver", start="/approvals/")
    with bob.page.expect_navigation():
        bob.page.locator(f"#bulk-{bulk.pk} a.open").click()
    bob.page.locator("#id_approve-reason").fill("Both checked on the queue.")
    bob.page.once("dialog", lambda dialog: dialog.accept())  # approving asks for a confirmation, however sent
    with bob.page.expect_navigation():
        bob.page.get_by_role("button", name=f"Approve bulk #{bulk.pk}").click()

    # The worker executes the items; the page follows it to the end.
    bob.page.locator('#bulk-progress [data-status="finished"]').wait_for(timeout=15_000)
    assert "2 executed" in bob.page.locator("#counts").inner_text()
    for position in (1, 2):
        row = bob.page.locator(f"#item-{position}")
        assert row.get_attribute("data-status") == "executed" and "HUMAN_REVIEW" in row.inner_text()
    bob.shot("bulk-finished")
    bob.assert_clean()
    states = dict(Call.objects.filter(pk__in=unknown_refunds).values_list("pk", "state"))
    assert states[first] == states[third] == "HUMAN_REVIEW" and states[second] != "HUMAN_REVIEW"
    alice.assert_clean()

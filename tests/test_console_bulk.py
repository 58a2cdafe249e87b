"""Bulk actions in the console (docs/console.md): the queue's bulk bar, the frozen selection's page and its forms, the
approvers' list. The calls are UNKNOWN refunds made by the real services (tests.test_console_call_page); every
preview, request and decision goes through the console's views and the real bulk services."""

from __future__ import annotations

import pytest

from recovery.audit.chain import Actor
from recovery.models import BulkAction, BulkItem
from recovery.models.roles import APPROVER, REVIEWER
from recovery.services.users import user_save_with_roles
from tests.console import HOSTILE_SCRIPT, PASSWORD, page_text, signed_in
from tests.test_console_actions import payments as payments  # the refund registry, a fixture found by its name
from tests.test_console_call_page import unknown_refund

pytestmark = pytest.mark.django_db


def _text(response) -> str:
    return page_text(response.content.decode())


def _rows(client, ids, *, action="escalate", selection="rows", **filters):
    data = {"action": action, "selection": selection, "call": [str(pk) for pk in ids], **filters}
    return client.post("/queues/unknown/bulk/", data)


def test_a_reviewer_ticks_rows_and_gets_the_frozen_selection_to_read(people, payments):
    calls = [unknown_refund() for _ in range(2)]
    reviewer = signed_in(people, "reviewer")

    queue = reviewer.get("/queues/unknown/")
    body = queue.content.decode()
    assert 'id="bulk"' in body and all(f'name="call" value="{c.pk}" form="bulk"' in body for c in calls)

    answer = _rows(reviewer, [c.pk for c in calls])
    bulk = BulkAction.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/bulk/{bulk.pk}/"
    page = reviewer.get(answer["Location"])
    text = _text(page)
    assert page.status_code == 200 and "Selection frozen: nothing was done" in text
    assert "2 would run" in text and 'id="request-form"' in page.content.decode()
    assert all(f'data-call="{c.pk}"' in page.content.decode() for c in calls)

    missing = reviewer.post(f"/bulk/{bulk.pk}/request/", {"reason": " ", "selection_hash": bulk.selection_hash})
    assert missing.status_code == 400 and "This field is required" in _text(missing)
    done = reviewer.post(
        f"/bulk/{bulk.pk}/request/", {"reason": "status API down", "selection_hash": bulk.selection_hash}
    )
    assert done.status_code == 302
    assert BulkAction.objects.get().status == "requested"
    mine = _text(reviewer.get(f"/bulk/{bulk.pk}/"))
    assert "another person with the approver role decides it" in mine


def test_the_viewer_sees_no_bulk_bar_and_cannot_post_one(people, payments):
    call = unknown_refund()
    viewer = signed_in(people, "viewer")
    assert 'id="bulk"' not in viewer.get("/queues/unknown/").content.decode()
    assert _rows(viewer, [call.pk]).status_code == 403
    assert BulkAction.objects.count() == 0


def test_a_selection_that_cannot_be_frozen_is_refused_on_the_queue_and_stores_nothing(people, payments):
    unknown_refund()
    reviewer = signed_in(people, "reviewer")
    nothing = _rows(reviewer, [], risk="high")
    assert nothing.status_code == 302 and nothing["Location"] == "/queues/unknown/?risk=high"
    assert "Select at least one row" in _text(reviewer.get(nothing["Location"]))
    junk = _rows(reviewer, ["x1"])
    assert "not a call id" in _text(reviewer.get(junk["Location"]))
    wrong = _rows(reviewer, [1], action="mark_committed")
    assert "No bulk was made" in _text(reviewer.get(wrong["Location"]))
    none_match = _rows(reviewer, [], selection="matching", q="no-such-key")
    assert "No call matches this filter" in _text(reviewer.get(none_match["Location"]))
    assert BulkAction.objects.count() == 0


def test_every_row_matching_the_filter_is_frozen_and_an_approver_decides_it(people, payments):
    kept = [unknown_refund() for _ in range(2)]
    reviewer, approver = signed_in(people, "reviewer"), signed_in(people, "approver")

    answer = _rows(reviewer, [], selection="matching", risk=kept[0].risk)
    bulk = BulkAction.objects.get()
    assert bulk.selection == "matching" and bulk.filters == {"risk": kept[0].risk}
    assert set(BulkItem.objects.values_list("call_id", flat=True)) == {c.pk for c in kept}
    reason = f"down {HOSTILE_SCRIPT}"
    reviewer.post(f"/bulk/{bulk.pk}/request/", {"reason": reason, "selection_hash": bulk.selection_hash})

    approvals = approver.get("/approvals/")
    assert f'href="/bulk/{bulk.pk}/"' in approvals.content.decode()
    page = approver.get(answer["Location"]).content.decode()
    assert 'id="approve-form"' in page and HOSTILE_SCRIPT not in page and "&lt;script&gt;" in page
    refused = approver.post(f"/bulk/{bulk.pk}/approve/", {"approve-reason": ""})
    assert refused.status_code == 400 and BulkAction.objects.get().status == "requested"
    approved = approver.post(f"/bulk/{bulk.pk}/approve/", {"approve-reason": "read every item"})
    assert approved.status_code == 302
    bulk.refresh_from_db()
    assert bulk.status in ("approved", "executing", "finished") and bulk.decided_by == people["approver"]
    again = approver.post(f"/bulk/{bulk.pk}/approve/", {"approve-reason": "twice"})
    assert again.status_code == 409 and "nothing more can be done" in _text(again)


def test_the_requester_cannot_approve_and_the_progress_block_refreshes_while_it_runs(people, payments):
    call = unknown_refund()
    people["both"], _ = user_save_with_roles(
        username="both", roles=[REVIEWER, APPROVER], password=PASSWORD, actor=Actor.system("tests")
    )
    both = signed_in(people, "both")
    _rows(both, [call.pk])
    bulk = BulkAction.objects.get()
    both.post(f"/bulk/{bulk.pk}/request/", {"reason": "mine", "selection_hash": bulk.selection_hash})
    page = both.get(f"/bulk/{bulk.pk}/").content.decode()
    assert 'id="approve-form"' not in page
    own = both.post(f"/bulk/{bulk.pk}/approve/", {"approve-reason": "self"})
    assert own.status_code == 409 and "needs a second person" in _text(own)

    BulkAction.objects.filter(pk=bulk.pk).update(status="executing", decided_by=people["approver"])
    live = both.get(f"/bulk/{bulk.pk}/", HTTP_HX_REQUEST="true")
    body = live.content.decode()
    assert live.status_code == 200 and body.lstrip().startswith('<section id="bulk-progress"') and "hx-trigger" in body
    BulkAction.objects.filter(pk=bulk.pk).update(status="finished")
    over = both.get(f"/bulk/{bulk.pk}/", HTTP_HX_REQUEST="true")
    assert over.headers.get("HX-Refresh") == "true"

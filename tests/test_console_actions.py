"""Operator actions in the console (docs/actions.md): the call page's preview forms, one action request's page and its
forms, the approvers' queue, the navigation's and the overview's pending-approvals figure.

The calls are built through the real services (tests.test_console_call_page.unknown_refund: a task, a call, an
attempt admitted and reported as a read timeout after sending, a `pending` status check) and moved to HUMAN_REVIEW by
the one transition function; every preview, request, approval and rejection goes through the console's views and
the real action services (recovery/services/actions.py). Only the statement-count tests insert plain rows, in bulk.
Executing an approved action runs in tests/test_console_actions_browser.py, against the real sandbox.
"""

from __future__ import annotations

import copy
import re
from datetime import timedelta
from html import unescape

import pytest
from django.db import transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.models import ActionRequest, ActionStatus, AuditEvent, Call
from recovery.models.roles import ADMIN, APPROVER, REVIEWER, VIEWER
from recovery.registry import load_registry
from recovery.services.users import user_save_with_roles
from recovery.statemachine.transitions import transition_call
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT, PASSWORD, page_text, signed_in, statements
from tests.test_console_call_page import REGISTRY, unknown_refund

RUNTIME = Actor.system("tests-runtime")
SECRET = "sk_live_ui_tests_7f3a9c"  # the provider's outbound credential: it must never reach a page
SECRET_ENV = "UI_TESTS_PAYMENTS_KEY"
CHECKS = ("admission", "breaker", "call_budget", "task_budget", "side_effect_budget", "key_retention")
WRITES_FROM_HUMAN_REVIEW = ["replay_same_key", "mark_committed", "mark_not_committed", "grant_approval", "abandon"]


def load_payments(monkeypatch, base_url: str = "http://127.0.0.1:9") -> None:
    """The call page tests' refund registry, its provider sending a bearer credential read from the environment."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    registry = copy.deepcopy(REGISTRY)
    registry["providers"][0].update(base_url=base_url, auth={"kind": "bearer", "secret_env": SECRET_ENV})
    load_registry(registry, actor=Actor.system("tests"))


def in_human_review(**kwargs) -> Call:
    """An UNKNOWN refund (real services) escalated to HUMAN_REVIEW by the transition function."""
    call = unknown_refund(**kwargs)
    return transition_call(
        call, "HUMAN_REVIEW", actor=RUNTIME, reason="escalated: nobody could confirm it",
        changes={"outcome": "human_review_required", "next_check_at": None},
    )  # fmt: skip


@pytest.fixture
def payments(db, monkeypatch):
    load_payments(monkeypatch)


@pytest.fixture
def both(people):
    """A person with the reviewer and the approver roles: they may request and approve, never their own request."""
    user, _ = user_save_with_roles(username="both", roles=[REVIEWER, APPROVER], password=PASSWORD, actor=RUNTIME)
    people["both"] = user
    return user


def _html(response) -> str:
    return response.content.decode()


def _main(html: str) -> str:
    return html[html.index('<main id="main"') :]


def _section(html: str, heading_id: str) -> str:
    start = html.index(f'id="{heading_id}"')
    start = html.rindex("<section", 0, start)
    return html[start : html.index("</section>", start)]


def _preview(client, call: Call, action: str = "replay_same_key", data: dict | None = None):
    return client.post(f"/calls/{call.pk}/actions/{action}/preview/", data or {})


def previewed(people, call: Call, action: str = "replay_same_key", who: str = REVIEWER, data=None) -> ActionRequest:
    response = _preview(signed_in(people, who), call, action, data)
    assert response.status_code == 302, page_text(_html(response))[:2000]
    request_id = int(re.fullmatch(r"/actions/(\d+)/", response["Location"]).group(1))
    return ActionRequest.objects.get(pk=request_id)


def requested(
    people, call: Call, action: str = "replay_same_key", who: str = REVIEWER, reason: str = "replay it", data=None
) -> ActionRequest:
    made = previewed(people, call, action, who, data)
    response = signed_in(people, who).post(
        f"/actions/{made.pk}/request/", {"reason": reason, "plan_hash": made.plan_hash}
    )
    assert response.status_code == 302, page_text(_html(response))[:2000]
    made.refresh_from_db()
    assert made.status == ActionStatus.REQUESTED
    return made


def _field_error(html: str, field_id: str) -> str:
    found = re.search(rf'<p class="error" id="{re.escape(field_id)}-error"[^>]*>(.*?)</p>', html, re.S)
    return unescape(found.group(1)).strip() if found else ""


# ---------------------------------------------------------------------------------------------------------------
# The call page: live preview forms
# ---------------------------------------------------------------------------------------------------------------


def test_the_call_page_offers_each_allowed_action_as_a_preview_form(people, payments):
    call = in_human_review()
    html = _html(signed_in(people, REVIEWER).get(f"/calls/{call.pk}/"))
    actions = _section(html, "actions-h")
    allowed = re.findall(r'data-action="(\w+)" data-allowed="yes"', actions)
    assert allowed == WRITES_FROM_HUMAN_REVIEW
    targets = re.findall(r'<form method="post" action="([^"]+)" class="preview-form">', actions)
    assert targets == [f"/calls/{call.pk}/actions/{name}/preview/" for name in allowed]  # previews, never executions
    assert actions.count('name="csrfmiddlewaretoken"') == len(allowed)
    assert "Preview: Replay with the same idempotency key</button>" in actions
    # The two actions that settle a call by hand ask for their evidence in their own form (ids kept apart).
    for name in ("mark_committed", "mark_not_committed"):
        li = actions.split(f'id="action-{name}"', 1)[1].split("</li>", 1)[0]
        for field in ("provider_ref", "receipt_id", "link"):
            assert f'name="{field}" id="{name}-{field}"' in li, (name, field)
    text = page_text(actions)
    assert "Reconcile now : only UNKNOWN, STILL_UNKNOWN and ACCEPTED calls are reconciled" in text
    assert "Escalate to human review : the call is already in human review" in text
    assert "Action requests (0)" in text and "disabled" not in actions

    for who in (VIEWER, APPROVER, ADMIN):  # read the same reasons, offered nothing
        other = _section(_html(signed_in(people, who).get(f"/calls/{call.pk}/")), "actions-h")
        assert "<form" not in other and 'data-allowed="yes"' not in other, who
        # One sentence, said once, with every action it forbids (not the same sentence under each of them).
        assert page_text(other).count("needs the reviewer role (recovery.review_call)") == 1, who
        [group] = [
            g for g in other.split('class="forbidden-group"')[1:] if "needs the reviewer role" in g.split("</li>")[0]
        ]
        assert set(re.findall(r'data-action="(\w+)" data-allowed="no"', group)) >= set(allowed), who


def test_the_call_page_lists_its_action_requests_and_tells_their_story_in_the_timeline(people, payments):
    call = in_human_review()
    made = requested(people, call, reason="the provider kept the key: replay")
    html = _html(signed_in(people, VIEWER).get(f"/calls/{call.pk}/"))
    row = page_text(html.split(f'id="request-{made.pk}"', 1)[1].split("</tr>", 1)[0])
    assert f"#{made.pk} Replay with the same idempotency key" in row and "requested" in row and "by reviewer" in row
    assert f'href="/actions/{made.pk}/"' in html
    timeline = page_text(_section(html, "timeline-h"))
    assert f"action action.previewed request #{made.pk}; replay_same_key; by user:reviewer" in timeline
    assert f"action action.requested request #{made.pk}; replay_same_key; by user:reviewer; the provider kept" in (
        timeline
    )


# ---------------------------------------------------------------------------------------------------------------
# The dry run and its page
# ---------------------------------------------------------------------------------------------------------------


def test_a_preview_sends_nothing_and_its_page_shows_the_whole_plan(people, monkeypatch, sandbox):
    load_payments(monkeypatch, base_url=sandbox.url)
    call = in_human_review()
    made = previewed(people, call)

    assert made.status == ActionStatus.PREVIEWED and made.previewed_by == people[REVIEWER]
    assert sandbox.requests(key=call.idempotency_key) == []  # a dry run: the provider saw nothing
    response = signed_in(people, REVIEWER).get(f"/actions/{made.pk}/")
    html = _html(response)
    assert SECRET not in html
    plan = page_text(_section(html, "plan-h"))
    assert f"POST {sandbox.url}/refunds" in plan
    assert f"Idempotency-Key {call.idempotency_key}" in plan
    assert "Authorization Bearer [REDACTED]" in plan
    assert '"order_id": "O-8848"' in plan and '"amount_cents": 1250' in plan
    assert f"Idempotency key {call.idempotency_key}" in plan and "HUMAN_REVIEW → SENT" in plan
    assert "the provider deduplicates by key" in plan
    checks = _section(html, "checks-h")
    assert re.findall(r'data-check="(\w+)"', checks) == list(CHECKS)
    assert "(all passed)" in page_text(checks) and "✓ admission passed : the gate would admit the replay" in (
        page_text(checks)
    )
    assert "Reconcile now : only UNKNOWN, STILL_UNKNOWN and ACCEPTED calls are reconciled" in page_text(checks)
    status = page_text(_section(html, "status-h"))
    assert "Status: previewed" in status and "by reviewer" in status and "Requested not yet" in status
    # The reviewer may request it (binding to the plan they read); nobody is offered a decision yet.
    decide = _section(html, "decide-h")
    assert f'name="plan_hash" value="{made.plan_hash}"' in decide and 'id="request-form"' in decide
    assert "approve-form" not in decide and "reject-form" not in decide
    history = page_text(_section(html, "history-h"))
    assert "action.previewed by user:reviewer; dry run of Replay with the same idempotency key: nothing was sent" in (
        history
    )


def test_every_role_reads_a_request_and_only_a_reviewer_gets_the_request_form(people, payments):
    made = previewed(people, in_human_review())
    for who in (VIEWER, APPROVER, ADMIN, "reviewer2"):
        html = _html(signed_in(people, who).get(f"/actions/{made.pk}/"))
        decide = _section(html, "decide-h")
        assert ("request-form" in decide) == (who == "reviewer2"), who
        assert "<form" not in decide or who == "reviewer2", who
        assert made.plan_hash in html, who
    assert signed_in(people, VIEWER).post(f"/actions/{made.pk}/request/", {"reason": "x"}).status_code == 403
    made.refresh_from_db()
    assert made.status == ActionStatus.PREVIEWED


def test_a_preview_of_a_forbidden_action_is_refused_and_records_nothing(people, payments):
    call = in_human_review()
    response = _preview(signed_in(people, REVIEWER), call, "escalate")
    assert response.status_code == 409
    assert "the call is already in human review" in page_text(_html(response)).lower()
    assert not ActionRequest.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="action.").exists()


def test_marking_committed_needs_evidence_shown_next_to_its_field(people, payments):
    call = in_human_review()
    client = signed_in(people, REVIEWER)

    missing = _preview(client, call, "mark_committed")
    assert missing.status_code == 400
    assert _field_error(_html(missing), "id_provider_ref").startswith("Settling a call by hand needs evidence")
    bad_link = _preview(client, call, "mark_committed", {"provider_ref": "re_1", "link": "ftp://files/receipt"})
    assert bad_link.status_code == 400
    assert _field_error(_html(bad_link), "id_link") == (
        "The link must be an http:// or https:// address of the receipt or document."
    )
    assert 'value="re_1"' in _html(bad_link)  # what was typed is kept
    too_long = _preview(client, call, "mark_committed", {"receipt_id": "r" * 256})
    assert too_long.status_code == 400 and "at most 255 characters" in _field_error(_html(too_long), "id_receipt_id")
    assert not ActionRequest.objects.exists()

    evidence = {"provider_ref": "re_8848", "link": "https://dashboard.example/refunds/re_8848"}
    made = previewed(people, call, "mark_committed", data=evidence)
    assert made.evidence == evidence and made.plan["evidence"] == evidence
    shown = page_text(_section(_html(client.get(f"/actions/{made.pk}/")), "plan-h"))
    assert "Provider reference re_8848" in shown and "Receipt or document link https://dashboard.example" in shown
    assert "None: this action sends no request to the provider." in shown


# ---------------------------------------------------------------------------------------------------------------
# Request, approve, reject
# ---------------------------------------------------------------------------------------------------------------


def test_a_request_needs_a_reason_and_the_plan_the_reviewer_read(people, payments):
    made = previewed(people, in_human_review())
    client = signed_in(people, REVIEWER)

    no_reason = client.post(f"/actions/{made.pk}/request/", {"reason": "  ", "plan_hash": made.plan_hash})
    assert no_reason.status_code == 400 and _field_error(_html(no_reason), "id_reason") == "This field is required."
    forged = client.post(f"/actions/{made.pk}/request/", {"reason": "go", "plan_hash": "not-a-hash"})
    assert forged.status_code == 400 and "The plan: Enter a valid value." in page_text(_html(forged))
    other = client.post(f"/actions/{made.pk}/request/", {"reason": "go", "plan_hash": "f" * 64})
    assert other.status_code == 409
    assert "The plan: This is not the plan that was previewed" in page_text(_html(other))
    made.refresh_from_db()
    assert (made.status, made.requested_by, made.reason) == (ActionStatus.PREVIEWED, None, "")

    done = client.post(f"/actions/{made.pk}/request/", {"reason": "key kept 3 h: replay", "plan_hash": made.plan_hash})
    assert done.status_code == 302 and done["Location"] == f"/actions/{made.pk}/"
    page = client.get(done["Location"])
    assert "Requested: it waits for a second person with the approver role." in page_text(_html(page))
    made.refresh_from_db()
    assert (made.status, made.requested_by, made.reason) == (
        ActionStatus.REQUESTED,
        people[REVIEWER],
        "key kept 3 h: replay",
    )
    again = client.post(f"/actions/{made.pk}/request/", {"reason": "twice", "plan_hash": made.plan_hash})
    assert again.status_code == 409 and "This request is requested now" in page_text(_html(again))


def test_an_approver_approves_with_a_reason_and_the_page_follows_the_execution(people, payments):
    call = in_human_review()
    made = requested(people, call)
    client = signed_in(people, APPROVER)
    decide = _section(_html(client.get(f"/actions/{made.pk}/")), "decide-h")
    assert 'id="approve-form"' in decide and 'id="reject-form"' in decide and "request-form" not in decide
    # One plain hint: the button and Enter send it alike, each after the same confirmation (static/console/console.js).
    assert "Enter or the Approve button sends it once you confirm (key a jumps here)" in page_text(decide)

    empty = client.post(f"/actions/{made.pk}/approve/", {"approve-reason": ""})
    assert empty.status_code == 400
    assert _field_error(_html(empty), "id_approve-reason") == "This field is required."
    made.refresh_from_db()
    assert made.status == ActionStatus.REQUESTED and made.decided_by is None

    done = client.post(f"/actions/{made.pk}/approve/", {"approve-reason": "ledger shows no refund yet"})
    assert done.status_code == 302 and done["Location"] == f"/actions/{made.pk}/"
    made.refresh_from_db()
    assert (made.status, made.decided_by, made.decision_reason) == (
        ActionStatus.APPROVED, people[APPROVER], "ledger shows no refund yet",
    )  # fmt: skip
    html = _html(client.get(done["Location"]))
    assert "Approved: a worker executes it once" in page_text(html)
    status = _section(html, "status-h")
    assert f'hx-get="/actions/{made.pk}/" hx-trigger="every 3s"' in status  # it follows the worker
    assert "<form" not in _section(html, "decide-h")
    partial = _html(client.get(f"/actions/{made.pk}/", headers={"HX-Request": "true"}))
    assert partial.lstrip().startswith('<section id="action-status"') and "<html" not in partial
    assert signed_in(people, REVIEWER).post(f"/actions/{made.pk}/approve/", {"approve-reason": "x"}).status_code == 403
    assert Call.objects.get(pk=call.pk).state == "HUMAN_REVIEW"  # nothing ran in this test: the job is not run here


def test_an_approver_rejects_with_a_reason_and_nothing_runs(people, payments):
    call = in_human_review()
    made = requested(people, call)
    client = signed_in(people, APPROVER)
    empty = client.post(f"/actions/{made.pk}/reject/", {"reject-reason": ""})
    assert empty.status_code == 400 and _field_error(_html(empty), "id_reject-reason") == "This field is required."

    done = client.post(f"/actions/{made.pk}/reject/", {"reject-reason": "the customer cancelled the refund"})
    assert done.status_code == 302
    made.refresh_from_db()
    assert (made.status, made.decided_by) == (ActionStatus.REJECTED, people[APPROVER])
    html = _html(signed_in(people, REVIEWER).get(f"/actions/{made.pk}/"))
    assert "Status: rejected" in page_text(_section(html, "status-h"))
    assert "the customer cancelled the refund" in page_text(_section(html, "status-h"))
    assert "Nothing: this request is rejected." in page_text(_section(html, "decide-h"))
    # A page drawn while it was pending does not poll; one that polled (a worker held it) is told to reload.
    assert f'hx-get="/actions/{made.pk}/"' not in html
    polled = signed_in(people, REVIEWER).get(f"/actions/{made.pk}/", headers={"HX-Request": "true"})
    assert polled.status_code == 200 and polled["HX-Refresh"] == "true"
    assert Call.objects.get(pk=call.pk).state == "HUMAN_REVIEW"
    assert signed_in(people, APPROVER).get("/approvals/").context["rows"] == []


def test_the_requester_withdraws_a_pending_request_from_its_page(people, payments):
    call = in_human_review()
    made = requested(people, call)
    mine = signed_in(people, REVIEWER)
    assert 'id="withdraw-form"' in _html(mine.get(f"/actions/{made.pk}/"))
    # A colleague sees no such form and is refused if they post it anyway; nothing changed.
    other = signed_in(people, "reviewer2")
    assert 'id="withdraw-form"' not in _html(other.get(f"/actions/{made.pk}/"))
    refused = other.post(f"/actions/{made.pk}/withdraw/", {"withdraw-reason": "not mine to take back"})
    assert refused.status_code == 403 and "Only the person who requested" in _html(refused)
    empty = mine.post(f"/actions/{made.pk}/withdraw/", {"withdraw-reason": ""})
    assert empty.status_code == 400 and _field_error(_html(empty), "id_withdraw-reason") == "This field is required."
    made.refresh_from_db()
    assert made.status == ActionStatus.REQUESTED

    done = mine.post(f"/actions/{made.pk}/withdraw/", {"withdraw-reason": "wrong order: I meant the other refund"})

    assert done.status_code == 302
    made.refresh_from_db()
    assert made.status == ActionStatus.WITHDRAWN
    status = page_text(_section(_html(mine.get(f"/actions/{made.pk}/")), "status-h"))
    assert "Status: withdrawn" in status and "withdrawn by its requester reviewer" in status
    assert "wrong order: I meant the other refund" in status
    assert signed_in(people, APPROVER).get("/approvals/").context["rows"] == []
    assert Call.objects.get(pk=call.pk).state == "HUMAN_REVIEW"


def test_the_requester_cannot_approve_their_own_request(people, payments, both):
    call = in_human_review()
    made = requested(people, call, who="both")
    client = signed_in(people, "both")

    html = _html(client.get(f"/actions/{made.pk}/"))
    decide = _section(html, "decide-h")
    assert "approve-form" not in decide and "reject-form" not in decide
    assert "You requested this action, so you cannot approve or reject it" in page_text(decide)
    queue = page_text(_html(client.get("/approvals/")))
    assert "both (you: another approver decides)" in queue

    refused = client.post(f"/actions/{made.pk}/approve/", {"approve-reason": "looks right to me"})
    assert refused.status_code == 409
    assert "You requested this action: a different person with the approver role decides it (four eyes)." in (
        page_text(_html(refused))
    )
    assert client.post(f"/actions/{made.pk}/reject/", {"reject-reason": "no"}).status_code == 409
    made.refresh_from_db()
    assert (made.status, made.decided_by) == (ActionStatus.REQUESTED, None)
    assert not AuditEvent.objects.filter(action__in=["action.approved", "action.rejected"]).exists()

    # Another approver decides it.
    assert signed_in(people, APPROVER).post(f"/actions/{made.pk}/approve/", {"approve-reason": "ok"}).status_code == 302


def test_a_request_is_shown_stale_after_the_call_moved_and_approving_it_is_refused(people, payments):
    call = in_human_review()
    made = requested(people, call)
    version = call.version
    transition_call(Call.objects.get(pk=call.pk), "COMMITTED", actor=RUNTIME, reason="the provider confirmed it")

    approver = signed_in(people, APPROVER)
    html = _html(approver.get(f"/actions/{made.pk}/"))
    stale = page_text(_section(html, "status-h"))
    assert (
        f"Stale: call {call.pk} moved since this preview (it was HUMAN_REVIEW at version {version}; it is now "
        f"COMMITTED at version {version + 1})"
    ) in stale
    decide = _section(html, "decide-h")
    assert "approve-form" not in decide and "reject-form" in decide
    assert "stale: the call is now COMMITTED" in page_text(_html(approver.get("/approvals/")))
    assert "stale: the call moved since its preview" in page_text(_html(approver.get(f"/calls/{call.pk}/")))

    refused = approver.post(f"/actions/{made.pk}/approve/", {"approve-reason": "go"})
    assert refused.status_code == 409
    assert "Not approved: the call changed since the preview" in page_text(_html(refused))
    made.refresh_from_db()
    assert (made.status, made.decided_by) == (ActionStatus.STALE, None)  # the refusal itself is recorded
    assert AuditEvent.objects.filter(action="action.stale", call=call).count() == 1
    assert Call.objects.get(pk=call.pk).state == "COMMITTED"
    # Nobody is offered to preview it again: a replay of a COMMITTED call is forbidden now.
    reviewer_page = _html(signed_in(people, REVIEWER).get(f"/actions/{made.pk}/"))
    assert "Stale: the call or the plan moved after the preview" in page_text(_section(reviewer_page, "status-h"))
    assert "<form" not in _section(reviewer_page, "decide-h")


def test_a_stale_preview_offers_a_new_preview_instead_of_a_request(people, payments):
    call = in_human_review()
    made = previewed(people, call, "mark_committed", data={"provider_ref": "re_9"})
    # The call moves and comes back: HUMAN_REVIEW again, at a later version (a version counts state changes).
    for state in ("RETRYABLE", "HUMAN_REVIEW"):
        transition_call(Call.objects.get(pk=call.pk), state, actor=RUNTIME, reason="moved meanwhile")
    client = signed_in(people, REVIEWER)
    decide = _section(_html(client.get(f"/actions/{made.pk}/")), "decide-h")
    assert "request-form" not in decide
    assert f'action="/calls/{call.pk}/actions/mark_committed/preview/"' in decide
    assert '<input type="hidden" name="provider_ref" value="re_9">' in decide  # the evidence comes along
    response = client.post(f"/actions/{made.pk}/request/", {"reason": "go", "plan_hash": made.plan_hash})
    assert response.status_code == 302
    assert "the request is stale. Preview it again" in page_text(_html(client.get(response["Location"])))
    made.refresh_from_db()
    assert made.status == ActionStatus.STALE


def test_a_read_only_reconcile_runs_on_the_requesters_confirmation_alone(people, payments, settings):
    settings.RECOVERY_READ_ACTIONS_ONE_CONFIRMATION = True
    call = unknown_refund()  # UNKNOWN: reconcile now is allowed
    made = previewed(people, call, "reconcile_now")
    plan = page_text(_section(_html(signed_in(people, REVIEWER).get(f"/actions/{made.pk}/")), "plan-h"))
    assert f"GET http://127.0.0.1:9/refunds/by-key/{call.idempotency_key}" in plan and "read-only" in plan
    client = signed_in(people, REVIEWER)
    response = client.post(f"/actions/{made.pk}/request/", {"reason": "check now", "plan_hash": made.plan_hash})
    assert response.status_code == 302
    assert "Requested and confirmed: it is now approved." in page_text(_html(client.get(response["Location"])))
    made.refresh_from_db()
    assert (made.status, made.decided_by) == (ActionStatus.APPROVED, None)
    html = _html(signed_in(people, APPROVER).get(f"/actions/{made.pk}/"))
    assert "<form" not in _section(html, "decide-h")  # nothing left to decide
    assert "read-only: one confirmation" in page_text(_section(html, "status-h"))
    assert signed_in(people, APPROVER).get("/approvals/").context["rows"] == []


def test_an_expired_request_cannot_be_decided(people, payments):
    made = requested(people, in_human_review())
    ActionRequest.objects.filter(pk=made.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    approver = signed_in(people, APPROVER)
    html = _html(approver.get(f"/actions/{made.pk}/"))
    assert "Expired at" in page_text(_section(html, "status-h"))
    assert "<form" not in _section(html, "decide-h")
    assert approver.get("/approvals/").context["rows"] == []  # no longer pending
    refused = approver.post(f"/actions/{made.pk}/approve/", {"approve-reason": "late"})
    assert refused.status_code == 409 and "This request expired" in page_text(_html(refused))
    made.refresh_from_db()
    assert (made.status, made.decided_by) == (ActionStatus.EXPIRED, None)


def test_every_action_post_needs_the_csrf_token(people, payments):
    call = in_human_review()
    client = signed_in(people, REVIEWER, enforce_csrf_checks=True)
    assert _preview(client, call).status_code == 403
    assert not ActionRequest.objects.exists()
    made = previewed(people, call)
    refused = client.post(f"/actions/{made.pk}/request/", {"reason": "x", "plan_hash": made.plan_hash})
    assert refused.status_code == 403
    made.refresh_from_db()
    assert made.status == ActionStatus.PREVIEWED


# ---------------------------------------------------------------------------------------------------------------
# The approvers' queue, the navigation and the overview
# ---------------------------------------------------------------------------------------------------------------


def test_the_approvals_queue_shows_each_plan_oldest_first(people, payments):
    first, second = in_human_review(), in_human_review()
    older = requested(people, first, reason="first in")
    newer = requested(people, second, "mark_committed", data={"provider_ref": "re_2"}, reason="settled by phone")
    previewed(people, in_human_review())  # previewed only: not waiting for an approver

    response = signed_in(people, APPROVER).get("/approvals/")
    html = _html(response)
    assert [int(i) for i in re.findall(r'<tr id="approval-(\d+)"', html)] == [older.pk, newer.pk]
    row = page_text(html.split(f'id="approval-{older.pk}"', 1)[1].split("</tr>", 1)[0])
    assert f"#{older.pk} Replay with the same idempotency key" in row
    assert f"key {first.idempotency_key}" in row and "POST http://127.0.0.1:9/refunds" in row
    assert "6 passed" in row and "reviewer" in row and "first in" in row and "in 59 min" in row
    row = page_text(html.split(f'id="approval-{newer.pk}"', 1)[1].split("</tr>", 1)[0])
    assert "Mark committed" in row and "HUMAN_REVIEW → COMMITTED" in row and "sends nothing" in row
    assert "Pending approvals (2)" in page_text(html)


def test_the_navigation_and_the_overview_count_pending_approvals_for_approvers(people, payments):
    requested(people, in_human_review())
    requested(people, in_human_review())
    for who in (APPROVER, REVIEWER, VIEWER):
        client = signed_in(people, who)
        html = _html(client.get("/overview/"))
        assert re.search(
            r'Pending approvals: (<a href="/approvals/">)?<span class="num" data-queue="approvals">2<', html
        )
        nav = html.split('<ul id="queue-nav"', 1)[1].split("</ul>", 1)[0]
        counts = _html(client.get("/queues/counts/", headers={"HX-Request": "true"}))
        if who == APPROVER:
            assert 'href="/approvals/"' in nav and '<span class="count" data-queue="approvals">2</span>' in nav
            assert '<span class="count" data-queue="approvals">2</span>' in counts  # the live refresh keeps it
        else:
            assert "/approvals/" not in nav and "approvals" not in counts, who


# ---------------------------------------------------------------------------------------------------------------
# Untrusted text
# ---------------------------------------------------------------------------------------------------------------


def test_hostile_text_in_plans_evidence_and_reasons_is_shown_as_text(people, payments):
    call = in_human_review(arguments={"order_id": "O-1", "amount_cents": 5, "note": HOSTILE_SCRIPT})
    replay = requested(people, call, reason=f"replay {HOSTILE_IMG}")
    evidence = {"provider_ref": HOSTILE_SCRIPT, "receipt_id": HOSTILE_IMG}
    settle = requested(people, call, "mark_committed", data=evidence, reason=HOSTILE_SCRIPT)
    signed_in(people, APPROVER).post(f"/actions/{replay.pk}/reject/", {"reject-reason": f"no {HOSTILE_SCRIPT}"})

    pages = {
        "replay": _html(signed_in(people, VIEWER).get(f"/actions/{replay.pk}/")),
        "settle": _html(signed_in(people, APPROVER).get(f"/actions/{settle.pk}/")),
        "queue": _html(signed_in(people, APPROVER).get("/approvals/")),
        "call": _html(signed_in(people, REVIEWER).get(f"/calls/{call.pk}/")),
    }
    for name, html in pages.items():
        main = _main(html)
        assert "<script>window.__pwned" not in main and "<img src=x" not in main, name
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in _section(pages["replay"], "plan-h")  # the body
    assert f"no {HOSTILE_SCRIPT}" in page_text(_section(pages["replay"], "status-h"))  # the decision's reason
    assert f"replay {HOSTILE_IMG}" in page_text(_section(pages["replay"], "status-h"))
    settle_plan = page_text(_section(pages["settle"], "plan-h"))
    assert f"Provider reference {HOSTILE_SCRIPT}" in settle_plan and f"Receipt id {HOSTILE_IMG}" in settle_plan
    assert HOSTILE_SCRIPT in page_text(pages["queue"])
    assert f"replay {HOSTILE_IMG}" in page_text(_section(pages["call"], "timeline-h"))


# ---------------------------------------------------------------------------------------------------------------
# Cost: a fixed number of statements
# ---------------------------------------------------------------------------------------------------------------


def _plain_requests(calls: list[Call], requester, *, n_checks: int = 6) -> list[ActionRequest]:
    now = timezone.now()
    plan = {
        "action": "replay_same_key", "label": "Replay with the same idempotency key", "state": "HUMAN_REVIEW",
        "target_state": "SENT", "idempotency_key": "k", "expected_effects": "one refund at most",
        "requests": [{"method": "POST", "url": "http://127.0.0.1:9/refunds", "headers": {"Authorization": "x"}}],
        "checks": [{"check": f"c{i}", "passed": i % 2 == 0, "detail": "d"} for i in range(n_checks)],
        "forbidden": [{"action": "escalate", "reason": "r"}],
    }  # fmt: skip
    return ActionRequest.objects.bulk_create(
        ActionRequest(
            call=call, action="replay_same_key", status=ActionStatus.REQUESTED, plan=plan, plan_hash="0" * 64,
            call_version=call.version, previewed_by=requester, requested_by=requester, requested_at=now,
            reason=f"reason {i}", expires_at=now + timedelta(hours=1),
        )
        for i, call in enumerate(calls)
    )  # fmt: skip


def test_the_approvals_queue_runs_the_same_statements_for_1_or_30_pending(people, payments):
    calls = [in_human_review() for _ in range(4)]
    client = signed_in(people, APPROVER)
    _plain_requests(calls[:1], people[REVIEWER])
    client.get("/approvals/")  # warm the session and permission caches
    one, response = statements(client, "/approvals/")
    assert len(response.context["rows"]) == 1
    _plain_requests(calls * 7 + calls[:1], people["reviewer2"])  # 29 more, on several calls, by another requester
    many, response = statements(client, "/approvals/")
    assert len(response.context["rows"]) == 30 and _html(response).count('<tr id="approval-') == 30
    assert one == many, (one, many)
    # the action requests, then the breaker resets, the bulks and the held MCP calls waiting: one statement each
    assert many <= 11, many


def test_a_request_page_runs_the_same_statements_however_long_its_story(people, payments):
    call = in_human_review()
    small = requested(people, call)
    large = requested(people, call, "mark_committed", data={"provider_ref": "re_1"})
    ActionRequest.objects.filter(pk=large.pk).update(
        status=ActionStatus.EXECUTED, decided_by=people[APPROVER], decided_at=timezone.now(),
        result={"what": "done", "call_state": "COMMITTED"}, executed_at=timezone.now(), execution_owner="w",
    )  # fmt: skip
    with transaction.atomic():
        for i in range(40):
            append_event(
                action=AuditAction.ACTION_EXECUTING, actor=RUNTIME, task_id=call.task_id, call_id=call.pk,
                reason=f"n{i}", evidence={"request": large.pk},
            )  # fmt: skip
    for who in (VIEWER, APPROVER):
        client = signed_in(people, who)
        client.get(f"/actions/{small.pk}/")
        few, _ = statements(client, f"/actions/{small.pk}/")
        many, response = statements(client, f"/actions/{large.pk}/")
        assert response.context["events"] and len(response.context["events"]) == 42
        assert few == many, (who, few, many)
        assert many <= 9, (who, many)

"""The call page (docs/console.md): a reviewer decides an UNKNOWN item from it alone.

The UNKNOWN refund is built through the real services, as a runtime and the reconciliation job would leave it: a
task and a call added, an attempt admitted by the gate and reported as a read timeout after sending (UNKNOWN, with
its decision card and a redacted diagnostic), then a status check that saw `pending` (a poll receipt). Only the
statement-count test inserts plain rows, in bulk, because it needs many of them and not their story.
"""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.utils import timezone

from recovery.audit.chain import Actor, append_event
from recovery.models import Attempt, Call, Decision, Diagnostic, GateDecision, Receipt, ReceiptSource, Task, Tenant
from recovery.models.roles import ADMIN, APPROVER, REVIEWER, VIEWER
from recovery.providers.status import StatusAnswer
from recovery.registry import load_registry
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.calls import call_add
from recovery.services.claims import call_claim
from recovery.services.outcomes import attempt_report, facts_of
from recovery.services.reconcile import apply_answer
from recovery.services.tasks import task_create
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT, NO_ROLE, SIGNED_OUT, page_text, signed_in, statements

SECRET_DETAIL = "upstream said: connection reset by 10.0.0.7 while holding refund-lock"
RUNTIME = Actor.system("tests-runtime")

REGISTRY = {
    "tenants": [{"name": "acme", "tools": "*"}],
    "providers": [{"name": "payments", "base_url": "http://127.0.0.1:9"}],
    "tools": [
        {
            "name": "refund.create",
            "provider": "payments",
            "side_effect": "write",
            "risk": "high",
            "request": {"method": "POST", "path": "/refunds"},
            "args_schema": {"type": "object"},
            "provider_ref_field": "refund_id",
            "required_result_fields": ["refund_id"],
            "status_query": {
                "method": "GET",
                "path": "/refunds/by-key/{idempotency_key}",
                "status_map": {"succeeded": "committed", "pending": "pending", "failed": "not_committed"},
            },
            "reconcile": {"first_check_s": 5, "backoff": 2, "max_checks": 10, "deadline_s": 3600},
            "key_retention_s": 3 * 3600,
            "budgets": {"max_attempts": 3},
        }
    ],
}
REFUND = {"order_id": "O-8848", "amount_cents": 1250, "reason": "damaged in transit"}
_n = iter(range(1, 1_000_000))


def load_refund_registry() -> None:
    load_registry(REGISTRY, actor=Actor.system("tests"))


def unknown_refund(
    *,
    arguments: dict | None = None,
    goal: str = "Refund order O-8848: the parcel arrived damaged",
    error_code: str = "",
    provider_request_id: str = "",
    error_message: str = SECRET_DETAIL,
    receipt_status: str = "pending",
    receipt_body: dict | None = None,
) -> Call:
    """An UNKNOWN refund as the real services leave it: admitted, timed out after sending, one `pending` check."""
    n = next(_n)
    task, _ = task_create(
        tenant=Tenant.objects.get(name="acme"),
        external_id=f"support-ticket-{n}",
        agent="support-bot",
        goal=goal,
        budget={"max_rounds": 10},
        actor=RUNTIME,
    )
    added = call_add(
        task=task,
        step_index=1,
        depends_on=[],
        tool_name="refund.create",
        arguments=arguments or REFUND,
        idempotency_key=f"refund-order-8848-v{n}",
        actor=RUNTIME,
    )
    call = _fresh(added.call.pk)
    admitted = attempt_admit(call=call, request=AttemptRequest(attempt_id=f"att-{n}-1"), actor=RUNTIME)
    assert admitted.status == 201, admitted.response
    call = _fresh(call.pk)
    attempt = Attempt.objects.select_related("tool").get(call=call, number=1)
    error = {"kind": "read_timeout", "message": error_message}
    if error_code:
        error["code"] = error_code
    facts = {"connection_opened": True, "sent": True, "error": error}
    if provider_request_id:
        facts["provider_request_id"] = provider_request_id
    answer = attempt_report(call=call, attempt=attempt, facts=facts_of(facts), actor=RUNTIME)
    assert answer["call_state"] == "UNKNOWN", answer
    apply_answer(
        call.pk,
        StatusAnswer(
            observed="pending",
            provider_status=receipt_status,
            http_status=200,
            request={"method": "GET", "url": f"http://127.0.0.1:9/refunds/by-key/{call.idempotency_key}"},
            response={"status": 200, "body": receipt_body or {"status": receipt_status, "refund_id": None}},
        ),
        worker="tests-worker",
    )
    return _fresh(call.pk)


def hostile_refund(**arguments) -> Call:
    """An UNKNOWN refund with markup in everything the agent and the provider wrote: its arguments (HOSTILE_SCRIPT,
    HOSTILE_IMG and `arguments`), goal, error code and message, provider request id, receipt status and body."""
    return unknown_refund(
        arguments={"note": HOSTILE_SCRIPT, "html": HOSTILE_IMG, **arguments},
        goal=f"refund {HOSTILE_SCRIPT}",
        error_code=HOSTILE_IMG,
        provider_request_id=HOSTILE_SCRIPT,
        error_message=f"boom {HOSTILE_IMG}",
        receipt_status=HOSTILE_IMG,
        receipt_body={"status": HOSTILE_IMG, "note": HOSTILE_SCRIPT},
    )


def _fresh(call_id: int) -> Call:
    return Call.objects.select_related("tool__provider", "task__tenant", "step").get(pk=call_id)


@pytest.fixture
def refund_registry(db):
    load_refund_registry()


def _html(response) -> str:
    return response.content.decode()


def _section(html: str, heading_id: str) -> str:
    start = html.index(f'id="{heading_id}"')
    end = html.find("</section>", start)
    return html[start:end]


# ---------------------------------------------------------------------------------------------------------------
# Who may open it
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "who, expected",
    [(SIGNED_OUT, "sign-in"), (NO_ROLE, 403), (VIEWER, 200), (REVIEWER, 200), (APPROVER, 200), (ADMIN, 200)],
)
def test_it_lets_every_role_read_the_page_and_nobody_else(people, refund_registry, who, expected):
    call = unknown_refund()
    response = signed_in(people, who).get(f"/calls/{call.pk}/")
    if expected == "sign-in":
        assert response.status_code == 302
        assert response["Location"] == f"/sign-in/?next=/calls/{call.pk}/"
    else:
        assert response.status_code == expected
    if expected == 200:
        assert call.idempotency_key in _html(response)


@pytest.mark.parametrize("path", ["/calls/999999/", "/calls/99999999999999999999/"])
def test_it_answers_404_for_an_unknown_call(people, refund_registry, path):
    unknown_refund()
    assert signed_in(people, REVIEWER).get(path).status_code == 404
    assert signed_in(people, REVIEWER).get(path, headers={"HX-Request": "true"}).status_code == 404


def test_it_checks_the_role_before_answering_404(people, db):
    assert signed_in(people, NO_ROLE).get("/calls/999999/").status_code == 403
    assert signed_in(people, SIGNED_OUT).get("/calls/999999/").status_code == 302


def test_it_refuses_anything_but_get(people, refund_registry):
    call = unknown_refund()
    assert signed_in(people, REVIEWER).post(f"/calls/{call.pk}/").status_code == 405


def test_queue_rows_open_the_call_page(people, refund_registry):
    call = unknown_refund()
    html = _html(signed_in(people, VIEWER).get("/queues/unknown/"))
    assert f'href="/calls/{call.pk}/"' in html
    assert "/admin/recovery/call/" not in html


# ---------------------------------------------------------------------------------------------------------------
# What it shows
# ---------------------------------------------------------------------------------------------------------------


def test_it_shows_a_reviewer_everything_needed_to_decide_an_unknown_refund(people, refund_registry):
    call = unknown_refund()
    attempt = Attempt.objects.get(call=call)
    receipt = Receipt.objects.get(call=call)
    html = _html(signed_in(people, REVIEWER).get(f"/calls/{call.pk}/"))
    text = page_text(html)

    # The intent.
    for fact in (
        "Refund order O-8848: the parcel arrived damaged",
        "acme",
        call.task.external_id,
        "refund.create",
        "side effect write",
        "risk high",
        '"order_id": "O-8848"',
        '"amount_cents": 1250',
    ):
        assert fact in text, fact
    # State, how long, version, key and its retention, checks, next check, last receipt; "being confirmed".
    status = page_text(_section(html, "status-h"))
    assert "UNKNOWN for " in status and "being confirmed" in status
    assert f"Version {call.version}" in status
    assert call.idempotency_key in status
    assert re.search(r"Key kept by the provider expires in 2 h (59|58) min", status), status
    assert "Checks made 1" in status and "Last receipt pending" in status
    assert f"Next check {call.next_check_at:%Y-%m-%d %H:%M:%S} UTC" in status
    assert "Tool breaker closed" in status
    # The attempt with its facts.
    attempts = page_text(_section(html, "attempts-h"))
    for fact in (attempt.attempt_id, "read_timeout", "outcome_unknown", f"{attempt.admitted_at:%Y-%m-%d %H:%M:%S}"):
        assert fact in attempts, fact
    # The decision card as fields, the decision and what comes next first.
    fields = re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", _section(html, "card-h"))
    assert fields[:2] == [("Decision", "reconcile"), ("Then", "{action: wait_for_reconcile, after_ms: 5000}")]
    assert ("Forbidden", "blind_replay, duplicate_refund, new_idempotency_key") in fields
    # The decision card as docs/design/decisions.md prints it.
    card = unescape(re.search(r'<pre class="card" id="latest-card"[^>]*>(.*?)</pre>', html, re.S).group(1))
    assert card.startswith(f"call: {call.pk}")
    for line in (
        "attempt: 1 of 3",
        "error: timeout_after_send",
        "phase: commit_unknown",
        "stage: during_send",
        f"idempotency_key: {call.idempotency_key}",
        "budget: attempt 1/3, task rounds 1/10",
        "decision: reconcile",
        "delay_ms: 5000",
        "next: [query_provider_status, if_unknown:human_review]",
        "forbidden: [blind_replay, duplicate_refund, new_idempotency_key]",
        "public_message: ",
        "required_next: {action: wait_for_reconcile, after_ms: 5000}",
    ):
        assert line in card, line
    # The receipt: what the provider said and when.
    receipts = page_text(_section(html, "receipts-h"))
    assert f"{receipt.checked_at:%Y-%m-%d %H:%M:%S} UTC" in receipts
    assert "poll" in receipts and "pending" in receipts and "UNKNOWN → UNKNOWN" in receipts
    assert f"/refunds/by-key/{call.idempotency_key}" in receipts
    # The gate's answer for the admission.
    gates = page_text(_section(html, "gates-h"))
    assert "allowed" in gates and "first_attempt" in gates
    # Budget left.
    budget = page_text(_section(html, "budget-h"))
    assert "call attempts 1/3: 2 left" in budget and "task rounds 1/10: 9 left" in budget
    # The reviewer reads the redacted diagnostic.
    diagnostics = page_text(_section(html, "diagnostics-h"))
    assert SECRET_DETAIL in diagnostics


def test_the_timeline_merges_everything_in_time_order(people, refund_registry):
    call = unknown_refund()
    html = _html(signed_in(people, VIEWER).get(f"/calls/{call.pk}/"))
    timeline = _section(html, "timeline-h")
    entries = re.findall(r'<li class="kind-(\w+)"><time datetime="([^"]+)">', timeline)
    kinds = [kind for kind, _ in entries]
    assert set(kinds) == {"attempt", "gate", "decision", "receipt", "audit"}
    assert [at for _, at in entries] == sorted(at for _, at in entries)
    titles = page_text(timeline)
    assert titles.index("call.added → READY") < titles.index("attempt 1 admitted")
    assert titles.index("attempt 1 admitted") < titles.index("call.transition SENT → UNKNOWN")
    assert titles.index("decision for attempt 1: reconcile") < titles.index("poll receipt: pending")
    assert "UTC" in titles


def test_a_viewer_sees_that_a_diagnostic_exists_but_not_what_it_says(people, refund_registry):
    call = unknown_refund()
    diagnostic = Diagnostic.objects.get(call=call)
    viewer = _html(signed_in(people, VIEWER).get(f"/calls/{call.pk}/"))
    assert diagnostic.ref in viewer
    assert "their content is for reviewers, approvers and admins" in viewer
    for secret in (SECRET_DETAIL, "10.0.0.7", "refund-lock", diagnostic.summary):
        assert secret not in viewer, secret
    for role in (REVIEWER, APPROVER, ADMIN):
        assert SECRET_DETAIL in page_text(_html(signed_in(people, role).get(f"/calls/{call.pk}/"))), role


def test_it_lists_every_action_with_why_it_is_allowed_or_forbidden(people, refund_registry):
    call = unknown_refund()
    reviewer = _html(signed_in(people, REVIEWER).get(f"/calls/{call.pk}/"))
    actions = _section(reviewer, "actions-h")
    text = page_text(actions)
    allowed = re.findall(r'data-action="(\w+)" data-allowed="yes"', actions)
    forbidden = re.findall(r'data-action="(\w+)" data-allowed="no"', actions)
    assert allowed == ["reconcile_now", "escalate"]
    assert sorted(forbidden) == sorted(
        [
            "replay_same_key",
            "mark_committed",
            "mark_not_committed",
            "grant_approval",
            "abandon",
            "start_compensation",
            "approve_new_compensation",
            "mark_compensation_committed",
            "mark_compensation_failed",
            "probe_duplicate",
            "restore_retry_path",
            "execute_held",
        ]
    )
    # Grouped by reason: each sentence once, followed by no other action's copy of it.
    reasons = re.findall(r'<span class="why">(.*?)</span>', actions)
    assert len(reasons) == len(set(reasons)) and len(reasons) < len(forbidden)
    assert "a blind replay is forbidden while the outcome is unknown: reconcile by key first" in text
    assert "escalate it to human review first" in text
    assert "Every action starts as a dry run" in text
    # Each allowed action is a form that previews it (a dry run: console/views/actions.py), none that executes it.
    main = reviewer[reviewer.index('<main id="main"') :]
    previews = [f"/calls/{call.pk}/actions/{name}/preview/" for name in allowed]
    forms = re.findall(r'<form method="post" action="([^"]+)"', main)
    assert forms == [f"/calls/{call.pk}/assign/", *previews]  # and the owner's form: assigning is not an action

    viewer = page_text(_section(_html(signed_in(people, VIEWER).get(f"/calls/{call.pk}/")), "actions-h"))
    assert viewer.count("needs the reviewer role (recovery.review_call)") == 1  # said once, for both actions
    assert "Reconcile now , Escalate to human review : needs the reviewer role (recovery.review_call)" in viewer
    assert "a blind replay is forbidden while the outcome is unknown" in viewer


def test_a_colleagues_claim_is_shown_and_forbids_the_actions(people, refund_registry):
    call = unknown_refund()
    taken = call_claim(call_id=call.pk, user=people["reviewer2"], actor=Actor.for_user(people["reviewer2"]))
    html = _html(signed_in(people, REVIEWER).get(f"/calls/{call.pk}/"))
    assert f"held by reviewer2 until {taken.until:%Y-%m-%d %H:%M:%S} UTC" in page_text(_section(html, "status-h"))
    assert "reviewer2 holds the claim on this call" in page_text(_section(html, "actions-h"))
    own = _html(signed_in(people, "reviewer2").get(f"/calls/{call.pk}/"))
    assert re.findall(r'data-action="(\w+)" data-allowed="yes"', own) == ["reconcile_now", "escalate"]


def test_it_says_when_the_providers_key_retention_has_expired(people, refund_registry):
    call = unknown_refund()
    Attempt.objects.filter(call=call).update(admitted_at=timezone.now() - timedelta(hours=5))
    status = page_text(_section(_html(signed_in(people, VIEWER).get(f"/calls/{call.pk}/")), "status-h"))
    assert re.search(r"expired 2 h( \d+ min)? ago: a replay with this key is no longer deduplicated", status), status


def test_it_counts_key_retention_from_the_calls_creation_before_any_attempt(people, refund_registry):
    task, _ = task_create(
        tenant=Tenant.objects.get(name="acme"), external_id="t-ready", agent="a", goal="g", budget={}, actor=RUNTIME
    )
    added = call_add(
        task=task, step_index=1, depends_on=[], tool_name="refund.create", arguments=REFUND,
        idempotency_key="k-ready", actor=RUNTIME,
    )  # fmt: skip
    html = _html(signed_in(people, REVIEWER).get(f"/calls/{added.call.pk}/"))
    assert "call created" in page_text(_section(html, "status-h"))
    assert "No attempt yet." in html and "No decision yet" in html and "No receipt yet" in html
    allowed = re.findall(r'data-action="(\w+)" data-allowed="yes"', html)
    assert allowed == ["abandon"]


# ---------------------------------------------------------------------------------------------------------------
# Untrusted text
# ---------------------------------------------------------------------------------------------------------------


def test_hostile_text_from_agents_and_providers_is_shown_as_text(people, refund_registry):
    call = hostile_refund()
    assert Receipt.objects.get(call=call).provider_status == HOSTILE_IMG
    html = _html(signed_in(people, REVIEWER).get(f"/calls/{call.pk}/"))
    main = html[html.index('<main id="main"') :]
    assert "<script>window.__pwned" not in main and "<img src=x" not in main
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in main
    assert "&lt;img src=x onerror=window.__pwned=1&gt;" in main
    text = page_text(main)
    for where in ("intent-h", "attempts-h", "receipts-h", "diagnostics-h"):
        section = page_text(_section(html, where))
        assert HOSTILE_SCRIPT in section or HOSTILE_IMG in section, where
    assert f"refund {HOSTILE_SCRIPT}" in text
    assert f"code {HOSTILE_IMG}" in text  # the timeline's attempt entry


# ---------------------------------------------------------------------------------------------------------------
# The live refresh
# ---------------------------------------------------------------------------------------------------------------


def test_the_live_refresh_draws_the_status_and_says_when_the_call_changed(people, refund_registry):
    call = unknown_refund()
    client = signed_in(people, REVIEWER)
    page = _html(client.get(f"/calls/{call.pk}/"))
    live_url = unescape(re.search(r'id="call-live"[^>]*hx-get="([^"]+)"', page).group(1))
    assert live_url == f"/calls/{call.pk}/?version={call.version}&checks=1"

    unchanged = _html(client.get(live_url, headers={"HX-Request": "true"}))
    assert unchanged.lstrip().startswith('<section id="call-live"') and "<html" not in unchanged
    assert "changed since the page was drawn" not in unchanged

    apply_answer(call.pk, StatusAnswer(observed="pending", provider_status="pending"), worker="w")
    checked = page_text(_html(client.get(live_url, headers={"HX-Request": "true"})))
    assert "1 new status check since the page was drawn" in checked and "Checks made 2" in checked

    apply_answer(
        call.pk, StatusAnswer(observed="committed", provider_status="succeeded", provider_ref="re_1"), worker="w"
    )
    moved = page_text(_html(client.get(live_url, headers={"HX-Request": "true"})))
    assert "This call changed since the page was drawn: it is now COMMITTED" in moved
    assert "re_1" in moved


def test_bad_query_input_is_a_400_with_the_field_named(people, refund_registry):
    call = unknown_refund()
    response = signed_in(people, REVIEWER).get(f"/calls/{call.pk}/?version=abc&checks=-1")
    assert response.status_code == 400
    text = page_text(_html(response))
    assert "version: Enter a whole number." in text
    assert "checks: Ensure this value is greater than or equal to 0." in text


# ---------------------------------------------------------------------------------------------------------------
# Cost: a fixed number of statements
# ---------------------------------------------------------------------------------------------------------------


def _grow(call: Call, extra: int) -> None:
    """`extra` more attempts, each with its decision card, gate answer, receipt, diagnostic and audit event: plain
    rows (the story is not under test here, the page's cost is)."""
    now = timezone.now()
    card = Decision.objects.filter(call=call).first().card
    start = call.attempts_count + 1
    diagnostics = Diagnostic.objects.bulk_create(
        Diagnostic(ref=f"diag_bulk_{call.pk}_{n}", call=call, tenant_id=call.tenant_id, source="attempt", summary="s")
        for n in range(start, start + extra)
    )
    attempts = Attempt.objects.bulk_create(
        Attempt(
            call=call, attempt_id=f"bulk-{n}", number=n, tool_id=call.tool_id, fingerprint=call.fingerprint,
            admitted_at=now, reported_at=now, connection_opened=True, sent=True, error_kind="read_timeout",
            failure_class="outcome_unknown", failure={"phase": "commit_unknown"}, diagnostic=diagnostic,
        )
        for n, diagnostic in zip(range(start, start + extra), diagnostics, strict=True)
    )  # fmt: skip
    Decision.objects.bulk_create(
        Decision(call=call, attempt=a, route="reconcile", public_message="m", card=card) for a in attempts
    )
    GateDecision.objects.bulk_create(
        GateDecision(call=call, attempt=a, allowed=True, reason="approval_granted", checks=[]) for a in attempts
    )
    Receipt.objects.bulk_create(
        Receipt(
            call=call, provider_id=call.tool.provider_id, source="poll", observed="pending", provider_status="pending",
            local_state_before="UNKNOWN", local_state_after="UNKNOWN", request={"method": "GET"}, response={"x": 1},
        )
        for _ in attempts
    )  # fmt: skip
    for a in attempts:
        append_event(action="call.note", actor=RUNTIME, task_id=call.task_id, call_id=call.pk, reason=a.attempt_id)
    Call.objects.filter(pk=call.pk).update(attempts_count=start + extra - 1)


@pytest.mark.parametrize("who", [VIEWER, REVIEWER])
def test_the_page_runs_the_same_statements_for_5_or_200_attempts(people, refund_registry, who):
    small, large = unknown_refund(), unknown_refund()
    _grow(small, 4)
    _grow(large, 199)
    assert Attempt.objects.filter(call=large).count() == 200 and Receipt.objects.filter(call=large).count() == 200
    client = signed_in(people, who)
    client.get(f"/calls/{small.pk}/")  # warm the session and permission caches alike for both
    few, few_page = statements(client, f"/calls/{small.pk}/")
    many, many_page = statements(client, f"/calls/{large.pk}/")
    few_html, many_html = _html(few_page), _html(many_page)
    assert few == many, (few, many)
    # 12 of the page's own (recovery.selectors.call_page; the 12th reads its duplicate probes), the session's and the
    # layout's; a reviewer's page one more: the reviewers the item may be assigned to
    assert many <= (18 if who == "reviewer" else 17), many
    assert many_html.count('<tr id="attempt-') == 200 and many_html.count('<tr id="receipt-') == 200
    assert few_html.count('<tr id="attempt-') == 5
    live_few, _ = statements(client, f"/calls/{small.pk}/?version=0&checks=0", HTTP_HX_REQUEST="true")
    live_many, _ = statements(client, f"/calls/{large.pk}/?version=0&checks=0", HTTP_HX_REQUEST="true")
    assert live_few == live_many <= 7, (live_few, live_many)


def test_the_task_and_tenant_shown_are_the_calls_own(people, refund_registry):
    call = unknown_refund()
    other = Task.objects.create(tenant=call.tenant, external_id="someone-else", agent="x", goal="another goal")
    html = _html(signed_in(people, VIEWER).get(f"/calls/{call.pk}/"))
    assert other.external_id not in html and "another goal" not in html


def test_a_settled_call_states_its_newest_receipt_its_effects_and_its_outcome_as_history(people, refund_registry):
    call = unknown_refund()
    unreachable = StatusAnswer(observed="failed", provider_status="unreachable", endpoint_failed=True)
    apply_answer(call.pk, unreachable, worker="w")
    Call.objects.filter(pk=call.pk).update(outcome="poll_budget_exhausted")  # as the poll budget left it
    replayed = StatusAnswer(observed="committed", provider_status="succeeded", provider_ref="re_7", effects=1)
    apply_answer(call.pk, replayed, worker="w", source=ReceiptSource.IDEMPOTENT_REPLAY)  # the replay settles it
    client = signed_in(people, VIEWER)

    for html in (
        _html(client.get(f"/calls/{call.pk}/")),
        _html(client.get(f"/calls/{call.pk}/", headers={"HX-Request": "true"})),  # the live refresh: the same
    ):
        facts = {name: (value, text) for name, value, text in re.findall(
            r'data-fact="([\w-]+)"[^>]*? data-value="([^"]*)">(.*?)</(?:span|dd)>', html, re.S
        )}  # fmt: skip
        assert page_text(facts["state"][1]) == "COMMITTED"
        assert page_text(facts["last-receipt"][1]).startswith("committed at ")
        assert facts["last-receipt"][0].startswith("committed@")
        assert (facts["effects"][0], page_text(facts["effects"][1])) == ("1", "1 effect observed")
        assert page_text(facts["outcome"][1]) == "before it settled: outcome poll_budget_exhausted"
        assert facts["outcome"][0] == "earlier:poll_budget_exhausted"

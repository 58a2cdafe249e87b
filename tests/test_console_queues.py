"""The operator console's queues (docs/console.md, docs/console.md) through Django's test client: roles, filters,
claims, and a fixed number of SQL statements whatever the page's size or depth."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import AuditEvent, Call, Task
from recovery.models.roles import ROLES
from recovery.statemachine.transitions import transition_call
from tests.console import PASSWORD, signed_in


def _unknown_calls(make_call, n: int) -> list[Call]:
    now = timezone.now()
    calls = []
    for i in range(n):
        call = make_call("UNKNOWN")
        Call.objects.filter(pk=call.pk).update(state_changed_at=now - timedelta(minutes=n - i))
        calls.append(call)
    return calls


def test_it_sends_signed_out_visitors_to_sign_in(client, db):
    for url in ["/", "/queues/unknown/", "/queues/human-review/", "/queues/calls/", "/queues/counts/"]:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/sign-in/?next="), url
    assert client.post("/calls/1/claim/").status_code == 302


def test_every_role_reads_the_queues_and_only_reviewers_claim(people, make_call):
    (call,) = _unknown_calls(make_call, 1)
    for role in ROLES:
        client = signed_in(people, role)
        page = client.get("/queues/unknown/")
        assert page.status_code == 200, role
        assert f'<code class="key">{call.idempotency_key}</code>' in page.content.decode()  # the key is a column
        assert (b'data-action="claim"' in page.content) == (role == "reviewer"), role
        status = client.post(f"/calls/{call.pk}/claim/").status_code
        assert status == (302 if role == "reviewer" else 403), role


def test_the_unknown_queue_lists_oldest_first_with_its_columns(people, make_call):
    calls = _unknown_calls(make_call, 3)
    make_call("COMMITTED")
    page = signed_in(people, "viewer").get("/queues/unknown/").content.decode()
    positions = [page.index(f'data-id="{c.pk}"') for c in calls]
    assert positions == sorted(positions)
    assert page.count('data-id="') == 3
    assert "refund.create" in page and "acme" in page and "UNKNOWN" in page


def test_bad_filters_get_field_errors_and_no_rows(people, make_call):
    _unknown_calls(make_call, 1)
    response = signed_in(people, "viewer").get("/queues/unknown/?tool=999999&risk=extreme&after=nonsense")
    assert response.status_code == 400
    body = response.content.decode()
    assert "Select a valid choice. 999999 is not one of the available choices." in body
    assert "Select a valid choice. extreme is not one of the available choices." in body
    assert "start from the first page" in body
    assert 'data-id="' not in body


def test_search_finds_a_call_by_key_task_or_provider_ref(people, make_call, task):
    (call,) = _unknown_calls(make_call, 1)
    other = make_call("UNKNOWN", on_task=None)
    Call.objects.filter(pk=other.pk).update(provider_ref="re_123")
    client = signed_in(people, "viewer")
    for q, expected in [
        (call.idempotency_key, {call.pk}),
        ("re_123", {other.pk}),
        (task.external_id, {call.pk, other.pk}),
    ]:
        body = client.get("/queues/unknown/", {"q": q}).content.decode()
        found = {c.pk for c in (call, other) if f'data-id="{c.pk}"' in body}
        assert found == expected, q


def test_search_finds_a_call_by_part_of_its_key_or_its_tasks_external_id(people, make_call, task):
    (call,) = _unknown_calls(make_call, 1)
    other = make_call("UNKNOWN", on_task=None)
    Call.objects.filter(pk=other.pk).update(idempotency_key="refund-order-7781-step-2")
    client = signed_in(people, "viewer")
    for q, expected in [
        ("order-7781", {other.pk}),  # part of a key
        (call.idempotency_key[1:], {call.pk}),
        (task.external_id[1:-1], {call.pk, other.pk}),  # part of the task's external id
        ("ord", {other.pk}),  # three characters are enough
        ("or", set()),  # two match only whole: nothing is "or"
    ]:
        body = client.get("/queues/unknown/", {"q": q}).content.decode()
        found = {c.pk for c in (call, other) if f'data-id="{c.pk}"' in body}
        assert found == expected, q


@pytest.mark.postgres
def test_a_search_by_part_reads_the_trigram_indexes(db):
    """A part of a key or an external id is found through an index, not by reading every call: the plan names the
    trigram indexes (a sequential scan is ruled out so the planner shows what it can use on a small table)."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for table, column, index in [
            ("recovery_call", "idempotency_key", "recovery_call_idempotency_key_trgm"),
            ("recovery_task", "external_id", "recovery_task_external_id_trgm"),
        ]:
            cursor.execute(f"EXPLAIN SELECT id FROM {table} WHERE {column} LIKE %s LIMIT 100", ["%order-77%"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert index in plan, plan


def test_keyset_pages_run_the_same_statements_whatever_the_size_or_depth(people, make_call):
    client = signed_in(people, "viewer")
    _unknown_calls(make_call, 5)
    with CaptureQueriesContext(connection) as small:
        assert client.get("/queues/unknown/").status_code == 200
    _unknown_calls(make_call, 120)
    with CaptureQueriesContext(connection) as big:
        first = client.get("/queues/unknown/")
    next_url = first.context["next_url"]
    assert next_url
    with CaptureQueriesContext(connection) as deep:
        second = client.get(next_url)
    assert len(small) == len(big) == len(deep)
    first_ids = {row["id"] for row in first.context["rows"]}
    second_ids = {row["id"] for row in second.context["rows"]}
    assert len(first_ids) == 50 and len(second_ids) == 50 and not first_ids & second_ids


def test_a_claim_is_a_lease_that_a_colleague_cannot_take(people, make_call):
    (call,) = _unknown_calls(make_call, 1)
    signed_in(people, "reviewer").post(f"/calls/{call.pk}/claim/")
    call.refresh_from_db()
    assert call.claimed_by == people["reviewer"] and call.claim_until > timezone.now()

    client = signed_in(people, "reviewer2")
    refused = client.post(f"/calls/{call.pk}/claim/", HTTP_HX_REQUEST="true")
    assert refused.status_code == 409 and "claimed by reviewer" in refused.content.decode()
    page = client.get("/queues/unknown/").content.decode()
    assert "reviewer" in page and 'data-action="claim"' not in page  # shown as held, no claim button
    assert client.post(f"/calls/{call.pk}/release/", HTTP_HX_REQUEST="true").status_code == 409  # not theirs
    assert Call.objects.get(pk=call.pk).claimed_by == people["reviewer"]

    Call.objects.filter(pk=call.pk).update(claim_until=timezone.now() - timedelta(seconds=1))  # the lease lapses
    taken = client.post(f"/calls/{call.pk}/claim/", HTTP_HX_REQUEST="true")
    assert taken.status_code == 200
    call.refresh_from_db()
    assert call.claimed_by == people["reviewer2"] and call.state == "UNKNOWN" and call.version == 0
    actions = list(AuditEvent.objects.filter(call_id=call.pk).values_list("action", flat=True))
    assert actions == ["call.claimed", "call.claimed"]


def test_the_live_refresh_gets_only_the_rows(people, make_call):
    _unknown_calls(make_call, 2)
    response = signed_in(people, "viewer").get("/queues/unknown/?risk=high", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert body.lstrip().startswith('<tbody id="rows"') and "<html" not in body
    assert 'hx-get="/queues/unknown/?risk=high"' in body


def test_sign_in_is_throttled_after_repeated_failures(client, people, settings):
    settings.RECOVERY_SIGN_IN_MAX_FAILURES = 3
    for _ in range(3):
        response = client.post("/sign-in/", {"username": "reviewer", "password": "wrong"})
        assert "Please enter a correct username and password" in response.content.decode()
    blocked = client.post("/sign-in/", {"username": "reviewer", "password": PASSWORD})
    assert "Too many failed sign-ins" in blocked.content.decode()
    assert "_auth_user_id" not in client.session
    other = client.post("/sign-in/", {"username": "viewer", "password": PASSWORD})
    assert other.status_code == 302 and client.session["_auth_user_id"] == str(people["viewer"].pk)


def test_pages_carry_a_nonce_csp_and_escape_hostile_text(people, make_call, registry):
    registry["refund"].name = "<script>alert(1)</script>"
    registry["refund"].save()
    (call,) = _unknown_calls(make_call, 1)
    # An agent's and a provider's text, written into the row's cells and attributes: escaped, quotes too.
    hostile = '"><img src=x onerror=alert(2)>'
    Call.objects.filter(pk=call.pk).update(
        idempotency_key=f"k{hostile}", last_receipt_status=hostile, last_receipt_at=timezone.now()
    )
    Task.objects.filter(pk=call.task_id).update(external_id=f"t{hostile}")
    for name in ("viewer", "reviewer"):
        response = signed_in(people, name).get(reverse("console:queue", kwargs={"slug": "unknown"}))
        policy = response["Content-Security-Policy"]
        assert "script-src 'self' 'nonce-" in policy and "object-src 'none'" in policy
        body = response.content.decode()
        assert "<script>alert(1)</script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
        assert "<img" not in body and body.count(html.escape(hostile)) >= 4, name


def test_an_htmx_request_of_an_ended_session_is_sent_to_sign_in_as_a_whole_page(client, db):
    response = client.post(
        "/calls/1/claim/", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/queues/unknown/?risk=high"
    )
    assert response.status_code == 204
    assert response["HX-Redirect"] == "/sign-in/?next=%2Fqueues%2Funknown%2F%3Frisk%3Dhigh"


def test_all_calls_shows_every_state_by_default_oldest_first_and_one_state_when_asked(people, make_call):
    now = timezone.now()
    made = []
    for i, state in enumerate(["READY", "COMMITTED", "UNKNOWN", "FAILED_PERMANENT", "HUMAN_REVIEW"]):
        call = make_call(state)
        Call.objects.filter(pk=call.pk).update(state_changed_at=now - timedelta(minutes=10 - i))
        made.append(call)
    client = signed_in(people, "viewer")

    page = client.get("/queues/calls/").content.decode()

    positions = [page.index(f'data-id="{c.pk}"') for c in made]
    assert positions == sorted(positions) and page.count('data-id="') == 5  # every state, oldest first
    assert '<option value="" selected>every state here</option>' in page
    one = client.get("/queues/calls/?state=COMMITTED").content.decode()
    assert one.count('data-id="') == 1 and f'data-id="{made[1].pk}"' in one


def test_all_calls_pages_through_every_state_with_the_same_statements(people, make_call):
    now = timezone.now()
    for i in range(120):
        call = make_call(["READY", "COMMITTED", "UNKNOWN"][i % 3])
        Call.objects.filter(pk=call.pk).update(state_changed_at=now - timedelta(minutes=200 - i))
    client = signed_in(people, "viewer")
    seen, url, counts = [], "/queues/calls/", []
    while url:
        with CaptureQueriesContext(connection) as queries:
            page = client.get(url).content.decode()
        counts.append(len(queries))
        seen += [int(pk) for pk in re.findall(r'data-id="(\d+)"', page)]
        found = re.search(r'<a href="([^"]+)" rel="next">', page)
        url = html.unescape(found[1]) if found else ""
    assert len(seen) == 120 == len(set(seen))
    assert len(set(counts)) == 1, counts


def test_each_row_says_why_it_waits_and_links_to_the_call_by_its_name(people, make_call, registry):
    checking = make_call("UNKNOWN", checks_made=2)
    used_up = make_call("HUMAN_REVIEW", outcome="poll_budget_exhausted")
    asked = make_call("HUMAN_REVIEW", outcome="human_review_required")
    client = signed_in(people, "viewer")

    unknown = client.get("/queues/unknown/").content.decode()
    review = client.get("/queues/human-review/").content.decode()

    row = unknown[unknown.index(f'id="call-{checking.pk}"') :]
    assert f">call {checking.pk}</a>" in row and "outcome unknown: 2 status checks so far" in row
    assert "status checks used up without an answer" in review[review.index(f'id="call-{used_up.pk}"') :]
    assert "the recovery engine asks a person" in review[review.index(f'id="call-{asked.pk}"') :]
    # The row's task is a link to its page.
    task = checking.task
    assert f'<a class="task-name" href="/tasks/{task.pk}/">{html.escape(task.external_id)}</a>' in row


def test_a_settled_call_on_all_calls_does_not_say_why_it_waits(people, make_call):
    settled = make_call("COMMITTED", outcome="poll_budget_exhausted")  # reached a person, then committed
    body = signed_in(people, "viewer").get("/queues/calls/").content.decode()
    row = body[body.index(f'id="call-{settled.pk}"') :].split("</tr>", 1)[0]
    assert "status checks used up" not in row and "not waiting (COMMITTED)" in row


def test_an_empty_unknown_queue_says_what_left_it_in_the_last_hour(people, make_call):
    client = signed_in(people, "viewer")
    assert "No call left it in the last hour." in client.get("/queues/unknown/").content.decode()
    for _ in range(2):
        call = make_call("UNKNOWN")
        transition_call(call, "COMMITTED", actor=Actor.system("reconcile"), reason="receipt: committed")
    escalated = make_call("UNKNOWN")
    transition_call(escalated, "HUMAN_REVIEW", actor=Actor.system("reconcile"), reason="poll budget exhausted")

    page = client.get("/queues/unknown/").content.decode()

    assert "Nothing waits here now. In the last hour 3 calls left this queue: 2 COMMITTED, 1 HUMAN_REVIEW" in page
    assert 'href="/audit/?action=call.transition"' in page
    filtered = client.get("/queues/unknown/?risk=high").content.decode()
    assert "Nothing here with these filters." in filtered and "left this queue" not in filtered

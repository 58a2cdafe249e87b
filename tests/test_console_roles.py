"""Who may do what in the operator console (docs/console.md, docs/console.md): every console URL against every role, a
signed-out visitor and a user with no role; the statements a queue page runs, whatever its size, depth, filters or
partial; and the machine API keeping its own (token) authentication beside the console's sessions.

tests/test_console_queues.py covers the queues' behaviour; this file is the access and cost matrix.
"""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import quote

import pytest
from django.test import Client
from django.utils import timezone

from recovery.engine.canonical import canonical_json
from recovery.models import (
    ActionRequest,
    ActionStatus,
    AuditEvent,
    Breaker,
    BreakerOperation,
    BulkAction,
    BulkItem,
    Call,
    DrillRun,
    Step,
    Task,
)
from recovery.models.roles import ADMIN, APPROVER, REVIEWER, VIEWER
from tests.console import NO_ROLE, PASSWORD, SIGNED_OUT, signed_in, statements

WHO = (SIGNED_OUT, VIEWER, REVIEWER, APPROVER, ADMIN, NO_ROLE)


# ---------------------------------------------------------------------------------------------------------------
# The role x URL matrix
# ---------------------------------------------------------------------------------------------------------------

# Expected answers. "sign-in" is a 302 to /sign-in/?next=<the path>; "admin-login" a 302 to the admin's login (the
# Django admin keeps its own, and only staff — the admin role — get past it); "->/x/" a 302 to /x/; numbers are the
# status. A key missing from a row takes the row's "*".
EVERY_ROLE = {SIGNED_OUT: "sign-in", NO_ROLE: 403}
MATRIX: list[tuple[str, str, dict[str, object]]] = [
    ("GET", "/", {**EVERY_ROLE, "*": "->/overview/"}),
    ("GET", "/overview/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/overview/metrics/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/overview/metrics/?window=7d&tool=refund.create&tenant=acme", {**EVERY_ROLE, "*": 200}),
    ("GET", "/overview/metrics/?window=1y", {**EVERY_ROLE, "*": 400}),  # a bad filter: a field error, not a 500
    ("POST", "/overview/metrics/", {"*": 405}),  # pages are read with GET
    ("GET", "/queues/unknown/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/queues/human-review/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/queues/calls/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/queues/unknown/?risk=high&q=nothing", {**EVERY_ROLE, "*": 200}),
    ("GET", "/queues/unknown/?tool=999999", {**EVERY_ROLE, "*": 400}),  # a bad filter: field errors, not a 500
    ("GET", "/queues/no-such-queue/", {**EVERY_ROLE, "*": 404}),  # the permission is checked before the 404
    ("GET", "/queues/counts/", {**EVERY_ROLE, "*": 200}),
    ("POST", "/calls/{call}/claim/", {**EVERY_ROLE, REVIEWER: "->/queues/unknown/", "*": 403}),
    ("POST", "/calls/{call}/release/", {**EVERY_ROLE, REVIEWER: "->/queues/unknown/", "*": 403}),
    ("POST", "/calls/999999999/claim/", {**EVERY_ROLE, REVIEWER: "->/queues/unknown/", "*": 403}),  # no such call
    ("GET", "/calls/{call}/claim/", {"*": 405}),  # claims change state: POST only, whoever asks
    ("GET", "/calls/{call}/release/", {"*": 405}),
    ("POST", "/calls/{call}/assign/", {**EVERY_ROLE, REVIEWER: "->/queues/unknown/", "*": 403}),  # to themselves
    ("GET", "/calls/{call}/assign/", {"*": 405}),
    ("GET", "/notifications/", {**EVERY_ROLE, "*": 200}),  # the delivery log
    ("POST", "/views/", {**EVERY_ROLE, "*": "->/overview/"}),  # no name: refused, nothing saved
    ("POST", "/views/1/delete/", {**EVERY_ROLE, "*": "->/overview/"}),  # not theirs (none is): nothing deleted
    ("GET", "/views/", {"*": 405}),
    ("GET", "/calls/{call}/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/calls/{call}/?version=x", {**EVERY_ROLE, "*": 400}),  # the live refresh's own parameters, checked
    ("GET", "/calls/999999999/", {**EVERY_ROLE, "*": 404}),
    ("POST", "/calls/{call}/", {"*": 405}),  # pages are read with GET; actions have their own URLs
    ("GET", "/tasks/{task}/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/tasks/999999999/", {**EVERY_ROLE, "*": 404}),
    ("GET", "/audit/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/audit/?task=x", {**EVERY_ROLE, "*": 400}),
    ("GET", "/audit/export/?format=csv", {**EVERY_ROLE, "*": 200}),
    ("GET", "/audit/export/?format=xml", {**EVERY_ROLE, "*": 400}),
    ("POST", "/audit/verify/", {**EVERY_ROLE, ADMIN: "->/audit/", "*": 403}),  # admins only
    ("GET", "/audit/verify/", {"*": 405}),
    ("GET", "/operations/breakers/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/operations/tools/{tool}/", {**EVERY_ROLE, "*": 200}),  # a tool's retry path and duplicate probes
    ("GET", "/operations/tools/999999999/", {**EVERY_ROLE, "*": 404}),
    ("GET", "/operations/drills/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/operations/drills/{run}/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/operations/drills/999999999/", {**EVERY_ROLE, "*": 404}),
    # Breaker operations: reviewers open the dry run and confirm it (an empty form: a field error), approvers decide a
    # reset (likewise); every role reads an operation's page.
    ("GET", "/operations/breakers/{tool}/force-open/", {**EVERY_ROLE, REVIEWER: 200, "*": 403}),
    ("GET", "/operations/breakers/{tool}/reset/", {**EVERY_ROLE, REVIEWER: 200, "*": 403}),
    ("GET", "/operations/breakers/{tool}/no-such-operation/", {**EVERY_ROLE, REVIEWER: 404, "*": 403}),
    ("GET", "/operations/breakers/999999999/force-open/", {**EVERY_ROLE, REVIEWER: 404, "*": 403}),
    ("POST", "/operations/breakers/{tool}/force-open/", {**EVERY_ROLE, REVIEWER: 400, "*": 403}),
    ("POST", "/operations/breakers/{tool}/reset/", {**EVERY_ROLE, REVIEWER: 400, "*": 403}),
    ("GET", "/operations/breaker-operations/{operation}/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/operations/breaker-operations/999999999/", {**EVERY_ROLE, "*": 404}),
    ("POST", "/operations/breaker-operations/{operation}/approve/", {**EVERY_ROLE, APPROVER: 400, "*": 403}),
    ("POST", "/operations/breaker-operations/{operation}/reject/", {**EVERY_ROLE, APPROVER: 400, "*": 403}),
    ("GET", "/operations/breaker-operations/{operation}/approve/", {"*": 405}),
    # Operator actions: reviewers preview (a dry run, then its page) and request; approvers decide; every role reads.
    ("POST", "/calls/{call}/actions/escalate/preview/", {**EVERY_ROLE, REVIEWER: "->/actions/N/", "*": 403}),
    ("POST", "/calls/{call}/actions/no-such-action/preview/", {**EVERY_ROLE, REVIEWER: 404, "*": 403}),
    ("POST", "/calls/999999999/actions/escalate/preview/", {**EVERY_ROLE, REVIEWER: 404, "*": 403}),
    ("GET", "/calls/{call}/actions/escalate/preview/", {"*": 405}),  # a dry run is still a POST: it is recorded
    ("GET", "/actions/{request}/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/actions/999999999/", {**EVERY_ROLE, "*": 404}),
    ("POST", "/actions/{request}/", {"*": 405}),
    ("POST", "/actions/{request}/request/", {**EVERY_ROLE, REVIEWER: 400, "*": 403}),  # no reason: a field error
    ("POST", "/actions/{request}/approve/", {**EVERY_ROLE, APPROVER: 400, "*": 403}),
    ("POST", "/actions/{request}/reject/", {**EVERY_ROLE, APPROVER: 400, "*": 403}),
    # A reviewer's form is checked first (400: no reason); the service then refuses anyone but the requester.
    ("POST", "/actions/{request}/withdraw/", {**EVERY_ROLE, REVIEWER: 400, "*": 403}),
    ("POST", "/actions/999999999/approve/", {**EVERY_ROLE, APPROVER: 404, "*": 403}),
    ("GET", "/actions/{request}/request/", {"*": 405}),
    ("GET", "/actions/{request}/approve/", {"*": 405}),
    ("GET", "/actions/{request}/reject/", {"*": 405}),
    # Bulk actions: reviewers freeze a selection (an empty form: back to the queue with the error), request it;
    # approvers decide; every role reads a bulk's page.
    ("POST", "/queues/unknown/bulk/", {**EVERY_ROLE, REVIEWER: "->/queues/unknown/", "*": 403}),
    ("POST", "/queues/no-such-queue/bulk/", {**EVERY_ROLE, REVIEWER: 404, "*": 403}),
    ("GET", "/queues/unknown/bulk/", {"*": 405}),
    ("GET", "/bulk/{bulk}/", {**EVERY_ROLE, "*": 200}),
    ("GET", "/bulk/999999999/", {**EVERY_ROLE, "*": 404}),
    ("POST", "/bulk/{bulk}/request/", {**EVERY_ROLE, REVIEWER: 400, "*": 403}),
    ("POST", "/bulk/{bulk}/approve/", {**EVERY_ROLE, APPROVER: 400, "*": 403}),
    ("POST", "/bulk/{bulk}/reject/", {**EVERY_ROLE, APPROVER: 400, "*": 403}),
    ("GET", "/bulk/{bulk}/approve/", {"*": 405}),
    ("GET", "/approvals/", {**EVERY_ROLE, APPROVER: 200, "*": 403}),
    ("GET", "/sign-in/", {SIGNED_OUT: 200, "*": "->/"}),  # a signed-in user is sent on
    ("GET", "/sign-out/", {"*": 405}),  # signing out is a POST (a link or an image cannot sign anyone out)
    ("POST", "/sign-out/", {"*": "->/sign-in/"}),
    ("GET", "/admin/", {SIGNED_OUT: "admin-login", ADMIN: 200, "*": "admin-login"}),
    ("GET", "/admin/recovery/call/", {SIGNED_OUT: "admin-login", ADMIN: 200, "*": "admin-login"}),
    ("GET", "/admin/recovery/call/{call}/change/", {SIGNED_OUT: "admin-login", ADMIN: 200, "*": "admin-login"}),
    ("GET", "/api/v1/tasks", {"*": 401}),  # the API ignores the console's session: tokens only
    ("POST", "/api/v1/tasks", {"*": 401}),
]


def _expected(row: dict[str, object], who: str) -> object:
    return row.get(who, row["*"])


def _answer(response, path: str) -> object:
    """The response in the matrix's terms."""
    if response.status_code != 302:
        return response.status_code
    location = response["Location"]
    if location == f"/sign-in/?next={quote(path, safe='/')}":
        return "sign-in"
    if location.startswith("/admin/login/?next="):
        return "admin-login"
    if re.fullmatch(r"/actions/\d+/", location):
        return "->/actions/N/"  # a new action request's page: its id is not known in advance
    return f"->{location}"


@pytest.mark.parametrize("who", WHO)
def test_each_url_answers_each_role_as_the_matrix_says(people, make_call, who):
    call = make_call("UNKNOWN")
    run = DrillRun.objects.create(drills=["timeout_after_send"])
    pending = _pending_request(call, people["reviewer2"])
    reset = _pending_reset(call, people["reviewer2"])
    bulk = _pending_bulk(call, people["reviewer2"])
    wrong = []
    for method, template, row in MATRIX:
        path = template.format(
            call=call.pk,
            task=call.task_id,
            run=run.pk,
            request=pending.pk,
            tool=call.tool_id,
            operation=reset.pk,
            bulk=bulk.pk,
        )
        client = signed_in(people, who)  # a fresh session each time: signing out must not leak into the next row
        response = client.get(path) if method == "GET" else client.post(path, {})
        got, want = _answer(response, path), _expected(row, who)
        if got == 200 and response.get("Content-Type", "").startswith("text/html"):
            # A template comment or tag spread over lines is printed as text: none may reach a page.
            leaked = [mark for mark in (b"{#", b"#}", b"{%", b"%}") if mark in response.content]
            if leaked:
                wrong.append(f"{method} {path}: template syntax shown on the page: {leaked}")
        if got != want:
            wrong.append(f"{method} {path}: got {got!r}, want {want!r}")
    assert not wrong, f"{who}:\n  " + "\n  ".join(wrong)
    # A refused claim writes nothing: only the reviewer's claim, release and assignment reached the audit trail.
    actions = list(AuditEvent.objects.filter(call_id=call.pk).order_by("seq").values_list("action", flat=True))
    expected = ["call.claimed", "call.released", "call.assigned", "action.previewed"] if who == REVIEWER else []
    assert actions == expected, who
    # Nobody's POST moved the pending request (each was refused, or its form was, before any service ran).
    pending.refresh_from_db()
    assert (pending.status, pending.decided_by_id, pending.reason) == (ActionStatus.REQUESTED, None, "seen"), who
    reset.refresh_from_db()
    assert (reset.status, reset.decided_by_id) == ("requested", None), who
    assert not Breaker.objects.exists(), who  # nobody's POST forced a breaker open
    bulk.refresh_from_db()
    assert (bulk.status, bulk.decided_by_id) == ("requested", None), who
    assert BulkAction.objects.count() == 1, who  # nobody's empty form froze a selection
    # Only an admin's chain verification reached the trail besides (as a system event).
    verified = AuditEvent.objects.filter(action="audit.verified").count()
    assert verified == (1 if who == ADMIN else 0), who


def _pending_bulk(call: Call, requester) -> BulkAction:
    """A requested bulk of one item waiting for an approver, as plain rows."""
    now = timezone.now()
    bulk = BulkAction.objects.create(
        action="escalate", status="requested", queue="unknown", selection="rows", selection_hash="0" * 64,
        previewed_by=requester, requested_by=requester, requested_at=now, reason="seen",
        expires_at=now + timedelta(hours=1),
    )  # fmt: skip
    BulkItem.objects.create(bulk=bulk, position=1, call=call, call_version=call.version, call_state=call.state)
    return bulk


def _pending_request(call: Call, requester) -> ActionRequest:
    """A requested action waiting for an approver, as a plain row (the matrix tests who may post, not the plan)."""
    now = timezone.now()
    return ActionRequest.objects.create(
        call=call, action="escalate", status=ActionStatus.REQUESTED, plan={"action": "escalate", "checks": []},
        plan_hash="0" * 64, call_version=call.version, previewed_by=requester, requested_by=requester,
        requested_at=now, reason="seen", expires_at=now + timedelta(hours=1),
    )  # fmt: skip


def _pending_reset(call: Call, requester) -> BreakerOperation:
    """A breaker reset waiting for an approver, as a plain row."""
    now = timezone.now()
    return BreakerOperation.objects.create(
        tool=call.tool, operation="reset", status="requested", reason="seen", requested_by=requester,
        breaker_state="forced_open", expires_at=now + timedelta(hours=1),
    )  # fmt: skip


def test_the_matrix_covers_every_console_url():
    """A new console URL must get a row above (the console's own patterns, sign-in/out and the admin/API roots)."""
    from console.urls import console_patterns

    covered = {template.split("?")[0] for _, template, _ in MATRIX}
    for pattern in console_patterns:
        route = str(pattern.pattern)
        sample = "/" + route.replace("<slug:slug>", "unknown").replace("<int:call_id>", "{call}")
        sample = sample.replace("<int:task_id>", "{task}").replace("<int:run_id>", "{run}")
        sample = sample.replace("<int:request_id>", "{request}").replace("<slug:action>", "escalate")
        sample = sample.replace("<int:tool_id>", "{tool}").replace("<slug:operation>", "force-open")
        sample = sample.replace("<int:operation_id>", "{operation}").replace("<int:bulk_id>", "{bulk}")
        sample = sample.replace("<int:view_id>", "1")
        assert sample in covered or sample.replace("unknown", "no-such-queue") in covered, route
    assert {"/sign-in/", "/sign-out/", "/admin/", "/api/v1/tasks"} <= covered


@pytest.mark.parametrize("path", ["/", "/queues/unknown/?tool=1&q=task-1&sort=newest", "/queues/counts/"])
def test_sign_in_brings_a_signed_out_visitor_back_where_they_were(people, db, path):
    client = Client()
    sent = client.get(path)
    assert sent.status_code == 302
    login_url = sent["Location"]
    assert login_url.startswith("/sign-in/?next=")
    form = client.get(login_url)
    assert form.status_code == 200 and f'name="next" value="{path.replace("&", "&amp;")}"' in form.content.decode()
    back = client.post(login_url, {"username": VIEWER, "password": PASSWORD, "next": path})
    assert back.status_code == 302 and back["Location"] == path


def test_sign_in_refuses_to_send_anyone_to_another_site(people, db):
    response = Client().post(
        "/sign-in/", {"username": VIEWER, "password": PASSWORD, "next": "https://evil.example/phish"}
    )
    assert response.status_code == 302 and response["Location"] == "/"


def test_after_a_wrong_password_the_password_field_has_the_focus(people, db):
    fresh = Client().get("/sign-in/").content.decode()
    assert re.search(r'<input[^>]*name="username"[^>]*autofocus', fresh)  # a first visit starts at the username
    wrong = Client().post("/sign-in/", {"username": VIEWER, "password": "not-it"}).content.decode()
    assert re.search(r'<input[^>]*name="password"[^>]*autofocus', wrong), wrong
    assert not re.search(r'<input[^>]*name="username"[^>]*autofocus', wrong) and f'value="{VIEWER}"' in wrong
    empty = Client().post("/sign-in/", {"username": "", "password": ""}).content.decode()
    assert re.search(r'<input[^>]*name="username"[^>]*autofocus', empty)  # nothing typed: start at the top


def test_a_claim_needs_the_csrf_token(people, make_call):
    """The console's POSTs are CSRF-protected (htmx sends the token from the page's hx-headers)."""
    call = make_call("UNKNOWN")
    client = signed_in(people, REVIEWER, enforce_csrf_checks=True)
    assert client.post(f"/calls/{call.pk}/claim/", HTTP_HX_REQUEST="true").status_code == 403
    assert Call.objects.get(pk=call.pk).claimed_by_id is None

    page = client.get("/queues/unknown/").content.decode()
    token = page.split('"X-CSRFToken": "', 1)[1].split('"', 1)[0]
    taken = client.post(f"/calls/{call.pk}/claim/", HTTP_HX_REQUEST="true", HTTP_X_CSRFTOKEN=token)
    assert taken.status_code == 200
    assert Call.objects.get(pk=call.pk).claimed_by == people[REVIEWER]


def test_a_claim_redirects_only_to_this_site(people, make_call):
    call = make_call("UNKNOWN")
    client = signed_in(people, REVIEWER)
    kept = client.post(f"/calls/{call.pk}/claim/", {"next": "/queues/unknown/?risk=high"})
    assert kept["Location"] == "/queues/unknown/?risk=high"
    refused = client.post(f"/calls/{call.pk}/release/", {"next": "https://evil.example/"})
    assert refused["Location"] == "/queues/unknown/"


@pytest.mark.parametrize("who", [VIEWER, APPROVER, ADMIN])
def test_only_reviewers_are_offered_claim_buttons(people, make_call, who):
    call = make_call("UNKNOWN")
    Call.objects.filter(pk=call.pk).update(claimed_by=people["reviewer2"], claim_until=timezone.now() + timedelta(1))
    make_call("UNKNOWN")
    body = signed_in(people, who).get("/queues/unknown/").content.decode()
    assert 'class="claim-button"' not in body and "/claim/" not in body and "/release/" not in body
    assert '<span class="holder">reviewer2</span>' in body  # everyone sees who holds an item


def test_a_reviewer_gets_claim_and_release_buttons_as_the_items_stand(people, make_call):
    mine, theirs, free = make_call("UNKNOWN"), make_call("UNKNOWN"), make_call("UNKNOWN")
    soon = timezone.now() + timedelta(minutes=5)
    Call.objects.filter(pk=mine.pk).update(claimed_by=people[REVIEWER], claim_until=soon)
    Call.objects.filter(pk=theirs.pk).update(claimed_by=people["reviewer2"], claim_until=soon)
    body = signed_in(people, REVIEWER).get("/queues/unknown/").content.decode()

    def cell(call):
        return body.split(f'id="call-{call.pk}"', 1)[1].split("</tr>", 1)[0]

    assert 'data-action="release"' in cell(mine) and 'data-action="claim"' not in cell(mine)
    assert 'class="claim-button"' not in cell(theirs) and "reviewer2" in cell(theirs)
    assert 'data-action="claim"' in cell(free)


# ---------------------------------------------------------------------------------------------------------------
# Statements per page: the same for 10 rows or 500, on the first page or a deep one
# ---------------------------------------------------------------------------------------------------------------


def _bulk_calls(task: Task, tool, n: int, *, state: str = "UNKNOWN", holders=(), start: int = 0) -> None:
    """n calls in one INSERT, oldest first, every third one claimed by one of `holders` (the holder's name is a
    column, so a claimed row must not cost a statement of its own)."""
    step, _ = Step.objects.get_or_create(task=task, index=1)
    now = timezone.now()
    calls = []
    for i in range(start, start + n):
        args = {"order": i, "amount_cents": 100 + i}
        holder = holders[i % len(holders)] if holders and i % 3 == 0 else None
        calls.append(
            Call(
                tenant=task.tenant,
                task=task,
                step=step,
                tool=tool,
                idempotency_key=f"bulk-{state}-{i}",
                arguments=args,
                fingerprint=canonical_json([tool.name, args])[:64],
                side_effect=tool.side_effect,
                risk=tool.risk,
                state=state,
                state_changed_at=now - timedelta(hours=2) + timedelta(seconds=i),
                claimed_by=holder,
                claim_until=now + timedelta(minutes=10) if holder else None,
                last_receipt_at=now - timedelta(minutes=1) if i % 2 else None,
                last_receipt_status="pending" if i % 2 else "",
            )
        )
    Call.objects.bulk_create(calls, batch_size=250)


def _deep(client: Client, url: str, pages: int) -> str:
    for _ in range(pages):
        url = client.get(url).context["next_url"]
        assert url, "expected another page"
    return url


QUEUE_PAGES = [
    ("unknown", "/queues/unknown/", "UNKNOWN"),
    ("unknown-filtered", "/queues/unknown/?tool={tool}&q={task}&risk=high&age=5m", "STILL_UNKNOWN"),
    ("human-review", "/queues/human-review/?sort=newest", "HUMAN_REVIEW"),
    ("calls", "/queues/calls/?state=COMMITTED&tenant={tenant}", "COMMITTED"),
]


@pytest.mark.parametrize(("name", "template", "state"), QUEUE_PAGES, ids=[p[0] for p in QUEUE_PAGES])
def test_a_queue_page_runs_the_same_statements_for_10_or_500_rows_and_deep_pages(
    people, registry, task, name, template, state
):
    url = template.format(tool=registry["refund"].pk, task=task.external_id, tenant=registry["tenant"].pk)
    client = signed_in(people, REVIEWER)  # a reviewer's page has the most in it: claim forms and holders
    holders = (people[REVIEWER], people["reviewer2"])
    _bulk_calls(task, registry["refund"], 10, state=state, holders=holders)

    small, first = statements(client, url)
    small_rows, _ = statements(client, url, HTTP_HX_REQUEST="true")
    assert len(first.context["rows"]) == 10 and not first.context["next_url"]

    _bulk_calls(task, registry["refund"], 490, state=state, holders=holders, start=10)
    _bulk_calls(task, registry["lookup"], 30, state=state, start=1000)  # other rows the filters must keep out
    big, first = statements(client, url)
    big_rows, _ = statements(client, url, HTTP_HX_REQUEST="true")
    deep_url = _deep(client, url, 6)  # the 7th page of 50
    deep, deep_page = statements(client, deep_url)
    deep_rows, partial = statements(client, deep_url, HTTP_HX_REQUEST="true")

    assert small == big == deep, (small, big, deep)
    assert small_rows == big_rows == deep_rows, (small_rows, big_rows, deep_rows)
    assert len(first.context["rows"]) == 50 and len(deep_page.context["rows"]) == 50
    assert "claimed" in partial.content.decode() and "<html" not in partial.content.decode()


def test_the_nav_counts_are_one_statement_whatever_the_numbers(people, registry, task):
    client = signed_in(people, VIEWER)
    _bulk_calls(task, registry["refund"], 4, state="UNKNOWN")
    _bulk_calls(task, registry["refund"], 3, state="STILL_UNKNOWN", start=100)
    _bulk_calls(task, registry["refund"], 2, state="HUMAN_REVIEW", start=200)
    _bulk_calls(task, registry["refund"], 5, state="COMMITTED", start=300)
    small, response = statements(client, "/queues/counts/", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert body.lstrip().startswith('<ul id="queue-nav"') and "<html" not in body
    assert '<span class="count" data-queue="unknown">7</span>' in body  # UNKNOWN and STILL_UNKNOWN
    assert '<span class="count" data-queue="human-review">2</span>' in body
    assert 'hx-get="/queues/counts/" hx-trigger="every 5s"' in body  # it keeps refreshing itself

    _bulk_calls(task, registry["refund"], 500, state="UNKNOWN", start=1000)
    big, response = statements(client, "/queues/counts/", HTTP_HX_REQUEST="true")
    assert '<span class="count" data-queue="unknown">507</span>' in response.content.decode()
    assert small == big


def test_a_full_page_shows_the_same_counts_as_the_partial(people, registry, task):
    _bulk_calls(task, registry["refund"], 3, state="HUMAN_REVIEW")
    body = signed_in(people, VIEWER).get("/queues/unknown/").content.decode()
    assert '<span class="count" data-queue="human-review">3</span>' in body
    assert '<span class="count" data-queue="unknown">0</span>' in body


# ---------------------------------------------------------------------------------------------------------------
# The machine API keeps its token authentication
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", [VIEWER, REVIEWER, ADMIN])
def test_a_console_session_does_not_open_the_api(people, make_call, who):
    call = make_call("UNKNOWN")
    client = signed_in(people, who)
    for method, path in [
        ("get", "/api/v1/tasks"),
        ("get", f"/api/v1/tasks/{call.task_id}"),
        ("get", f"/api/v1/calls/{call.pk}"),
        ("post", f"/api/v1/calls/{call.pk}/reconcile"),
        ("post", f"/api/v1/calls/{call.pk}/abandon"),
    ]:
        response = getattr(client, method)(path, content_type="application/json")
        assert response.status_code == 401, (who, path, response.status_code)
        assert response.json()["error"]["code"] == "unauthenticated", path
    assert Call.objects.get(pk=call.pk).state == "UNKNOWN"


def test_the_admin_login_is_throttled_like_the_console_sign_in(people, settings):
    settings.RECOVERY_SIGN_IN_MAX_FAILURES = 3
    client = Client()
    for _ in range(3):
        client.post("/admin/login/", {"username": ADMIN, "password": "wrong", "next": "/admin/"})
    blocked = client.post("/admin/login/", {"username": ADMIN, "password": PASSWORD, "next": "/admin/"})
    assert "_auth_user_id" not in client.session, "signed in after 3 failures: the admin login is not throttled"
    assert "Too many failed sign-ins" in blocked.content.decode()

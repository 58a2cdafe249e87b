"""The audit trail's console pages (docs/design/audit.md): who may search, export and verify; filters that narrow as the
database says; keyset pages at a fixed number of statements; exports an auditor can re-verify from the file alone;
CSV cells that cannot run as spreadsheet formulas; and the recorded chain check, intact and tampered.

The trail is written by the real services (task_create, transition_call, claims, users); a few events are appended
through recovery.audit.chain directly where a test needs a shape no service writes (a hostile actor label, many events).
"""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recovery.audit.chain import Actor, append_event, audit_maintenance, event_hash, verify_all
from recovery.models import ActorKind, ApiToken, AuditEvent
from recovery.models.roles import ADMIN, APPROVER, REVIEWER, VIEWER
from recovery.selectors.audit import AuditFilters, audit_export_rows
from recovery.services.audit_checks import audit_verify
from recovery.services.claims import call_claim, call_release
from recovery.services.tasks import task_create
from recovery.services.users import user_save_with_roles
from recovery.statemachine.transitions import transition_call
from tests.console import (
    HOSTILE_IMG,
    HOSTILE_SCRIPT,
    NO_ROLE,
    PASSWORD,
    SIGNED_OUT,
    page_text,
    signed_in,
    statements,
)

HASHED = (
    "seq", "chain", "chain_seq", "prev_hash", "task_id", "call_id", "actor_kind", "actor_label", "actor_user_id",
    "actor_token_id", "action", "from_state", "to_state", "reason", "evidence", "created_at",
)  # fmt: skip
COLUMNS = ("id", "prev_id", "hash", *HASHED)


@pytest.fixture
def history(people, registry, make_call):
    """Two tasks' chains written by the services (an agent token, a sweeper job, a reviewer), after the user events
    the people fixture wrote to the system chain."""
    token = ApiToken.objects.create(name="runtime-1", prefix="rc_abc", digest="0" * 64)
    agent, sweeper = Actor.for_token(token), Actor.job("sweeper")
    reviewer = people[REVIEWER]
    first, _ = task_create(
        tenant=registry["tenant"], external_id="order-1", agent="demo", goal="refund order 1", budget={}, actor=agent
    )
    second, _ = task_create(
        tenant=registry["tenant"], external_id="order-2", agent="demo", goal="refund order 2", budget={}, actor=agent
    )
    a, b = make_call("READY", on_task=first), make_call("READY", on_task=second)
    transition_call(a, "SENT", actor=agent, reason="admitted by the gate", evidence={"attempt": 1, "amount": 800.0})
    transition_call(b, "SENT", actor=agent, reason="admitted by the gate", evidence={"attempt": 1})
    transition_call(a, "UNKNOWN", actor=sweeper, reason="no outcome within 30 s")
    call_claim(call_id=a.pk, user=reviewer, actor=Actor.for_user(reviewer))
    transition_call(b, "COMMITTED", actor=agent, reason="provider said settled", evidence={"ref": "re_1"})
    call_release(call_id=a.pk, user=reviewer, actor=Actor.for_user(reviewer))
    return {"tasks": (first, second), "calls": (a, b), "token": token}


def _everything() -> list[dict]:
    return list(AuditEvent.objects.order_by("seq").values(*COLUMNS))


def _shown_seqs(response) -> list[int]:
    return [row["seq"] for row in response.context["rows"]]


# ---------------------------------------------------------------------------------------------------------------
# Who may do what
# ---------------------------------------------------------------------------------------------------------------

READERS = (VIEWER, REVIEWER, APPROVER)


@pytest.mark.parametrize("who", (SIGNED_OUT, NO_ROLE, *READERS, ADMIN))
def test_each_role_searches_exports_and_verifies_as_allowed(people, history, who):
    urls = [
        ("GET", "/audit/?action=call."),
        ("GET", "/audit/export/?format=jsonl"),
        ("GET", "/audit/export/?task=1&format=csv"),
        ("POST", "/audit/verify/"),
    ]
    want = {
        SIGNED_OUT: ["sign-in"] * 4,
        NO_ROLE: [403] * 4,
        ADMIN: [200, 200, 200, "->/audit/"],
    }.get(who, [200, 200, 200, 403])
    got = []
    for method, url in urls:
        response = signed_in(people, who).get(url) if method == "GET" else signed_in(people, who).post(url, {})
        if response.status_code == 302 and response["Location"] == f"/sign-in/?next={quote(url, safe='/')}":
            got.append("sign-in")
        elif response.status_code == 302:
            got.append(f"->{response['Location']}")
        else:
            got.append(response.status_code)
    assert got == want, who
    # Only the admin's check reached the trail, and it was recorded as the admin's.
    checks = list(AuditEvent.objects.filter(action="audit.verified").values_list("actor_label", flat=True))
    assert checks == (["user:admin"] if who == ADMIN else [])


@pytest.mark.parametrize("who", [*READERS, ADMIN])
def test_the_verify_button_is_only_offered_to_admins(people, history, who):
    body = signed_in(people, who).get("/audit/").content.decode()
    assert ('action="/audit/verify/"' in body) == (who == ADMIN), who
    assert ("Verify chain" in body) == (who == ADMIN), who
    assert 'href="/audit/export/?format=jsonl"' in body and 'href="/audit/export/?format=csv"' in body


def test_the_audit_urls_answer_only_their_method(people, db):
    admin = signed_in(people, ADMIN)
    assert admin.get("/audit/verify/").status_code == 405  # a check writes an event: POST only
    assert admin.post("/audit/").status_code == 405
    assert admin.post("/audit/export/").status_code == 405
    assert not AuditEvent.objects.filter(action="audit.verified").exists()


# ---------------------------------------------------------------------------------------------------------------
# Search: filters narrow as the database says, newest first
# ---------------------------------------------------------------------------------------------------------------


def _filters(history, people) -> list[tuple[str, object]]:
    (first, second), (a, b) = history["tasks"], history["calls"]
    me, moved = people[REVIEWER].pk, "call.transition"
    return [
        ("", lambda e: True),
        ("actor=user:reviewer", lambda e: e["actor_label"] == "user:reviewer"),
        ("actor=token:*", lambda e: e["actor_label"].startswith("token:")),
        ("actor=user:review", lambda e: e["actor_label"] == "user:review"),  # exact: no partial match
        ("kind=job", lambda e: e["actor_kind"] == "job"),
        ("kind=system", lambda e: e["actor_kind"] == "system"),
        ("action=call.claimed", lambda e: e["action"] == "call.claimed"),
        ("action=call.", lambda e: e["action"].startswith("call.")),
        ("action=task.*", lambda e: e["action"].startswith("task.")),
        (f"task={first.pk}", lambda e: e["task_id"] == first.pk),
        (f"call={b.pk}", lambda e: e["call_id"] == b.pk),
        (f"task={second.pk}&action=call.transition", lambda e: (e["task_id"], e["action"]) == (second.pk, moved)),
        (f"call={a.pk}&actor=user:reviewer&kind=user", lambda e: (e["call_id"], e["actor_user_id"]) == (a.pk, me)),
        (f"task={first.pk}&call={b.pk}", lambda e: False),  # the call is on the other task
        ("task=999999", lambda e: False),
    ]  # fmt: skip


def test_each_filter_narrows_the_events_as_the_database_says(people, history):
    client = signed_in(people, VIEWER)
    everything = _everything()
    assert len(everything) > 10 and {e["actor_kind"] for e in everything} == set(ActorKind.values)
    for query, keep in _filters(history, people):
        response = client.get(f"/audit/?{query}")
        assert response.status_code == 200, query
        want = [e["seq"] for e in reversed(everything) if keep(e)]
        assert _shown_seqs(response) == want, query
        if query and want:
            assert len(want) < len(everything), f"{query} narrowed nothing: not a test of the filter"


def test_the_time_range_keeps_the_events_between_from_and_to(people, registry, monkeypatch):
    """From is inclusive; To includes the whole unit written (a day, a minute, a second)."""
    day = datetime(2025, 1, 31, tzinfo=UTC)
    moments = [
        day - timedelta(microseconds=1),
        day,
        day + timedelta(hours=14),
        day + timedelta(hours=14, seconds=59, microseconds=999_999),
        day + timedelta(hours=14, minutes=1),
        day + timedelta(days=1) - timedelta(microseconds=1),
        day + timedelta(days=1),
    ]
    for i, moment in enumerate(moments):
        monkeypatch.setattr(timezone, "now", lambda moment=moment: moment)
        with transaction.atomic():
            append_event(action="test.moment", actor=Actor.job("clock"), reason=f"m{i}")
    monkeypatch.undo()
    client = signed_in(people, VIEWER)

    def shown(query: str) -> list[str]:
        response = client.get(f"/audit/?action=test.moment&{query}")
        assert response.status_code == 200, query
        return sorted(row["reason"] for row in response.context["rows"])

    assert shown("from=2025-01-31&to=2025-01-31") == ["m1", "m2", "m3", "m4", "m5"]
    assert shown("from=2025-01-31T14:00&to=2025-01-31 14:00") == ["m2", "m3"]
    assert shown("from=2025-01-31T14:00:00Z&to=2025-01-31T14:00:59") == ["m2", "m3"]
    assert shown("to=2025-01-31T16:00%2B02:00") == ["m0", "m1", "m2", "m3"]  # an offset: up to 14:00:59 UTC
    assert shown("from=2025-02-01") == ["m6"]


def test_a_task_filter_offers_exports_of_that_task_and_a_chain_check_of_it(people, history):
    first = history["tasks"][0]
    body = signed_in(people, ADMIN).get(f"/audit/?task={first.pk}").content.decode()
    assert f'href="/audit/export/?task={first.pk}&amp;format=jsonl"' in body
    assert f'href="/audit/export/?task={first.pk}&amp;format=csv"' in body
    assert f'<input type="hidden" name="task" value="{first.pk}">' in body
    assert f'value="/audit/?task={first.pk}"' in body  # the check comes back to this search
    assert '<a href="/audit/">Clear</a>' in body


def test_bad_filters_get_field_errors_and_nothing_else_happens(people, history):
    client = signed_in(people, ADMIN)
    before = AuditEvent.objects.count()
    response = client.get("/audit/?task=abc&call=-3&from=yesterday&kind=robot&before=x&actor=user:admin")
    assert response.status_code == 400
    body = response.content.decode()
    for field, message in [
        ("task", "Enter the id as a whole number"),
        ("call", "Ids start at 1."),
        ("from", "Not a date or time"),
        ("kind", "Select a valid choice"),
    ]:
        assert f'id="id_{field}-error">{message}' in body, field
        control = body.split(f'id="id_{field}"', 1)[1].split(">", 1)[0]  # the field's own tag
        assert 'aria-invalid="true"' in control and f'id_{field}-error"' in control, field
    assert "Page position:" in body
    assert 'value="user:admin"' in body  # what was typed is kept to be corrected
    assert response.context["rows"] == [] and "Fix the filters above." in body
    assert "/audit/export/" not in body  # nothing to export from a bad search

    later_than = client.get("/audit/?from=2025-02-01&to=2025-01-31")
    assert later_than.status_code == 400 and "must be later than" in later_than.content.decode()

    exports = ["/audit/export/?format=xml", "/audit/export/?task=1.5e3&format=csv", "/audit/export/?to=31/01/2025"]
    exports += ["/audit/export/?actor=a%00b", "/audit/export/?call=99999999999999999999"]  # a NUL, a huge id
    for export in exports:
        refused = client.get(export)
        assert refused.status_code == 400, export
        assert not refused.streaming and "Content-Disposition" not in refused, export
        assert refused["Content-Type"].startswith("text/html"), export
    assert "Export as jsonl or csv." in client.get("/audit/export/?format=xml").content.decode()
    assert AuditEvent.objects.count() == before  # nothing recorded, nothing changed


# ---------------------------------------------------------------------------------------------------------------
# Keyset pages: a fixed number of statements, first page or deep
# ---------------------------------------------------------------------------------------------------------------


def _append_many(n: int, task=None) -> None:
    with transaction.atomic():
        for i in range(n):
            append_event(
                action="test.bulk" if i % 3 else "test.other",
                actor=Actor.job(f"bulk-{i % 2}"),
                task_id=task.pk if task else None,
                reason=f"bulk {i}",
                evidence={"i": i},
            )


@pytest.mark.parametrize("query", ["", "action=test.bulk", "actor=job:bulk-1&kind=job", "task={task}", "action=test."])
def test_a_page_runs_the_same_statements_for_10_or_800_events_and_deep_pages(people, task, query):
    client = signed_in(people, VIEWER)
    url = f"/audit/?{query.format(task=task.pk)}"
    _append_many(10, task)
    small, first = statements(client, url)
    assert first.context["older_url"] == ""

    _append_many(800, task)  # enough for 7 full pages of each filter (the actor matches half of them)
    big, first = statements(client, url)
    assert len(first.context["rows"]) == 50
    deep_url = url
    seen = []
    for _ in range(6):  # down to the 7th page
        page = client.get(deep_url)
        seen += _shown_seqs(page)
        deep_url = page.context["older_url"]
        assert "before=" in deep_url
    deep, deep_page = statements(client, deep_url)
    assert small == big == deep, (small, big, deep)
    assert len(deep_page.context["rows"]) == 50
    # Pages follow one another with nothing skipped or repeated, newest first.
    seen += _shown_seqs(deep_page)
    assert seen == sorted(seen, reverse=True) and len(seen) == len(set(seen)) == 350
    newest = deep_page.context["newest_url"]
    assert newest.startswith("/audit/?") and _shown_seqs(client.get(newest)) == _shown_seqs(first)


def test_an_htmx_request_gets_only_the_results_region(people, history):
    response = signed_in(people, VIEWER).get("/audit/?action=call.claimed", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200 and body.lstrip().startswith('<div id="audit-results">')
    assert "<html" not in body and "call.claimed" in body and "<form" not in body


def test_walking_every_page_lists_each_matching_event_once(people, task):
    _append_many(130, task)
    client = signed_in(people, VIEWER)
    url, seen = "/audit/?action=test.bulk", []
    while url:
        page = client.get(url)
        seen += _shown_seqs(page)
        url = page.context["older_url"]
    want = list(AuditEvent.objects.filter(action="test.bulk").order_by("-seq").values_list("seq", flat=True))
    assert seen == want and len(want) == 86


# ---------------------------------------------------------------------------------------------------------------
# Names, not ids: what each event is about, and the pages it opens
# ---------------------------------------------------------------------------------------------------------------


def _cell(body: str, seq: int, css: str) -> str:
    row = body.split(f'<tr id="event-{seq}"', 1)[1].split("</tr>", 1)[0]
    return row.split(f'class="{css}">', 1)[1].split("</td>", 1)[0]


def test_each_row_names_its_call_task_and_actor_with_links(people, history):
    (first, _), (a, _) = history["tasks"], history["calls"]
    body = signed_in(people, VIEWER).get(f"/audit/?call={a.pk}").content.decode()
    moves = AuditEvent.objects.filter(call=a, action="call.transition").order_by("seq")
    sent, unknown = moves[0], moves[1]
    claimed = AuditEvent.objects.get(call=a, action="call.claimed")

    call = _cell(body, sent.seq, "call")
    assert call.startswith(f'<a href="/calls/{a.pk}/">call {a.pk}</a> · <span class="tool">refund.create</span>')
    assert f'<code class="key">{a.idempotency_key}</code>' in call
    task = _cell(body, sent.seq, "task")
    assert f'<a href="/tasks/{first.pk}/">order-1</a>' in task and f"#{first.pk} · demo" in task
    by = {seq: page_text(_cell(body, seq, "by")) for seq in (sent.seq, unknown.seq, claimed.seq)}
    assert by == {sent.seq: "runtime-1 agent token", unknown.seq: "sweeper job", claimed.seq: "reviewer person"}
    # Each actor's name is a search for every event by them.
    assert 'href="?actor=token%3Aruntime-1"' in _cell(body, sent.seq, "by")
    assert 'href="?actor=user%3Areviewer"' in _cell(body, claimed.seq, "by")
    assert [r["seq"] for r in signed_in(people, VIEWER).get("/audit/?actor=job%3Asweeper").context["rows"]] == [
        unknown.seq
    ]


def test_an_event_links_the_action_request_bulk_or_breaker_operation_it_names(people, task, make_call):
    call = make_call("HUMAN_REVIEW")
    reviewer = Actor.job("t")
    with transaction.atomic():
        requested = append_event(
            action="action.requested", actor=reviewer, task_id=task.pk, call_id=call.pk,
            evidence={"request": 12, "action": "replay", "plan_hash": "h", "call_version": 3},
        )  # fmt: skip
        executed = append_event(
            action="call.transition", actor=reviewer, task_id=task.pk, call_id=call.pk,
            evidence=["action_request:12", "receipt:4"],
        )  # fmt: skip
        bulk = append_event(action="bulk.approved", actor=reviewer, evidence={"bulk": 3, "action": "escalate"})
        operation = append_event(
            action="breaker.forced_open", actor=reviewer, evidence={"tool": "refund.create", "breaker_operation": 5}
        )
        other = append_event(action="test.other", actor=reviewer, evidence={"request": 9, "bulk": "3"})
    body = signed_in(people, VIEWER).get("/audit/").content.decode()

    def links(event) -> list[str]:
        row = body.split(f'<tr id="event-{event.seq}"', 1)[1].split("</tr>", 1)[0]
        return re.findall(r'<a class="subject" href="([^"]+)">([^<]+)</a>', row)

    assert links(requested) == [("/actions/12/", "action request 12 · replay")]
    assert links(executed) == [("/actions/12/", "action request 12")]
    assert links(bulk) == [("/bulk/3/", "bulk action 3 · escalate")]
    assert links(operation) == [("/operations/breaker-operations/5/", "breaker operation 5")]
    assert links(other) == []  # "request" names an action request only on its own steps; "3" is not an id


def test_the_page_says_which_stretch_of_the_trail_it_shows(people, task):
    _append_many(120, task)
    client = signed_in(people, VIEWER)
    seqs = list(AuditEvent.objects.filter(task=task).order_by("-seq").values_list("seq", flat=True))
    first = client.get(f"/audit/?task={task.pk}")
    shown = page_text(first.content.decode().split('id="audit-range">', 1)[1].split("</p>", 1)[0])
    assert shown.startswith(f"50 events (the newest), newest first: seq {seqs[0]:,} to {seqs[49]:,}, ")
    assert shown.count(" UTC") == 2 and " back to " in shown
    second = client.get(first.context["older_url"]).content.decode()
    shown = page_text(second.split('id="audit-range">', 1)[1].split("</p>", 1)[0])
    assert shown.startswith(f"50 events, newest first: seq {seqs[50]:,} to {seqs[99]:,}, ")
    last = client.get(client.get(first.context["older_url"]).context["older_url"]).content.decode()
    assert f"20 events (the oldest), newest first: seq {seqs[100]:,} to {seqs[119]:,}" in page_text(last)
    few = signed_in(people, VIEWER).get("/audit/?action=test.other&task=999999").content.decode()
    assert 'id="audit-range"' not in few and "No events match these filters." in page_text(few)


def test_newer_older_and_newest_walk_every_event_once_each_way(people, task):
    _append_many(127, task)
    _append_many(9)  # other events between: the filter keeps them out
    client = signed_in(people, VIEWER)
    want = list(AuditEvent.objects.filter(task=task).order_by("-seq").values_list("seq", flat=True))
    start = f"/audit/?task={task.pk}&actor=job:*"
    first = client.get(start)
    assert first.context["newer_url"] == "" and first.context["newest_url"] == ""
    pages, url = [], start
    while url:  # down, Older after Older
        page = client.get(url)
        pages.append(_shown_seqs(page))
        url = page.context["older_url"]
        if url:
            assert f"task={task.pk}" in url and "actor=job%3A%2A" in url and "before=" in url and "after=" not in url
    assert [len(p) for p in pages] == [50, 50, 27]
    assert [seq for p in pages for seq in p] == want  # every event once, newest first

    bottom = page  # the oldest page, reached by Older
    back, url = [_shown_seqs(bottom)], bottom.context["newer_url"]
    while url:  # and up again, Newer after Newer: the same pages, by key
        assert "after=" in url and "before=" not in url and f"task={task.pk}" in url and "actor=job%3A%2A" in url
        page = client.get(url)
        back.append(_shown_seqs(page))
        url = page.context["newer_url"]
    assert back == pages[::-1]  # every event once more, the pages as they were on the way down
    assert page.context["newest_url"] and _shown_seqs(client.get(page.context["newest_url"])) == pages[0]
    # From a page reached going up, Older goes down again to the page below it.
    middle = client.get(bottom.context["newer_url"])
    assert _shown_seqs(middle) == pages[1] and _shown_seqs(client.get(middle.context["older_url"])) == pages[2]


def test_a_page_names_its_rows_in_the_same_statements_for_few_or_many(people, registry, make_call):
    """Every row on a different task, call, tool, user and token: the names come with the page's one statement."""
    client = signed_in(people, VIEWER)

    def events(n: int) -> None:
        for i in range(n):
            token = ApiToken.objects.create(name=f"runtime-{i}-{n}", prefix=f"rc_{i}_{n}", digest=f"{i}-{n}".ljust(64))
            task, _ = task_create(
                tenant=registry["tenant"], external_id=f"t-{i}-{n}", agent="demo", goal="g", budget={},
                actor=Actor.for_token(token),
            )  # fmt: skip
            call = make_call("READY", on_task=task, tool=registry["lookup"] if i % 2 else registry["refund"])
            user, _ = user_save_with_roles(
                username=f"u-{i}-{n}", roles=[REVIEWER], password=PASSWORD, actor=Actor.system("t")
            )
            call_claim(call_id=call.pk, user=user, actor=Actor.for_user(user))

    events(2)
    client.get("/audit/")
    few, _ = statements(client, "/audit/")
    events(30)
    many, page = statements(client, "/audit/")
    assert len(page.context["rows"]) == 50 and few == many, (few, many)
    named = [row for row in page.context["rows"] if row["action"] == "call.claimed"]
    assert len(named) >= 10 and all(row["call__tool__name"] and row["task__external_id"] for row in named)
    assert all(row["actor_name"] == row["actor_user__username"] for row in named)
    newer, upwards = statements(client, f"/audit/?after={page.context['rows'][-1]['seq']}")
    assert newer == few and len(upwards.context["rows"]) == 49  # a page read upwards costs the same


# ---------------------------------------------------------------------------------------------------------------
# Exports: parse back, match the database, re-verify from the file alone
# ---------------------------------------------------------------------------------------------------------------


def _download(client: Client, url: str):
    response = client.get(url)
    assert response.status_code == 200, url
    assert response.streaming  # streamed, never built whole in memory
    return response, b"".join(response.streaming_content).decode()


def _jsonl(client: Client, url: str) -> list[dict]:
    response, text = _download(client, url)
    assert response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def _undo_csv(cell: str) -> str:
    """The documented rule: drop one leading apostrophe."""
    return cell[1:] if cell.startswith("'") else cell


def _csv(client: Client, url: str) -> list[dict]:
    response, text = _download(client, url)
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    return list(csv.DictReader(io.StringIO(text, newline="")))


def _as_stored(event: dict) -> dict:
    """A database row as the export writes it."""
    return event | {"created_at": event["created_at"].astimezone(UTC).isoformat(timespec="microseconds")}


def _from_csv(row: dict) -> dict:
    """A CSV row back into the export's values: empty is None, ids are numbers, evidence is JSON."""
    numbers = {"id", "seq", "chain_seq", "prev_id", "task_id", "call_id", "actor_user_id", "actor_token_id"}
    back = {}
    for column, cell in row.items():
        cell = _undo_csv(cell)
        if column in numbers:
            back[column] = int(cell) if cell else None
        elif column == "evidence":
            back[column] = json.loads(cell)
        else:
            back[column] = cell
    return back


def _rehash(row: dict) -> str:
    fields = {name: row[name] for name in HASHED}
    return event_hash(**fields | {"created_at": datetime.fromisoformat(row["created_at"])})


@pytest.mark.parametrize(
    "query",
    ["", "action=call.&kind=token", "task={first}", "actor=user:*&from=2000-01-01"],
    ids=["whole-trail", "filtered", "one-task", "actor-prefix-and-time"],
)
def test_exports_match_the_database_row_for_row(people, history, query):
    first = history["tasks"][0]
    query = query.format(first=first.pk)
    client = signed_in(people, VIEWER)
    search = client.get(f"/audit/?{query}")
    want = sorted(
        (_as_stored(e) for e in _everything() if e["seq"] in set(_shown_seqs(search))), key=lambda e: e["seq"]
    )
    assert want, "the filter must match something"

    lines = _jsonl(client, f"/audit/export/?{query}&format=jsonl")
    assert [row["seq"] for row in lines] == [e["seq"] for e in want]  # oldest first
    assert lines == want  # every field, as stored
    assert list(lines[0]) == ["seq", "chain", "chain_seq", "id", "prev_id", "prev_hash", "hash", "task_id", "call_id",
                              "actor_kind", "actor_label", "actor_user_id", "actor_token_id", "action", "from_state",
                              "to_state", "reason", "evidence", "created_at"]  # fmt: skip

    rows = _csv(client, f"/audit/export/?{query}&format=csv")
    assert [_from_csv(row) for row in rows] == want


def test_an_auditor_reverifies_a_task_export_from_the_file_alone(people, history):
    """Every line's hash recomputes from the line; each line links to the one before; the chain starts at #1."""
    first = history["tasks"][0]
    lines = _jsonl(signed_in(people, VIEWER), f"/audit/export/?task={first.pk}")  # JSON lines by default
    assert len(lines) == AuditEvent.objects.filter(task=first).count() >= 5
    assert {row["chain"] for row in lines} == {f"task:{first.pk}"}
    assert [row["chain_seq"] for row in lines] == list(range(1, len(lines) + 1))
    previous = {"hash": "", "id": None}
    for row in lines:
        assert _rehash(row) == row["hash"], row["seq"]
        assert (row["prev_hash"], row["prev_id"]) == (previous["hash"], previous["id"]), row["seq"]
        previous = row
    # The amount written as 800.0 was stored (and hashed) as 800, and reads back so from the file.
    sent = next(row for row in lines if row["to_state"] == "SENT")
    assert sent["evidence"] == {"attempt": 1, "amount": 800} and type(sent["evidence"]["amount"]) is int


def test_every_line_of_a_whole_trail_export_rehashes_and_a_forged_line_does_not(people, history):
    lines = _jsonl(signed_in(people, VIEWER), "/audit/export/")
    assert len(lines) == AuditEvent.objects.count()
    assert all(_rehash(row) == row["hash"] for row in lines)
    forged = lines[3] | {"reason": "nothing happened"}
    assert _rehash(forged) != forged["hash"]


def test_the_export_names_its_file_after_what_it_holds(people, history):
    first = history["tasks"][0]
    client = signed_in(people, VIEWER)
    cases = [
        (f"/audit/export/?task={first.pk}&format=jsonl", rf"audit-task-{first.pk}-\d{{8}}T\d{{6}}Z\.jsonl"),
        (
            f"/audit/export/?task={first.pk}&action=call.&format=csv",
            rf"audit-task-{first.pk}-filtered-\d{{8}}T\d{{6}}Z\.csv",
        ),
        ("/audit/export/?format=csv", r"audit-trail-\d{8}T\d{6}Z\.csv"),
    ]
    for url, name in cases:
        response, _ = _download(client, url)
        assert re.fullmatch(f'attachment; filename="{name}"', response["Content-Disposition"]), url
        assert "no-store" in response["Cache-Control"]


@pytest.mark.parametrize("chunk_size", [1, 7, 13, 2000])
def test_export_rows_stream_in_chunks_without_skipping_or_repeating(people, task, chunk_size):
    _append_many(26, task)
    want = list(AuditEvent.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
    rows = audit_export_rows(AuditFilters(task_id=task.pk), chunk_size=chunk_size)
    with CaptureQueriesContext(connection) as captured:
        first = next(rows)
    assert len(captured) == 1  # the first chunk only: nothing more is read before it is sent
    assert [first["seq"], *(row["seq"] for row in rows)] == want
    assert len(want) == 26


# ---------------------------------------------------------------------------------------------------------------
# CSV formula injection
# ---------------------------------------------------------------------------------------------------------------


def test_csv_cells_cannot_run_as_spreadsheet_formulas(people, registry):
    agent = Actor(kind=ActorKind.TOKEN, label='=HYPERLINK("http://evil.example","click")')
    hostile_goals = [
        "=cmd|' /C calc'!A0",
        "+1+cmd|' /C calc'!A0",
        "-2+3",
        "@SUM(1,1)",
        "\t=1+1",
        "\r=1+1",
        "'=already quoted",
        "plain goal",
    ]
    for i, goal in enumerate(hostile_goals):
        task_create(tenant=registry["tenant"], external_id=f"t{i}", agent="x", goal=goal, budget={}, actor=agent)
    rows = _csv(signed_in(people, VIEWER), "/audit/export/?action=task.created&format=csv")
    assert len(rows) == len(hostile_goals)
    for row, goal in zip(rows, hostile_goals, strict=True):
        assert row["actor_label"].startswith("'=HYPERLINK(")
        if goal == "plain goal":
            assert row["reason"] == goal
        else:
            assert row["reason"] == "'" + goal  # starts with an apostrophe: text, not a formula
        assert _undo_csv(row["reason"]) == goal and _undo_csv(row["actor_label"]) == agent.label
        assert row["evidence"].startswith("{") and json.loads(row["evidence"])["external_id"].startswith("t")


# ---------------------------------------------------------------------------------------------------------------
# Verifying the chain
# ---------------------------------------------------------------------------------------------------------------


def test_an_admin_verifies_an_intact_trail_and_the_check_is_recorded(people, history):
    client = signed_in(people, ADMIN)
    events = AuditEvent.objects.count()
    response = client.post("/audit/verify/", {"next": "/audit/?action=call."}, follow=True)
    assert response.redirect_chain == [("/audit/?action=call.", 302)]
    body = response.content.decode()
    assert f"The audit trail is intact: {events} events in 3 chains verified." in body
    record = AuditEvent.objects.get(action="audit.verified")
    assert (record.actor_kind, record.actor_label, record.actor_user_id) == ("user", "user:admin", people[ADMIN].pk)
    assert (record.chain, record.task_id) == ("system", None)
    assert record.evidence == {"scope": "all", "events": events, "chains": 3, "ok": True, "problem": None}
    assert verify_all().ok  # the record is itself chained


def test_an_admin_verifies_one_tasks_chain(people, history):
    first = history["tasks"][0]
    response = signed_in(people, ADMIN).post("/audit/verify/", {"task": str(first.pk)}, follow=True)
    length = AuditEvent.objects.filter(task=first).count()
    assert f"Task {first.pk}&#x27;s chain is intact: {length} events verified." in response.content.decode()
    record = AuditEvent.objects.get(action="audit.verified")
    assert record.evidence["scope"] == f"task:{first.pk}" and record.evidence["events"] == length


def test_verifying_a_task_without_events_says_so_rather_than_intact(people, history):
    response = signed_in(people, ADMIN).post("/audit/verify/", {"task": "999999"}, follow=True)
    shown = response.content.decode().split('<ul class="messages"', 1)[1].split("</ul>", 1)[0]
    assert "Task 999999 has no audit events: there was no chain to verify." in shown and "intact" not in shown


def test_a_tampered_event_is_reported_on_the_page(people, history):
    (a, _), (first, _) = history["calls"], history["tasks"]
    edited = AuditEvent.objects.get(call=a, to_state="UNKNOWN")
    with (
        transaction.atomic(),
        audit_maintenance(reason="test: tamper with an event", actor=Actor.system("t")),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE recovery_auditevent SET reason = %s WHERE id = %s", ["nothing happened", edited.pk])
    client = signed_in(people, ADMIN)
    for data in ({}, {"task": str(first.pk)}):
        response = client.post("/audit/verify/", data, follow=True)
        assert response.status_code == 200
        body = response.content.decode()
        assert "is BROKEN" in body and "intact" not in body
        assert f"chain task:{first.pk} event #{edited.chain_seq} (seq {edited.seq}) does not match its hash" in body
    records = AuditEvent.objects.filter(action="audit.verified").order_by("seq")
    assert [(r.evidence["scope"], r.evidence["ok"]) for r in records] == [("all", False), (f"task:{first.pk}", False)]
    assert "its content was edited" in records[0].evidence["problem"]


def test_verify_refuses_a_post_without_the_csrf_token(people, history):
    client = signed_in(people, ADMIN, enforce_csrf_checks=True)
    assert client.post("/audit/verify/").status_code == 403
    assert not AuditEvent.objects.filter(action="audit.verified").exists()
    page = client.get("/audit/").content.decode()
    token = page.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    assert client.post("/audit/verify/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert AuditEvent.objects.filter(action="audit.verified").count() == 1


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "1e3", "٣", str(2**63)])
def test_verify_refuses_a_bad_task_id_and_records_nothing(people, history, bad):
    response = signed_in(people, ADMIN).post("/audit/verify/", {"task": bad, "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == "/audit/"
    assert not AuditEvent.objects.filter(action="audit.verified").exists()


def test_the_service_refuses_an_unknown_scope(db):
    with pytest.raises(ValueError, match="scope"):
        audit_verify(scope="task:abc", actor=Actor.system("t"))
    assert not AuditEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_service_checks_outside_any_transaction_and_records_the_check(registry):
    """On its own (as a request runs it) the check takes one snapshot — REPEATABLE READ on PostgreSQL — and the
    record is appended afterwards in a transaction of its own."""
    user_save_with_roles(username="ops", roles=[ADMIN], password=PASSWORD, actor=Actor.system("t"))
    assert not connection.in_atomic_block
    report = audit_verify(scope="all", actor=Actor.job("nightly"))
    assert report.ok and report.events == 1
    record = AuditEvent.objects.get(action="audit.verified")
    assert (record.actor_label, record.evidence["events"], record.evidence["ok"]) == ("job:nightly", 1, True)
    assert audit_verify(scope="system", actor=Actor.job("nightly")).events == 2


# ---------------------------------------------------------------------------------------------------------------
# Untrusted text
# ---------------------------------------------------------------------------------------------------------------


def test_hostile_text_is_shown_as_text(people, task):
    with transaction.atomic():
        append_event(
            action="test.hostile",
            actor=Actor(kind=ActorKind.TOKEN, label=f"token:{HOSTILE_IMG}"),
            task_id=task.pk,
            reason=HOSTILE_SCRIPT,
            evidence={"html": HOSTILE_IMG, "quote": "\"'></pre></details><svg onload=window.__pwned=1>"},
        )
    body = signed_in(people, VIEWER).get("/audit/?action=test.hostile").content.decode()
    main = body.split('<main id="main"', 1)[1]
    assert "<script>window" not in main and "<img src=x" not in main and "<svg" not in main
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in main
    actor = main.split('class="actor"', 1)[1].split("</td>", 1)[0]  # the token's name, and a search by its label
    assert ">&lt;img src=x onerror=window.__pwned=1&gt;</a>" in actor and "agent token" in actor
    assert 'href="?actor=token%3A%3Cimg+src%3Dx+onerror%3Dwindow.__pwned%3D1%3E"' in main
    assert "&lt;/pre&gt;&lt;/details&gt;&lt;svg onload=window.__pwned=1&gt;" in main

"""The metrics page (docs/metrics.md): every figure as a reader reads it — its number, the line beneath, its breakdown,
its chart and table, its definition — for a small history the real services wrote and whose figures are worked out by
hand below; the filters (window, tool, tenant) and what a bad one does; hostile names; the statements it runs; who
may read it.

Calls are added, attempted and settled through the services (the helpers of tests/test_console_overview.py), the
clock moved back to place a story in the past. The page never folds: each test runs
recovery.services.metrics.metrics_fold() after writing its story, as the periodic job would.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta
from urllib.parse import urlencode

import pytest

from console.views.metrics import percent_text, seconds_text
from recovery.audit.chain import Actor
from recovery.models import Attempt, Call, MetricRollup, Provider, Task, Tenant, Tool
from recovery.models.roles import ROLES, VIEWER
from recovery.registry import load_registry
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.metrics import metrics_fold
from recovery.services.outcomes import attempt_report, facts_of
from recovery.services.tasks import task_create
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT, NO_ROLE, SIGNED_OUT, page_text, signed_in, statements
from tests.test_console_overview import (
    NO_REFERENCE,
    REGISTRY,
    REJECTED,
    RUNTIME,
    UNAVAILABLE,
    add_call,
    attempt,
    clock,
    settle,
    unknown,
)

URL = "/overview/metrics/"
READ_OK = {"connection_opened": True, "sent": True, "http_status": 200, "result": {"order": "O-1"}}
TWO_TENANTS = {**REGISTRY, "tenants": [{"name": "acme", "tools": "*"}, {"name": "globex", "tools": "*"}]}


def make_tasks() -> dict[str, Task]:
    """The overview tests' registry with a second tenant, and one task for each tenant."""
    load_registry(TWO_TENANTS, actor=Actor.system("tests"))
    tasks = {}
    for name in ("acme", "globex"):
        tasks[name], _ = task_create(
            tenant=Tenant.objects.get(name=name),
            external_id=f"{name}-ticket",
            agent="support-bot",
            goal="refunds",
            budget={"max_rounds": 500},
            actor=RUNTIME,
        )
    return tasks


@pytest.fixture
def tasks(db) -> dict[str, Task]:
    return make_tasks()


def retry_after_wait(call: Call, facts: dict) -> str:
    """A second attempt on the evidence that time has passed since a transient failure (docs/design/gate.md)."""
    call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
    request = AttemptRequest(attempt_id=f"att-{call.pk}-{call.attempts_count + 1}", evidence=("time_elapsed",))
    admitted = attempt_admit(call=call, request=request, actor=RUNTIME)
    assert admitted.status == 201, admitted.response
    call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
    row = Attempt.objects.select_related("tool").get(call=call, number=call.attempts_count)
    return attempt_report(call=call, attempt=row, facts=facts_of(facts), actor=RUNTIME)["call_state"]


@pytest.fixture
def story(tasks) -> dict[str, Call]:
    """A day of work, folded. acme: refund A timed out 2 h ago (UNKNOWN) and a status check found it committed 50
    minutes later; refund B timed out 30 min ago and is still UNKNOWN; email C was rejected (invalid arguments);
    lookup D (a read) hit a 503 20 min ago and committed on its retry. globex: refund E came back without its
    reference (invalid result) and went to human review."""
    acme, globex = tasks["acme"], tasks["globex"]
    a = unknown(acme, "refund.create", ago=timedelta(hours=2))
    with clock(timedelta(hours=1, minutes=10)):
        settle(a)
    b = unknown(acme, "refund.create", ago=timedelta(minutes=30))
    c = add_call(acme, "email.send")
    assert attempt(c, REJECTED) == "RETRYABLE"
    with clock(timedelta(minutes=20)):
        d = add_call(acme, "order.lookup")
        assert attempt(d, UNAVAILABLE) == "RETRYABLE"
    assert retry_after_wait(d, READ_OK) == "COMMITTED"
    e = add_call(globex, "refund.create")
    assert attempt(e, NO_REFERENCE) == "HUMAN_REVIEW"
    metrics_fold()
    return {"a": a, "b": b, "c": c, "d": d, "e": e}


def figure(body: str, key: str) -> str:
    """The markup of one figure's section."""
    start = body.index(f'data-figure="{key}"')
    return body[start : body.index("</section>", start)]


def shown(body: str, key: str) -> tuple[str, str, str]:
    """A figure as a reader reads it: (its data-value, its number, the line beneath it)."""
    markup = figure(body, key)
    found = re.search(r'<p class="figure-value" data-value="([^"]*)">(.*?)</p>', markup)
    detail = re.search(r'<p class="figure-detail">(.*?)</p>', markup)
    return found[1], page_text(found[2]), page_text(detail[1]) if detail else ""


def labels(body: str, key: str) -> dict[str, str]:
    """A figure's breakdown: label -> its count (or p95)."""
    markup = figure(body, key)
    return {
        page_text(name): page_text(n)
        for name, n in re.findall(r'<li data-label="[^"]*"><code>(.*?)</code> <span class="num">(.*?)</span>', markup)
    }


def every_figure(body: str) -> dict[str, tuple[str, str, str]]:
    return {
        key: shown(body, key) for key in re.findall(r'<section class="figure" id="[^"]+" data-figure="([^"]+)"', body)
    }


def get(people, url: str = URL, who: str = VIEWER) -> tuple[int, str]:
    response = signed_in(people, who).get(url)
    return response.status_code, response.content.decode()


# --- who may see it ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("who", "expected"), [(SIGNED_OUT, "sign-in"), (NO_ROLE, 403), *((r, 200) for r in ROLES)])
def test_every_role_reads_the_metrics_and_nobody_else(people, who, expected):
    response = signed_in(people, who).get(URL)
    if expected == "sign-in":
        assert response.status_code == 302 and response["Location"] == f"/sign-in/?next={URL}"
    else:
        assert response.status_code == expected


def test_it_is_in_the_navigation_right_after_the_overview(people, db):
    _, body = get(people)
    nav = body[body.index('<nav aria-label="Console">') : body.index("</nav>")]
    assert nav.index(">Overview</a>") < nav.index(">Metrics</a>") < nav.index('id="queue-nav"')
    assert f'<a href="{URL}" aria-current="page">Metrics</a>' in nav
    _, overview = get(people, "/overview/")
    assert f'<a href="{URL}">Metrics</a>' in overview  # current only on its own page


# --- the figures -------------------------------------------------------------------------------------------------


def test_it_shows_each_figure_as_worked_out_by_hand(people, story):
    status, body = get(people)
    assert status == 200
    # Attempts: A, B, C, E once each and D twice. Their outcomes: A and B UNKNOWN, C and D's first RETRYABLE, D's
    # second COMMITTED, E HUMAN_REVIEW.
    assert shown(body, "attempts") == ("6", "6", "")
    assert labels(body, "attempts") == {"unknown": "2", "retryable": "2", "committed": "1", "human_review": "1"}
    # Failed: A and B (timeouts: outcome unknown), C (rejected), D's first (503), E (no reference).
    assert shown(body, "failures") == ("5", "5", "")
    assert labels(body, "failures") == {
        "outcome_unknown": "2", "invalid_arguments": "1", "invalid_result": "1", "transient": "1",
    }  # fmt: skip
    # Writes: A, B, C, E (D is a read). A and B entered UNKNOWN: 2 of 4.
    assert shown(body, "unknown_outcome_rate") == ("0.5", "50 %", "2 of 4")
    # Of A and B, reconciliation settled A with nobody's help; B is still being checked: 1 of 2.
    assert shown(body, "reconcile_success_rate") == ("0.5", "50 %", "1 of 2")
    assert shown(body, "duplicate_effect_rate") == ("0", "0 %", "0 of 4")
    # Committed: A on its first attempt, D on its second: 1 retry over 2 calls.
    assert shown(body, "retries_per_success") == ("0.5", "0.5", "1 over 2")
    assert shown(body, "human_takeovers") == ("1", "1", "")  # E
    assert shown(body, "reconcile_checks") == ("1", "1", "")  # the status check that found A committed
    assert labels(body, "reconcile_checks") == {"committed": "1"}
    # One item left a queue: A waited 50 min in UNKNOWN, in the (30 min, 1 h] bucket. Interpolated in it, the
    # median is 30 + 30 x 0.5 = 45 min and the p95 30 + 30 x 0.95 = 58.5 min.
    assert shown(body, "time_to_resolution") == ("3510", "median 45 min · p95 58 min 30 s", "1 resolved")
    assert labels(body, "time_to_resolution") == {"UNKNOWN": "p95 58 min 30 s"}
    assert shown(body, "breaker_open_time") == ("0", "0 s", "opened 0 times")
    assert shown(body, "task_success_rate") == ("", "—", "0 of 0")  # no task submitted or abandoned: no share
    assert shown(body, "compensations") == ("0", "0", "") and shown(body, "probes") == ("0", "0", "")
    # The queues now: B in UNKNOWN, E in human review.
    for name, n in (("unknown", 1), ("human_review", 1), ("compensation", 0)):
        assert f'data-queue-size="{name}">{n}</span>' in body


def test_each_figure_has_a_chart_a_table_and_its_definition(people, story):
    _, body = get(people)
    keys = re.findall(r'<section class="figure" id="[^"]+" data-figure="([^"]+)"', body)
    assert len(keys) == 20 and len(set(keys)) == 20
    for key in keys:
        markup = figure(body, key)
        assert (
            '<svg class="metric-chart"' in markup and f'aria-labelledby="chart-{key}-title chart-{key}-desc"' in markup
        )
        assert markup.count('<tr><th scope="row">') == 24, key  # one row per hour of the window
        assert '<p class="figure-doc">' in markup and f'href="#{key}"' in body  # the contents link to it
    # Attempts per hour, in the chart and the table, as the attempts' own report times say.
    per_hour = Counter(
        at.replace(minute=0, second=0, microsecond=0) for at in Attempt.objects.values_list("reported_at", flat=True)
    )
    markup = figure(body, "attempts")
    table = page_text(markup[markup.index("<table") :])
    for hour, n in per_hour.items():
        assert f"{hour:%Y-%m-%d %H:%M} {n}" in table
        assert f"<title>{hour:%Y-%m-%d %H:%M} UTC: {n}</title>" in markup
    assert markup.count('<rect class="bar value"') == 24
    # A rate has a bar only where there is something to divide: the hours in which a write call first went out.
    firsts = Attempt.objects.filter(number=1, call__side_effect="write").values_list("reported_at", flat=True)
    cohorts = {at.replace(minute=0, second=0, microsecond=0) for at in firsts}
    assert figure(body, "unknown_outcome_rate").count('<rect class="bar value"') == len(cohorts)
    # The definition, with its code words as code.
    assert "<code>no_outcome</code> when none arrived" in figure(body, "attempts")
    main = body.split("<main", 1)[1]
    assert "style=" not in main and "<script" not in main


def test_it_says_how_fresh_the_figures_are(people, tasks):
    _, before = get(people)
    assert 'id="fold-status" data-folded-at=""' in before and "No fold has run yet" in page_text(before)
    assert shown(before, "attempts") == ("0", "0", "")

    unknown(tasks["acme"], "refund.create", ago=timedelta(minutes=5))
    _, unfolded = get(people)
    assert shown(unfolded, "attempts") == ("0", "0", "")  # the page never folds
    assert 'data-queue-size="unknown">1</span>' in unfolded  # the queues are read now, not from the rollups

    metrics_fold()
    _, after = get(people)
    assert shown(after, "attempts") == ("1", "1", "")
    folded_at = re.search(r'data-folded-at="([^"]+)"', after)[1]
    assert re.search(r"Figures as of \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(fold lag \d+(\.\d)? s\)", page_text(after))
    assert folded_at.startswith(re.search(r"Figures as of (\d{4}-\d\d-\d\d)", page_text(after))[1])


# --- the filters ---------------------------------------------------------------------------------------------------


def test_the_tool_filter_counts_that_tool_only(people, story):
    _, body = get(people, f"{URL}?tool=refund.create")
    # refund.create: A, B, E — all writes; A and B entered UNKNOWN.
    assert shown(body, "attempts") == ("3", "3", "")
    assert labels(body, "failures") == {"outcome_unknown": "2", "invalid_result": "1"}
    assert shown(body, "unknown_outcome_rate") == ("0.666667", "66.7 %", "2 of 3")
    assert shown(body, "retries_per_success") == ("0", "0", "0 over 1")  # A, on its first attempt
    assert "tool <code>refund.create</code>, every tenant." in body
    assert '<option value="refund.create" selected>refund.create</option>' in body
    # The queue tiles link to the queues with the same filter (the queue pages filter by id).
    refund = Tool.objects.get(name="refund.create")
    assert f'href="/queues/unknown/?tool={refund.pk}"' in body


def test_the_tenant_filter_counts_that_tenant_only(people, story):
    _, body = get(people, f"{URL}?tenant=globex")
    # globex: E alone — a write that never turned unknown, taken over by a person.
    assert shown(body, "attempts") == ("1", "1", "")
    assert shown(body, "unknown_outcome_rate") == ("0", "0 %", "0 of 1")
    assert shown(body, "human_takeovers") == ("1", "1", "")
    assert 'data-queue-size="unknown">0</span>' in body and 'data-queue-size="human_review">1</span>' in body
    assert "tenant <code>globex</code>" in body

    _, both = get(people, f"{URL}?tenant=acme&tool=order.lookup")
    assert shown(both, "attempts") == ("2", "2", "")  # D, twice
    assert shown(both, "retries_per_success") == ("1", "1", "1 over 1")
    assert shown(both, "unknown_outcome_rate") == ("", "—", "0 of 0")  # a read: no write to divide by


def test_the_window_filter_reaches_back_7_or_30_days(people, tasks):
    acme = tasks["acme"]
    unknown(acme, "refund.create", ago=timedelta(days=3))  # in the 7 and 30 days, not the 24 hours
    unknown(acme, "refund.create", ago=timedelta(days=10))  # in the 30 days only
    unknown(acme, "email.send", ago=timedelta(minutes=3))
    metrics_fold()

    _, day = get(people)
    _, week = get(people, f"{URL}?window=7d")
    _, month = get(people, f"{URL}?window=30d")
    assert shown(day, "unknown_outcome_rate")[1:] == ("100 %", "1 of 1")
    assert shown(week, "unknown_outcome_rate")[1:] == ("100 %", "2 of 2")
    assert shown(month, "unknown_outcome_rate")[1:] == ("100 %", "3 of 3")
    assert [shown(page, "attempts")[0] for page in (day, week, month)] == ["1", "2", "3"]
    # Each window's points: 24 hours, 28 quarters of a day, 30 days.
    for page, rows, step in ((day, 24, "hour"), (week, 28, "6 hours"), (month, 30, "day")):
        assert figure(page, "attempts").count('<tr><th scope="row">') == rows
        assert f"The numbers per {step}" in page
    assert "Recovery over the last 7 days (UTC, per 6 hours)" in page_text(week)
    assert '<option value="30d" selected>last 30 days</option>' in month


@pytest.mark.parametrize(
    ("query", "field", "message", "same_as"),
    [
        ("window=1y", "window", "Choose a window of 24 hours, 7 days or 30 days.", ""),
        ("tool=no.such.tool&window=7d", "tool", "No tool has that name", "window=7d"),
        ("tenant=initech&tool=refund.create", "tenant", "No tenant has that name", "tool=refund.create"),
        (f"tool={HOSTILE_SCRIPT}", "tool", "No tool has that name", ""),
    ],
)
def test_a_bad_filter_is_a_field_error_and_changes_nothing(people, story, query, field, message, same_as):
    status, body = get(people, f"{URL}?{query}")
    assert status == 400
    error = re.search(rf'<p class="error" id="id_{field}-error" data-error="{field}">(.*?)</p>', body)
    assert error and message in error[1]
    assert f'id="id_{field}" aria-invalid="true" aria-describedby="id_{field}-error"' in body
    # The bad filter alone is dropped: the figures are those of the good ones.
    _, expected = get(people, f"{URL}?{same_as}")
    assert every_figure(body) == every_figure(expected) and len(every_figure(body)) == 20
    assert HOSTILE_SCRIPT not in body


# --- hostile text and cost -----------------------------------------------------------------------------------------


def test_hostile_names_and_labels_are_shown_as_text(people, story):
    provider = Provider.objects.get(name="payments")
    tool = Tool.objects.create(name=HOSTILE_SCRIPT, provider=provider, side_effect="read")
    # A label is whatever the fold read from an event's evidence: one as hostile as it gets, in the tool's rollups.
    hour = int(story["e"].created_at.timestamp()) // 3600 * 3600
    MetricRollup.objects.create(
        period=3600, start=hour, tenant_id=0, tool_id=tool.pk, series="failures", label=HOSTILE_IMG, value=3
    )

    _, body = get(people, f"{URL}?{urlencode({'tool': HOSTILE_SCRIPT})}")
    assert HOSTILE_SCRIPT not in body and HOSTILE_IMG not in body
    escaped = "&lt;script&gt;window.__pwned=1&lt;/script&gt;"
    assert f'<option value="{escaped}" selected>{escaped}</option>' in body
    assert f"tool <code>{escaped}</code>" in body
    assert labels(body, "failures") == {HOSTILE_IMG: "3"}  # read back as text
    assert "&lt;img src=x onerror=window.__pwned=1&gt;" in figure(body, "failures")


def test_the_page_runs_the_same_statements_for_3_or_30_calls(people, tasks):
    client = signed_in(people, VIEWER)
    acme = tasks["acme"]
    for i in range(3):
        unknown(acme, "refund.create", ago=timedelta(hours=i, minutes=2))
    metrics_fold()
    few = [statements(client, url)[0] for url in (URL, f"{URL}?window=30d&tool=refund.create&tenant=acme")]

    for i in range(27):
        # Minutes apart, so that refund.create's breaker (2 calls in 60 s) never opens on them.
        tool = "refund.create" if i % 3 else "email.send"
        call = unknown(tasks["globex" if i % 2 else "acme"], tool, ago=timedelta(minutes=3 * i + 7))
        if i % 4 == 0:
            settle(call)
    metrics_fold()
    many = []
    for url in (URL, f"{URL}?window=30d&tool=refund.create&tenant=acme"):
        n, response = statements(client, url)
        many.append(n)
    assert few == many, (few, many)
    assert shown(response.content.decode(), "attempts")[0] != "3"  # the second reading did see more


# --- the helpers that write the numbers ---------------------------------------------------------------------------


def test_it_writes_shares_and_durations_as_a_reader_expects():
    assert [percent_text(x) for x in (0.125, 0.5, 2 / 3, 0, 1)] == ["12.5 %", "50 %", "66.7 %", "0 %", "100 %"]
    assert [seconds_text(s) for s in (0.4, 12, 59.94, 90, 3510, 7500, 3 * 86400 + 4 * 3600)] == [
        "0.4 s", "12 s", "59.9 s", "1 min 30 s", "58 min 30 s", "2 h 5 min", "3 d 4 h",
    ]  # fmt: skip

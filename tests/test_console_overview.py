"""The overview (docs/console.md): open items per queue and the oldest, SLA breaches per risk, open breakers, the day's
headline metrics, failures by class over the last day and the UNKNOWN flow chart — every number checked against
data the real services wrote.

The day's figures are read from the metrics rollups, which the page never folds: the tests that read them run
recovery.services.metrics.metrics_fold() after writing their story, as the periodic job would.

Calls are added, admitted and reported through recovery.services.calls, .attempts and .outcomes, settled by
recovery.services.reconcile and breakers opened by recovery.services.breakers / status_breakers. To place a story
in the past, the clock those services read (django.utils.timezone.now) is moved back while they run: what they
store is what they would have stored then. Only the statement-count test inserts plain rows in bulk, because it
needs many and not their story.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.utils import timezone

from console.charts import PLOT_H
from console.views.overview import flow_chart
from recovery.audit.chain import Actor
from recovery.engine.canonical import canonical_json
from recovery.models import Attempt, AuditEvent, Call, Provider, Step, Task, Tenant, Tool
from recovery.models.roles import ROLES, VIEWER
from recovery.providers.status import StatusAnswer
from recovery.registry import load_registry
from recovery.selectors.overview import HourFlow
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.breakers import breaker_record
from recovery.services.calls import call_add
from recovery.services.metrics import metrics_fold
from recovery.services.outcomes import attempt_report, facts_of
from recovery.services.reconcile import apply_answer
from recovery.services.status_breakers import status_breaker_record
from recovery.services.tasks import task_create
from recovery.statemachine.transitions import transition_call
from tests.console import HOSTILE_IMG, NO_ROLE, SIGNED_OUT, page_text, signed_in, statements

RUNTIME = Actor.system("tests-runtime")
SLA = {"high": 900, "low": 4 * 3600}
STATUS = {
    "method": "GET",
    "path": "/by-key/{idempotency_key}",
    "status_map": {"succeeded": "committed", "pending": "pending", "failed": "not_committed"},
}
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
            "status_query": STATUS,
            "budgets": {"max_attempts": 5},
            "breaker": {"window_s": 60, "bucket_s": 10, "min_calls": 2, "failure_rate": 0.5, "cooldown_s": 600},
        },
        {
            "name": "email.send",
            "provider": "payments",
            "side_effect": "write",
            "risk": "low",
            "request": {"method": "POST", "path": "/emails"},
            "args_schema": {"type": "object"},
            "status_query": STATUS,
            "budgets": {"max_attempts": 5},
        },
        {
            "name": "order.lookup",
            "provider": "payments",
            "side_effect": "read",
            "request": {"method": "GET", "path": "/orders"},
            "args_schema": {"type": "object"},
            "budgets": {"max_attempts": 5},
        },
    ],
}
TIMEOUT = {"connection_opened": True, "sent": True, "error": {"kind": "read_timeout", "message": "no reply"}}
UNAVAILABLE = {"connection_opened": True, "sent": True, "http_status": 503}
REJECTED = {"connection_opened": True, "sent": True, "http_status": 422, "error": {"code": "invalid_amount"}}
NO_REFERENCE = {"connection_opened": True, "sent": True, "http_status": 200, "result": {}}  # a hard stop
_n = iter(range(1, 1_000_000))


@contextmanager
def clock(ago: timedelta) -> Iterator[None]:
    """Run the services `ago` in the past: timezone.now() (which they read for state times and audit stamps)
    answers the real time minus `ago`."""
    real = timezone.now

    with mock.patch("django.utils.timezone.now", lambda: real() - ago):
        yield


@pytest.fixture
def world(db):
    return make_world()


def make_world() -> Task:
    """The registry above, and a support bot's task of tenant "acme" for the calls."""
    load_registry(REGISTRY, actor=Actor.system("tests"))
    task, _ = task_create(
        tenant=Tenant.objects.get(name="acme"),
        external_id="ticket-1",
        agent="support-bot",
        goal="refunds",
        budget={"max_rounds": 500},
        actor=RUNTIME,
    )
    return task


def add_call(task: Task, tool: str) -> Call:
    n = next(_n)
    added = call_add(
        task=task,
        step_index=1,
        depends_on=[],
        tool_name=tool,
        arguments={"order_id": f"O-{n}", "amount_cents": 100 + n},
        idempotency_key=f"{tool}-{n}",
        actor=RUNTIME,
    )
    return Call.objects.select_related("tool__provider", "task").get(pk=added.call.pk)


def attempt(call: Call, facts: dict) -> str:
    """Admit the call's next attempt and report `facts` as its outcome; the call's state afterwards."""
    call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
    admitted = attempt_admit(
        call=call, request=AttemptRequest(attempt_id=f"att-{call.pk}-{call.attempts_count + 1}"), actor=RUNTIME
    )
    assert admitted.status == 201, admitted.response
    call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
    row = Attempt.objects.select_related("tool").get(call=call, number=call.attempts_count)
    return attempt_report(call=call, attempt=row, facts=facts_of(facts), actor=RUNTIME)["call_state"]


def unknown(task: Task, tool: str, *, ago: timedelta) -> Call:
    with clock(ago):
        call = add_call(task, tool)
        assert attempt(call, TIMEOUT) == "UNKNOWN"
    return call


def settle(call: Call, observed: str = "committed") -> None:
    apply_answer(call.pk, StatusAnswer(observed=observed, provider_status="succeeded", http_status=200), worker="t")


def section(body: str, element_id: str) -> str:
    """The markup of the element with this id, up to the end of its table (or section)."""
    start = body.index(f'id="{element_id}"')
    end = body.find("</table>", start)
    return body[start : end if end != -1 else None]


# --- who may see it ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "expected"), [(SIGNED_OUT, "sign-in"), (NO_ROLE, 403), *((role, 200) for role in ROLES)]
)
def test_every_role_reads_the_overview_and_nobody_else(people, who, expected):
    response = signed_in(people, who).get("/overview/")
    if expected == "sign-in":
        assert response.status_code == 302 and response["Location"] == "/sign-in/?next=/overview/"
    else:
        assert response.status_code == expected


# --- the numbers ---------------------------------------------------------------------------------------------------


def test_it_counts_open_items_per_queue_with_the_oldest(people, world):
    oldest = unknown(world, "refund.create", ago=timedelta(hours=3, minutes=10))
    unknown(world, "email.send", ago=timedelta(minutes=2))
    still = unknown(world, "refund.create", ago=timedelta(minutes=40))
    apply_answer(still.pk, StatusAnswer(observed="failed", error="503", http_status=503), worker="t")
    with clock(timedelta(minutes=50)):
        assert attempt(add_call(world, "refund.create"), NO_REFERENCE) == "HUMAN_REVIEW"
    settled = unknown(world, "refund.create", ago=timedelta(hours=5))
    settle(settled)  # no longer open: not counted, and not the oldest

    response = signed_in(people, VIEWER).get("/overview/")
    body = response.content.decode()
    assert Call.objects.get(pk=still.pk).state == "STILL_UNKNOWN"
    assert '<span class="tile-count" data-queue="unknown">3</span>' in body  # UNKNOWN and STILL_UNKNOWN
    assert '<span class="tile-count" data-queue="human-review">1</span>' in body
    tiles = page_text(section(body, "open-items"))
    assert "Oldest waiting 3 h 10 min" in tiles and "Oldest waiting 50 min" in tiles
    assert f"since {Call.objects.get(pk=oldest.pk).state_changed_at:%Y-%m-%d %H:%M:%S} UTC" in tiles


def test_an_item_older_than_its_risks_sla_is_a_breach_and_a_newer_one_is_not(people, world, settings):
    settings.RECOVERY_SLA_S = SLA  # high: 15 min, low: 4 h
    unknown(world, "refund.create", ago=timedelta(minutes=20))  # high, past 15 min: a breach
    unknown(world, "refund.create", ago=timedelta(minutes=5))  # high, within its SLA
    unknown(world, "email.send", ago=timedelta(hours=1))  # low: 1 h is within 4 h
    unknown(world, "email.send", ago=timedelta(hours=5))  # low, past 4 h: a breach
    with clock(timedelta(minutes=30)):
        assert attempt(add_call(world, "refund.create"), NO_REFERENCE) == "HUMAN_REVIEW"  # high, past 15 min

    body = signed_in(people, VIEWER).get("/overview/").content.decode()
    table = section(body, "sla-table")
    high = table.split('data-risk="high">', 1)[1].split("</tr>", 1)[0]
    low = table.split('data-risk="low">', 1)[1].split("</tr>", 1)[0]
    assert table.index('data-risk="high"') < table.index('data-risk="low"')  # the strictest SLA first
    assert page_text(high) == "high 15 min 1 breaching of 2 open 1 breaching of 1 open"
    assert page_text(low) == "low 4 h 1 breaching of 2 open 0 breaching of 0 open"
    # Each count links to its queue filtered by the risk (the queue lists the oldest first).
    assert 'href="/queues/unknown/?risk=high" class="breach"' in high
    assert 'href="/queues/human-review/?risk=high" class="breach"' in high
    assert 'href="/queues/human-review/?risk=low">' in low  # nothing breaching: not marked
    assert signed_in(people, VIEWER).get("/queues/unknown/?risk=high").status_code == 200  # a link the queue accepts

    settings.RECOVERY_SLA_S = {"high": 3600, "low": 4 * 3600}  # a looser SLA: the 20-min item no longer breaches
    body = signed_in(people, VIEWER).get("/overview/").content.decode()
    high = section(body, "sla-table").split('data-risk="high">', 1)[1].split("</tr>", 1)[0]
    assert page_text(high) == "high 1 h 0 breaching of 2 open 0 breaching of 1 open"


def still_unknown(task: Task, tool: str, *, ago: timedelta) -> Call:
    with clock(ago):
        call = unknown(task, tool, ago=timedelta(0))
        apply_answer(call.pk, StatusAnswer(observed="failed", error="503", http_status=503), worker="t")
    assert Call.objects.get(pk=call.pk).state == "STILL_UNKNOWN"
    return call


def compensation_problem(task: Task, tool_name: str, state: str, *, ago: timedelta) -> Call:
    """A call as a saga's end leaves it in `state`, `ago` (a row written whole, as tests/factories.py writes them)."""
    tool = Tool.objects.get(name=tool_name)
    step = Step.objects.create(task=task, index=100 + Call.objects.count())
    return Call.objects.create(
        tenant=task.tenant,
        task=task,
        step=step,
        tool=tool,
        idempotency_key=f"saga-{step.index}",
        arguments={},
        fingerprint=f"saga-{step.index}",
        side_effect=tool.side_effect,
        risk=tool.risk,
        state=state,
        state_changed_at=timezone.now() - ago,
    )


def test_each_queue_counts_its_overdue_items_and_those_due_within_the_hour(people, world, settings):
    """Due times as a row writes them (docs/notifications.md#due-times): past the claim's while nobody holds the item,
    past the resolution's always; an UNKNOWN call waits for reconciliation, not a person, and has none."""
    settings.RECOVERY_SLA_S = SLA  # resolution: high 15 min, low 4 h
    settings.RECOVERY_CLAIM_DUE_S = {"high": 300, "low": 3600}  # claim: high 5 min, low 1 h
    still_unknown(world, "refund.create", ago=timedelta(minutes=20))  # high, past its resolution: overdue
    still_unknown(world, "refund.create", ago=timedelta(minutes=2))  # high, its claim due in 3 min: due soon
    still_unknown(world, "email.send", ago=timedelta(hours=3))  # low, unclaimed past its claim: overdue
    unknown(world, "refund.create", ago=timedelta(minutes=40))  # UNKNOWN: open, no due time
    with clock(timedelta(minutes=30)):
        assert attempt(add_call(world, "refund.create"), NO_REFERENCE) == "HUMAN_REVIEW"  # high: overdue
    with clock(timedelta(minutes=10)):
        assert attempt(add_call(world, "email.send"), NO_REFERENCE) == "HUMAN_REVIEW"  # low, claim in 50 min: soon

    # Compensation problems in the two states due times are set for (written as the saga's end leaves them).
    compensation_problem(world, "refund.create", "COMPENSATION_FAILED", ago=timedelta(minutes=20))  # high: overdue
    compensation_problem(world, "email.send", "PARTIAL_COMPENSATED", ago=timedelta(minutes=2))  # low, claim in 58 min

    body = signed_in(people, VIEWER).get("/overview/").content.decode()
    queues = ("unknown", "human-review", "compensation-problems")
    due = {q: page_text(body.split(f'data-due="{q}">', 1)[1].split("</p>", 1)[0]) for q in queues}
    assert due == {
        "unknown": "2 overdue 1 due within 1 h",
        "human-review": "1 overdue 1 due within 1 h",
        "compensation-problems": "1 overdue 1 due within 1 h",
    }
    assert '<span class="tile-count" data-queue="unknown">4</span>' in body


def test_it_lists_open_breakers_and_status_endpoints_and_not_closed_ones(people, world):
    refund, lookup = Tool.objects.get(name="refund.create"), Tool.objects.get(name="order.lookup")
    now = timezone.now()
    for _ in range(2):  # refund.create opens at 2 calls with half of them failed
        breaker_record(refund, counts_as_failure=True, probe=False, now=now - timedelta(minutes=3))
    breaker_record(lookup, counts_as_failure=False, probe=False, now=now)  # counted, stays closed
    provider = Provider.objects.get(name="payments")
    for _ in range(5):  # the status endpoint's defaults: 5 checks, half failed
        status_breaker_record(provider, failed=True, now=now - timedelta(minutes=1))

    body = signed_in(people, VIEWER).get("/overview/").content.decode()
    rows = page_text(section(body, "breakers-table"))
    assert "refund.create open 3 min" in rows
    assert "status API of payments half_open" in rows  # the 30 s cooldown is over: the next check is a probe
    assert "order.lookup" not in rows


def test_with_every_breaker_closed_it_says_so(people, world):
    body = signed_in(people, VIEWER).get("/overview/").content.decode()
    assert "Every breaker is closed." in body and 'id="breakers-table"' not in body


def test_it_counts_the_last_days_failures_by_class(people, world):
    timeout = add_call(world, "refund.create")
    assert attempt(timeout, TIMEOUT) == "UNKNOWN"  # outcome_unknown
    flaky = add_call(world, "order.lookup")
    assert attempt(flaky, UNAVAILABLE) == "RETRYABLE"  # transient
    rejected = add_call(world, "email.send")
    assert attempt(rejected, REJECTED) == "RETRYABLE"  # invalid_arguments: repair
    lookup = add_call(world, "order.lookup")
    assert attempt(lookup, UNAVAILABLE) == "RETRYABLE"
    metrics_fold()

    body = signed_in(people, VIEWER).get("/overview/").content.decode()
    table = section(body, "failures-table")

    def row(name: str) -> str:
        return page_text(table.split(f'data-class="{name}"', 1)[1].split(">", 1)[1].split("</tr>", 1)[0])

    assert row("transient") == "transient 2 50 %"
    assert row("outcome_unknown") == "outcome_unknown 1 25 %"
    assert row("invalid_arguments") == "invalid_arguments 1 25 %"
    assert row("authentication") == "authentication 0 0 %"  # every class of docs/design/classification.md is listed
    assert "4 of the 4 attempts made in the last 24 h failed." in page_text(body)

    # A day later the same attempts are outside the window.
    with clock(-timedelta(hours=24, minutes=1)):
        later = signed_in(people, VIEWER).get("/overview/").content.decode()
    assert "0 of the 0 attempts made in the last 24 h failed." in page_text(later)
    assert page_text(section(later, "failures-table")).count(" 0 —") == 8


def test_the_chart_counts_calls_entering_and_leaving_unknown_per_hour(people, world):
    entered_then_settled = unknown(world, "refund.create", ago=timedelta(hours=3))
    with clock(timedelta(hours=2)):
        settle(entered_then_settled)
    still = unknown(world, "refund.create", ago=timedelta(hours=2))
    with clock(timedelta(hours=1)):  # UNKNOWN -> STILL_UNKNOWN: it stays in the queue, neither in nor out
        apply_answer(still.pk, StatusAnswer(observed="failed", error="503", http_status=503), worker="t")
    long_ago = unknown(world, "refund.create", ago=timedelta(hours=30))  # entered before the chart's day
    settle(long_ago)  # left now
    unknown(world, "email.send", ago=timedelta(minutes=1))
    metrics_fold()

    response = signed_in(people, VIEWER).get("/overview/")
    body = response.content.decode()
    flow = response.context["flow"]
    assert len(flow) == 24 and flow[-1].start <= response.context["now"] < flow[-1].start + timedelta(hours=1)

    def hour_of(call: Call, to_state: str) -> datetime:
        at = AuditEvent.objects.get(call=call, to_state=to_state).created_at
        return at.replace(minute=0, second=0, microsecond=0)

    expected: dict[datetime, list[int]] = {}
    for call, to_state, column in [
        (entered_then_settled, "UNKNOWN", 0),
        (entered_then_settled, "COMMITTED", 1),
        (still, "UNKNOWN", 0),
        (long_ago, "COMMITTED", 1),
        (Call.objects.filter(tool__name="email.send").get(), "UNKNOWN", 0),
    ]:
        expected.setdefault(hour_of(call, to_state), [0, 0])[column] += 1
    got = {hour.start: [hour.entered, hour.settled] for hour in flow if hour.entered or hour.settled}
    assert got == expected
    assert (response.context["entered"], response.context["settled"]) == (3, 2)

    # The page says the same: the table row per hour, the SVG's summary and one bar pair per hour.
    table = section(body, "flow-table")
    for start, (came, left) in expected.items():
        assert f"{start:%Y-%m-%d %H:%M} {came} {left}" in page_text(table)
    assert "3 calls entered UNKNOWN and 2 left it in the last 24 hours." in body
    svg = body[body.index("<svg") : body.index("</svg>")]
    assert svg.count('<rect class="bar entered"') == 24 and svg.count('<rect class="bar settled"') == 24
    assert "style=" not in body.split("<main", 1)[1] and "<script" not in body.split("<main", 1)[1]


def test_the_headline_figures_link_to_their_sections_of_the_metrics_page(people, world):
    body = signed_in(people, VIEWER).get("/overview/").content.decode()
    assert "No metrics fold has run yet" in page_text(section(body, "headline-figures"))

    settled = unknown(world, "refund.create", ago=timedelta(hours=2))
    with clock(timedelta(hours=1, minutes=10)):  # 50 minutes in UNKNOWN
        settle(settled)
    unknown(world, "email.send", ago=timedelta(minutes=20))
    with clock(timedelta(minutes=10)):
        assert attempt(add_call(world, "refund.create"), NO_REFERENCE) == "HUMAN_REVIEW"
    assert attempt(add_call(world, "order.lookup"), UNAVAILABLE) == "RETRYABLE"  # a read: in no rate
    metrics_fold()

    client = signed_in(people, VIEWER)
    body = client.get("/overview/").content.decode()
    tiles = body[body.index('id="headline-figures"') : body.index('id="failures"')]

    def tile(key: str) -> tuple[str, str]:
        markup = tiles.split(f'data-figure="{key}">', 1)[1].split("</li>", 1)[0]
        link = markup.split('href="', 1)[1].split('"', 1)[0]
        return link, page_text(markup)

    # Writes: two refunds and an email; the first refund and the email entered UNKNOWN, and reconciliation settled
    # the refund alone. The 50 minutes fall in the (30 min, 1 h] bucket: p95 30 + 30 x 0.95 = 58.5 min.
    assert tile("unknown_outcome_rate") == (
        "/overview/metrics/#unknown_outcome_rate",
        "Unknown-outcome rate 66.7 % 2 of 3",
    )
    assert tile("reconcile_success_rate") == (
        "/overview/metrics/#reconcile_success_rate",
        "Reconcile success rate 50 % 1 of 2",
    )
    assert tile("duplicate_effect_rate") == (
        "/overview/metrics/#duplicate_effect_rate",
        "Duplicate side-effect rate 0 % 0 of 3",
    )
    assert tile("human_takeovers") == ("/overview/metrics/#human_takeovers", "Human takeovers 1")
    assert tile("time_to_resolution") == (
        "/overview/metrics/#time_to_resolution",
        "Time to resolution of queue items p95 58 min 30 s median 45 min · 1 resolved",
    )
    # Each link lands on the section of that id, which shows the same number.
    metrics = client.get("/overview/metrics/").content.decode()
    for key in ("unknown_outcome_rate", "reconcile_success_rate", "duplicate_effect_rate", "human_takeovers"):
        assert f'<section class="figure" id="{key}" data-figure="{key}"' in metrics
    rate = metrics.split('data-figure="unknown_outcome_rate"', 1)[1]
    assert '<p class="figure-value" data-value="0.666667">66.7 %</p>' in rate.split("</section>", 1)[0]
    assert "from the metrics rollups as of" in page_text(section(body, "headline-figures"))


def test_the_chart_scales_its_bars_to_the_tallest_hour():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    flow = [HourFlow(start=start + timedelta(hours=i), entered=i % 4, settled=0) for i in range(24)]
    flow[5] = HourFlow(start=flow[5].start, entered=7, settled=3)
    chart = flow_chart(flow)
    heights = [float(bar.height) for bar in chart.bars("entered")]
    assert PLOT_H == 178  # the plot's height in SVG units
    assert [t.label for t in chart.grid] == ["0", "5", "10"]  # 7 rounds up to a top of 10
    assert max(heights) == pytest.approx(178 * 7 / 10, abs=0.1)
    assert heights[0] == 0 and float(chart.bars("settled")[5].height) == pytest.approx(178 * 3 / 10, abs=0.1)
    assert chart.bars("entered")[5].label == "05:00 UTC: 7 entered"
    # Every third hour is labelled, and the last; that one ends at the plot's edge rather than running past it.
    assert [t.label for t in chart.ticks] == [f"{h:02}:00" for h in range(0, 24, 3)] + ["23:00"]
    assert (chart.ticks[-1].anchor, chart.ticks[-1].x, chart.ticks[0].anchor) == ("end", "712", "middle")
    empty = flow_chart([HourFlow(start=start, entered=0, settled=0)] * 24)
    assert {bar.height for bar in empty.bars("entered")} == {"0"} and [t.label for t in empty.grid] == ["0", "1"]


# --- fixed statements ----------------------------------------------------------------------------------------------


def _bulk(task: Task, tool: Tool, n: int, *, state: str, start: int, risk: str | None = None) -> list[Call]:
    step, _ = Step.objects.get_or_create(task=task, index=9)
    now = timezone.now()
    calls = []
    for i in range(start, start + n):
        args = {"n": i}
        calls.append(
            Call(
                tenant=task.tenant,
                task=task,
                step=step,
                tool=tool,
                idempotency_key=f"bulk-{i}",
                arguments=args,
                fingerprint=canonical_json([tool.name, args])[:64],
                side_effect=tool.side_effect,
                risk=risk or tool.risk,
                state=state,
                state_changed_at=now - timedelta(minutes=i % 600),
            )
        )
    return Call.objects.bulk_create(calls, batch_size=500)


def _bulk_attempts(calls: list[Call], classes: tuple[str, ...]) -> None:
    Attempt.objects.bulk_create(
        [
            Attempt(
                call=call,
                attempt_id=f"bulk-{call.pk}",
                number=1,
                tool_id=call.tool_id,
                fingerprint=call.fingerprint,
                failure_class=classes[i % len(classes)],
            )
            for i, call in enumerate(calls)
        ],
        batch_size=500,
    )


def test_the_overview_runs_the_same_statements_for_few_or_many_calls_attempts_events_and_breakers(people, world):
    client = signed_in(people, VIEWER)
    unknown(world, "refund.create", ago=timedelta(minutes=30))
    metrics_fold()
    few, _ = statements(client, "/overview/")

    refund, email, lookup = (Tool.objects.get(name=n) for n in ("refund.create", "email.send", "order.lookup"))
    waiting = _bulk(world, refund, 1005, state="UNKNOWN", start=1000)
    _bulk(world, email, 40, state="STILL_UNKNOWN", start=3000)
    _bulk(world, refund, 60, state="HUMAN_REVIEW", start=4000)
    _bulk_attempts(waiting, ("outcome_unknown", "transient", "", "invalid_result"))
    for call in waiting[:30]:  # real transitions, so the chart has events to count
        transition_call(call, "COMMITTED", actor=RUNTIME, reason="settled")
    more = [Tool.objects.create(name=f"tool-{i}", provider=refund.provider, side_effect="read") for i in range(12)]
    now = timezone.now()
    for tool in [refund, lookup, *more]:
        for _ in range(10):
            breaker_record(tool, counts_as_failure=True, probe=False, now=now)
    metrics_fold()
    many, response = statements(client, "/overview/")
    body = response.content.decode()

    assert few == many, (few, many)
    assert '<span class="tile-count" data-queue="unknown">1016</span>' in body  # exact, not the nav's "1,000+"
    assert '<span class="count" data-queue="unknown">1,000+</span>' in body
    assert page_text(section(body, "breakers-table")).count(" open ") == 14


# --- hostile text -------------------------------------------------------------------------------------------------


def test_a_hostile_tool_name_is_shown_as_text(people, world):
    provider = Provider.objects.get(name="payments")
    tool = Tool.objects.create(name=HOSTILE_IMG, provider=provider, side_effect="read", breaker={"min_calls": 1})
    breaker_record(tool, counts_as_failure=True, probe=False, now=timezone.now())
    body = signed_in(people, VIEWER).get("/overview/").content.decode()
    assert HOSTILE_IMG not in body
    assert "&lt;img src=x onerror=window.__pwned=1&gt;" in section(body, "breakers-table")


# --- who runs the jobs (docs/deploy.md) ------------------------------------------------------------------------------


def test_the_embedded_default_says_the_web_process_runs_the_jobs(people, settings):
    settings.REDIS_URL = ""
    body = signed_in(people, VIEWER).get("/overview/").content.decode()
    assert "This web process runs the background jobs itself" in page_text(section(body, "job-processes"))


def test_it_shows_each_worker_with_its_heartbeat_and_the_scheduler_holder(people, rq_queue, settings):
    from rq import Worker

    from recovery.jobs.cron import Scheduler
    from tests.isolation import flush

    flush(settings.REDIS_URL)  # no worker an earlier test registered (and killed) in this run's database

    worker = Worker(["default"], connection=rq_queue.connection, name="jobs-1.w1")
    worker.register_birth()  # what a starting worker writes to Redis: its name, host, pid and a heartbeat
    try:
        rq_queue.connection.set(Scheduler.LOCK_KEY, "jobs-2:4242:ab12cd34", px=8000)
        text = page_text(section(signed_in(people, VIEWER).get("/overview/").content.decode(), "job-processes"))
    finally:
        worker.register_death()
    assert "Scheduler: jobs-2, process 4242 holds the lock" in text and "s left of its lease" in text
    assert "jobs-1.w1" in text and f"pid {worker.pid}" in text
    beat = worker.last_heartbeat.replace(tzinfo=UTC) if worker.last_heartbeat.tzinfo is None else worker.last_heartbeat
    assert f"{beat:%Y-%m-%d %H:%M:%S} UTC" in text  # its last heartbeat, with how long ago

    rq_queue.connection.delete(Scheduler.LOCK_KEY)
    text = page_text(section(signed_in(people, VIEWER).get("/overview/").content.decode(), "job-processes"))
    assert "No scheduler holds the lock" in text and "No worker is running" in text


def test_an_unreachable_redis_is_said_and_the_overview_still_answers(people, settings):
    from tests.servers import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    response = signed_in(people, VIEWER).get("/overview/")
    assert response.status_code == 200
    assert "Redis is unreachable" in page_text(section(response.content.decode(), "job-processes"))

"""The metrics of docs/metrics.md after real histories: a scripted one through the live API, the real sandbox and the
jobs, whose every figure is worked out by hand below, and a fault drill whose metrics must equal what the drill
observed.
"""

# ruff: noqa: F811  (the `world` and `stage` fixtures are imported from the modules that define them)
from __future__ import annotations

import re

import pytest
from django.utils import timezone

from recovery.engine import metrics as m
from recovery.jobs import tasks as jobs
from recovery.models import Call, Tool
from recovery.selectors.metrics import metrics_report, metrics_totals
from tests.console import signed_in
from tests.test_drills import BACKLOG, passed, stage  # noqa: F401  (the drill stage fixture)
from tests.test_metrics_endpoints import samples
from tests.test_reconcile import _attempt, _due_now, _lose_reply, _refund_call, world  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def scripted_history(world) -> dict[str, int]:
    """Four refunds on the demo tenant, each in a task of its own:
    A commits at once; B loses its reply and a receipt commits it; D is refused by the provider's validation (422)
    and its task abandoned; C loses its reply while the status API is down, and goes to a person at the poll budget
    (three checks). A's task is submitted."""
    client, sandbox = world["client"], world["sandbox"]
    a, key_a = _refund_call(world)
    assert _attempt(world, a, key_a) == "COMMITTED"
    b, key_b = _refund_call(world)
    _lose_reply(world, b, key_b)
    jobs.reconcile_due()
    assert Call.objects.get(pk=b).state == "COMMITTED"
    d, key_d = _refund_call(world)
    sandbox.fault(route="/refunds", key=key_d, kind="error", status=422, code="invalid_amount", times=1)
    assert _attempt(world, d, key_d) == "RETRYABLE"
    client.abandon_task(Call.objects.get(pk=d).task_id, "the order was refunded another way")
    c, key_c = _refund_call(world)
    sandbox.fault(route="/refunds/by-key", kind="status_down", status=503)
    _lose_reply(world, c, key_c)
    for _ in range(3):
        _due_now(c)
        jobs.reconcile_due()
    assert Call.objects.get(pk=c).state == "HUMAN_REVIEW"
    client.complete_task(Call.objects.get(pk=a).task_id, "refunded")
    jobs.metrics_fold()
    return {"A": a, "B": b, "C": c, "D": d}


# Worked out by hand from the story above.
EXPECTED_COUNTS = {
    "attempts": {"committed": 1, "unknown": 2, "retryable": 1},
    "failures": {"outcome_unknown": 2, "invalid_arguments": 1},
    "reconcile_checks": {"committed": 1, "failed": 3},
    "human_takeovers": {"poll_budget_exhausted": 1},
    "budget_exhausted": {"poll_budget_exhausted": 1},
    "compensations": {},
    "probes": {},
    "actions": {},
}
EXPECTED_RATES = {  # (numerator, denominator)
    "unknown_outcome_rate": (2, 4),  # B and C of the four writes
    "reconcile_success_rate": (1, 2),  # B settled by its receipt; C went to a person
    "duplicate_effect_rate": (0, 4),
    "retries_per_success": (0, 2),  # A and B committed on their first attempt
    "task_success_rate": (1, 2),  # A's task completed; D's abandoned (B's and C's are still open)
}


def test_a_scripted_history_gives_the_figures_worked_out_by_hand(world):
    scripted_history(world)
    report = metrics_report(now=timezone.now(), window="24h")

    for key, labels in EXPECTED_COUNTS.items():
        figure = report.figure(key)
        assert dict(figure.by_label) == labels, key
        assert figure.value == sum(labels.values()), key
    for key, (numerator, denominator) in EXPECTED_RATES.items():
        figure = report.figure(key)
        assert (figure.numerator, figure.denominator) == (numerator, denominator), key
        assert figure.value == pytest.approx(numerator / denominator), key
    decisions = dict(report.figure("decisions").by_label)
    assert decisions["reconcile"] == 2 and sum(decisions.values()) == 3  # one card per failed attempt
    resolved = report.figure("time_to_resolution")
    assert resolved.count == 2  # B and C left the UNKNOWN queue; C waits in HUMAN_REVIEW
    assert 0 <= resolved.median <= resolved.value <= 60  # both within a minute: the test's whole length
    assert report.queues == {"unknown": 0, "human_review": 1, "compensation": 0}
    assert report.figure("breaker_open_time").value == 0


def test_the_totals_equal_the_windowed_figures_and_a_tool_filter_keeps_only_its_tool(world):
    scripted_history(world)
    refund = Tool.objects.get(name="refund.create")
    totals = metrics_totals(now=timezone.now())
    assert {label: n for tool, label, n in totals.counts[m.ATTEMPTS] if tool == refund.pk} == {
        "committed": 1,
        "unknown": 2,
        "retryable": 1,
    }
    assert totals.counts[m.TASK_OUTCOMES] == [(0, "abandoned", 1), (0, "completed", 1)]
    lookup = Tool.objects.get(name="order.lookup")
    other = metrics_report(now=timezone.now(), tool_id=lookup.pk)
    assert other.figure("attempts").value == 0 and other.figure("unknown_outcome_rate").value is None
    mine = metrics_report(now=timezone.now(), tool_id=refund.pk)
    assert mine.figure("unknown_outcome_rate").value == pytest.approx(0.5)


def test_after_the_backlog_drill_its_tool_shows_what_the_drill_observed(stage):
    result = passed(stage, "queue-backlog", backlog=BACKLOG)
    jobs.metrics_fold()

    calls = Call.objects.filter(pk__in=[row.call_id for row in result.keys])
    (tool_id,) = set(calls.values_list("tool_id", flat=True))
    report = metrics_report(now=timezone.now(), tool_id=tool_id)
    effects = stage.sandbox.ledger()["by_key"]
    duplicates = sum(1 for row in result.keys if effects.get(row.key, 0) > 1)
    unknown = report.figure("unknown_outcome_rate")
    assert (unknown.numerator, unknown.denominator) == (BACKLOG, BACKLOG)  # every reply was lost: 100 %
    settled = report.figure("reconcile_success_rate")
    assert (settled.numerator, settled.denominator) == (BACKLOG, BACKLOG)  # every one committed by a receipt
    dup = report.figure("duplicate_effect_rate")
    assert (dup.numerator, dup.denominator) == (duplicates, BACKLOG) == (0, BACKLOG)
    assert dict(report.figure("reconcile_checks").by_label) == {"committed": BACKLOG}
    assert report.figure("human_takeovers").value == 0
    assert report.figure("time_to_resolution").count == BACKLOG


def _page_values(html: str) -> dict[str, str]:
    """Each figure's number on the metrics page, as its `data-value` says."""
    return dict(re.findall(r'data-figure="([a-z_]+)".*?data-value="([^"]*)"', html, flags=re.S))


def test_the_page_the_json_and_prometheus_show_the_same_scripted_figures(world, console_people):
    scripted_history(world)
    api = world["client"]
    answer = api.session.get(f"{api.base_url}/metrics", params={"window": "24h"}, timeout=10)
    assert answer.status_code == 200, answer.text
    figures = {figure["key"]: figure for figure in answer.json()["figures"]}
    for key, labels in EXPECTED_COUNTS.items():
        assert {row["label"]: row["value"] for row in figures[key]["by_label"]} == labels, key
    for key, (numerator, denominator) in EXPECTED_RATES.items():
        assert (figures[key]["numerator"], figures[key]["denominator"]) == (numerator, denominator), key
    assert answer.json()["queues"] == {"unknown": 0, "human_review": 1, "compensation": 0}

    scraped = api.session.get(world["url"] + "/metrics", timeout=10)
    assert scraped.status_code == 200, scraped.text
    got = samples(scraped.text)
    tool = (("tool", "refund.create"),)
    for outcome, n in EXPECTED_COUNTS["attempts"].items():
        assert got[("recovery_attempts_total", (("outcome", outcome), *tool))] == n
    for result, n in EXPECTED_COUNTS["reconcile_checks"].items():
        assert got[("recovery_reconcile_checks_total", (("result", result), *tool))] == n
    assert got[("recovery_write_calls_total", tool)] == 4
    assert got[("recovery_unknown_outcomes_total", tool)] == 2
    assert got[("recovery_unknown_settled_total", tool)] == 1
    assert got[("recovery_duplicate_side_effects_total", tool)] == 0
    assert got[("recovery_human_takeovers_total", (("reason", "poll_budget_exhausted"), *tool))] == 1
    assert got[("recovery_task_outcomes_total", (("outcome", "completed"),))] == 1
    assert got[("recovery_task_outcomes_total", (("outcome", "abandoned"),))] == 1
    assert got[("recovery_time_to_resolution_seconds_count", (("queue", "unknown"),))] == 2
    assert got[("recovery_queue_items", (("queue", "human_review"),))] == 1

    html = signed_in(console_people, "viewer").get("/overview/metrics/?window=24h").content.decode()
    shown = _page_values(html)
    for key, labels in EXPECTED_COUNTS.items():
        assert float(shown[key]) == sum(labels.values()), key
    for key, (numerator, denominator) in EXPECTED_RATES.items():
        assert float(shown[key]) == pytest.approx(numerator / denominator), key

"""The demo agent's scenarios against the real stack: the API served by `live_server`, a sandbox provider process,
background jobs (in-process without REDIS_URL, a `runjobs` process with it), the drill registry's quick schedules.

Each test runs one scenario and checks its pinned end twice: the scenario's own checks (what the agent could see
over HTTP) must pass, and then the database (call states, audit transitions, receipts, gate answers, the task) and
the sandbox's own evidence (its ledger of effects, its request log) must say the same.
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from recovery.devtools.drills.stage import drill_stage
from recovery.devtools.scenarios import SCENARIOS, ScenarioResult, run_scenarios
from recovery.models import (
    Attempt,
    AuditEvent,
    Breaker,
    Call,
    CompensationEntry,
    Decision,
    GateDecision,
    Receipt,
    Task,
)
from recovery.selectors.queues import COMPENSATION_STATES, QueueFilters, queue_page

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def stage(live_server):
    with drill_stage(api_url=live_server.url) as stage:
        yield stage


def play(stage, name: str) -> ScenarioResult:
    lines: list[str] = []
    [result] = run_scenarios(stage, [name], lines.append)
    log = "\n".join(lines)
    assert result.passed, f"{name} did not end as pinned:\n{log}"
    assert all(line.startswith(f"{name} | ") for line in lines)
    return result


def transitions(call_id: int) -> list[tuple[str, str]]:
    events = AuditEvent.objects.filter(call_id=call_id).exclude(from_state="").exclude(to_state="").order_by("seq")
    return list(events.values_list("from_state", "to_state"))


def settling_receipt(call_id: int, observed: str = "committed") -> Receipt:
    return Receipt.objects.get(call_id=call_id, applied=True, observed=observed)


def delivered_callbacks(stage, key: str, wait_s: float = 5) -> list[dict]:
    """The callbacks the sandbox delivered about `key` (it sends them from a thread of its own: waits for one)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = [c for c in stage.sandbox.callbacks() if c["idempotency_key"] == key and c["status"] is not None]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def writes(stage, key: str) -> list[dict]:
    return [r for r in stage.sandbox.requests(key=key) if r["method"] != "GET"]


def at(request: dict) -> datetime:
    return datetime.fromisoformat(request["at"])


def outcome(result: ScenarioResult) -> str:
    return Task.objects.get(pk=result.task_id).outcome


def test_a_refund_whose_reply_is_lost_after_commit_is_committed_by_a_receipt_without_a_second_request(stage):
    result = play(stage, "reply-lost-after-commit")
    call_id, key = result.calls["refund"], result.keys["refund"]

    assert transitions(call_id) == [("READY", "SENT"), ("SENT", "UNKNOWN"), ("UNKNOWN", "COMMITTED")]
    receipt = settling_receipt(call_id)
    # The provider's own word settles it: the status check's receipt, or — on a machine slow enough that the check
    # comes after the 30 s the callback is held back — the callback's (the scenario's pinned end allows both).
    assert receipt.source in ("poll", "callback")
    assert (receipt.local_state_before, receipt.local_state_after) == ("UNKNOWN", "COMMITTED")
    assert Attempt.objects.filter(call_id=call_id).count() == 1
    assert [r["outcome"] for r in writes(stage, key)] == ["dropped_after_commit"]
    assert stage.sandbox.ledger(key)["effects"] == 1
    assert outcome(result) == "completed"


def test_a_refund_lost_before_commit_is_retried_under_its_own_key_once_a_receipt_says_not_committed(stage):
    result = play(stage, "lost-before-commit")
    call_id, key = result.calls["refund"], result.keys["refund"]

    assert transitions(call_id) == [
        ("READY", "SENT"),
        ("SENT", "UNKNOWN"),
        ("UNKNOWN", "NOT_COMMITTED"),
        ("NOT_COMMITTED", "RETRYABLE"),
        ("RETRYABLE", "SENT"),
        ("SENT", "COMMITTED"),
    ]
    assert settling_receipt(call_id, "not_committed").source == "poll"
    retry = GateDecision.objects.get(call_id=call_id, allowed=True, attempt__number=2)
    assert retry.evidence_used == "state_verified"
    assert [(r["key"], r["outcome"]) for r in writes(stage, key)] == [
        (key, "dropped_before_commit"),
        (key, "answered"),
    ]
    assert stage.sandbox.ledger(key)["effects"] == 1
    assert outcome(result) == "completed"


def test_a_rate_limited_lookup_is_committed_and_never_attempted_before_its_retry_after(stage):
    result = play(stage, "rate-limited-lookup")
    call_id = result.calls["lookup"]

    attempts = list(Attempt.objects.filter(call_id=call_id).order_by("number"))
    assert [(a.http_status, a.retry_after_ms) for a in attempts] == [(429, 2000), (429, 2000), (200, None)]
    assert Call.objects.get(pk=call_id).state == "COMMITTED"
    for before, after in itertools.pairwise(attempts):
        assert (after.admitted_at - before.reported_at).total_seconds() >= 2.0
    seen = stage.sandbox.requests(path_prefix=result.routes["lookup"])
    assert [r["status"] for r in seen] == [429, 429, 200]
    assert all((at(b) - at(a)).total_seconds() >= 2.0 for a, b in itertools.pairwise(seen))
    assert outcome(result) == "completed"


def test_a_lookup_with_an_invalid_result_is_rejected_retried_once_and_committed(stage):
    result = play(stage, "invalid-result")
    call_id = result.calls["lookup"]

    first, second = Attempt.objects.filter(call_id=call_id).order_by("number")
    assert (first.http_status, first.failure_class) == (200, "invalid_result")
    assert Decision.objects.get(attempt=first).route == "reject"
    assert (second.http_status, second.failure_class) == (200, "")
    assert transitions(call_id) == [
        ("READY", "SENT"),
        ("SENT", "RETRYABLE"),
        ("RETRYABLE", "SENT"),
        ("SENT", "COMMITTED"),
    ]
    seen = stage.sandbox.requests(path_prefix=result.routes["lookup"])
    assert [r["outcome"] for r in seen] == ["bad_result", "answered"]
    assert outcome(result) == "completed"


def test_a_shipment_waits_at_admission_until_the_payment_whose_reply_was_lost_is_committed(stage):
    result = play(stage, "order-payment-shipment")
    payment, shipment = result.calls["payment"], result.calls["shipment"]

    assert transitions(payment) == [("READY", "SENT"), ("SENT", "UNKNOWN"), ("UNKNOWN", "COMMITTED")]
    settled = AuditEvent.objects.get(call_id=payment, to_state="COMMITTED")
    assert settled.evidence["receipt"] == settling_receipt(payment).pk
    refused = GateDecision.objects.filter(call_id=shipment).order_by("pk").first()
    assert (refused.allowed, refused.reason) == (False, "blocked_by_dependency")
    assert refused.created_at < settled.created_at
    first_shipment = Attempt.objects.get(call_id=shipment, number=1)
    assert first_shipment.admitted_at > settled.created_at
    assert Call.objects.get(pk=shipment).state == "COMMITTED"
    # The sandbox saw the shipment only after it had answered the payment's status query.
    status_query = next(r for r in stage.sandbox.requests(key=result.keys["payment"]) if r["method"] == "GET")
    [shipment_write] = writes(stage, result.keys["shipment"])
    assert at(shipment_write) > at(status_query)
    assert [stage.sandbox.ledger(result.keys[role])["effects"] for role in ("order", "payment", "shipment")] == [
        1,
        1,
        1,
    ]
    assert len(writes(stage, result.keys["payment"])) == 1
    assert outcome(result) == "completed"


def test_an_unknown_grant_with_an_unknown_budget_of_0_holds_the_tasks_other_writes_until_it_settles(stage):
    result = play(stage, "grant-unknown-budget")
    editor, viewer = result.calls["editor"], result.calls["viewer"]

    assert transitions(editor) == [("READY", "SENT"), ("SENT", "UNKNOWN"), ("UNKNOWN", "COMMITTED")]
    settled = AuditEvent.objects.get(call_id=editor, to_state="COMMITTED")
    refused = GateDecision.objects.filter(call_id=viewer).order_by("pk").first()
    assert (refused.allowed, refused.reason, refused.required_next["action"]) == (
        False,
        "unknown_budget",
        "wait_for_reconcile",
    )
    assert Attempt.objects.get(call_id=viewer, number=1).admitted_at > settled.created_at
    assert Call.objects.get(pk=viewer).state == "COMMITTED"
    assert [stage.sandbox.ledger(result.keys[r])["effects"] for r in ("grant-editor", "grant-viewer")] == [1, 1]
    assert len(writes(stage, result.keys["grant-editor"])) == 1
    assert outcome(result) == "completed"


def test_a_refund_answered_403_with_an_approvable_code_is_left_for_a_reviewer(stage):
    result = play(stage, "needs-approval")
    call_id, key = result.calls["refund"], result.keys["refund"]

    assert transitions(call_id) == [("READY", "SENT"), ("SENT", "HUMAN_REVIEW")]
    attempt = Attempt.objects.get(call_id=call_id)
    assert (attempt.http_status, attempt.error_code, attempt.failure_class) == (403, "needs_approval", "authorization")
    assert Decision.objects.get(attempt=attempt).required_next["action"] == "request_approval"
    assert [r["status"] for r in writes(stage, key)] == [403]
    assert stage.sandbox.ledger(key)["effects"] == 0
    assert outcome(result) == "completed_with_unknowns"


def test_an_aborted_saga_cancels_the_order_whose_payment_was_declined_and_the_task_is_compensated(stage):
    result = play(stage, "saga-compensated")
    order, payment = result.calls["order"], result.calls["payment"]

    assert transitions(order) == [
        ("READY", "SENT"),
        ("SENT", "COMMITTED"),
        ("COMMITTED", "COMPENSATING"),
        ("pending", "sent"),  # its compensation entry's own transitions, on the same call
        ("sent", "committed"),
        ("COMPENSATING", "COMPENSATED"),
    ]
    assert transitions(payment) == [("READY", "SENT"), ("SENT", "FAILED_PERMANENT")]
    (entry,) = CompensationEntry.objects.filter(call_id=order)
    assert (entry.state, entry.attempts_count, entry.tool.name) == ("committed", 1, stage.tool("order.cancel"))
    assert not CompensationEntry.objects.filter(call_id=payment).exists()  # nothing was charged: nothing to refund
    [cancel] = writes(stage, entry.idempotency_key)
    assert (cancel["path"], cancel["status"]) == (result.routes["cancel"], 200)
    assert [e["kind"] for e in stage.sandbox.ledger(entry.idempotency_key)["entries"]] == ["cancellations"]
    assert stage.sandbox.ledger(result.keys["payment"])["effects"] == 0
    task = Task.objects.get(pk=result.task_id)
    assert (task.saga, task.saga_executor, task.outcome) == ("done", "console", "compensated")
    # The sandbox tells of the cancellation too, by the entry's own key: acknowledged, never a 404 in the demo's log.
    assert {c["status"] for c in delivered_callbacks(stage, entry.idempotency_key)} == {202}


def test_an_aborted_saga_whose_cancel_is_refused_stops_for_a_person_in_the_compensation_problems_queue(stage):
    result = play(stage, "saga-cancel-refused")
    order = result.calls["order"]

    assert transitions(order)[-1] == ("COMPENSATING", "COMPENSATION_FAILED")
    (entry,) = CompensationEntry.objects.filter(call_id=order)
    assert (entry.state, entry.outcome, entry.attempts_count) == ("failed", "refused", 1)
    assert [(r["status"], r["key"]) for r in writes(stage, entry.idempotency_key)] == [(409, entry.idempotency_key)]
    assert stage.sandbox.ledger(entry.idempotency_key)["effects"] == 0
    assert stage.sandbox.ledger(result.keys["order"])["effects"] == 1
    task = Task.objects.get(pk=result.task_id)
    assert (task.saga, task.outcome) == ("stopped", "abandoned")
    problems = queue_page(
        QueueFilters(states=COMPENSATION_STATES, compensation=True, q=str(task.pk)), now=timezone.now()
    ).rows
    assert [row["id"] for row in problems] == [order]


def test_a_task_that_stops_without_submitting_is_flagged_no_submission_after_its_deadline(stage):
    result = play(stage, "no-submission")
    task = Task.objects.get(pk=result.task_id)
    assert (task.status, task.outcome) == ("open", "")

    # The flag itself is the periodic job's (every RECOVERY_NO_SUBMISSION_EVERY_S, 5 s by default). The wait allows
    # for a worker queued behind the other periodic jobs on a loaded machine (CI runs the several-nodes test beside
    # this one); it ends as soon as the flag is set.
    waited_until = time.monotonic() + 60
    while not Task.objects.get(pk=task.pk).no_submission and time.monotonic() < waited_until:
        time.sleep(0.1)
    task.refresh_from_db()
    assert task.no_submission and task.status == "open"
    flagged = AuditEvent.objects.get(task_id=task.pk, action="task.no_submission")
    assert flagged.created_at > task.deadline


def test_a_5xx_storm_opens_the_breaker_denies_with_degrade_and_a_probe_closes_it_after_the_cooldown(stage):
    result = play(stage, "5xx-storm")
    storm = [call_id for role, call_id in result.calls.items() if role.startswith("storm-")]
    denied, probe = result.calls["denied"], result.calls["probe"]

    opened = AuditEvent.objects.get(action="breaker.opened")
    closed = AuditEvent.objects.get(action="breaker.closed")
    assert opened.evidence["tool"] == closed.evidence["tool"] == stage.tool("order.lookup")
    assert Breaker.objects.get(tool__name=stage.tool("order.lookup")).state == "closed"
    # Every storm attempt reached the sandbox; the refused call sent nothing; one probe went after the cooldown.
    sent = Attempt.objects.filter(call_id__in=storm).count()
    assert len(stage.sandbox.requests(path_prefix=result.routes["storm"])) == sent
    assert Decision.objects.filter(call_id__in=storm, route="degrade").exists()
    refusal = GateDecision.objects.get(call_id=denied)
    assert (refusal.allowed, refusal.reason, refusal.required_next["action"]) == (False, "breaker_open", "degrade")
    assert not Attempt.objects.filter(call_id=denied).exists()
    [probed] = Attempt.objects.filter(call_id=probe)
    assert probed.breaker_probe and probed.admitted_at > opened.created_at and probed.http_status == 200
    assert outcome(result) == "degraded"


def test_the_agent_side_imports_nothing_of_the_product_but_its_client():
    code = (
        "import sys, recovery.devtools.scenarios\n"
        "print(sorted(m for m in sys.modules if m.startswith(('recovery.', 'recovery_client', 'django', 'ninja'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    # The scenarios package and each of its modules (one per scenario, and their framework), nothing else.
    modules = [
        path.stem for path in (ROOT / "recovery" / "devtools" / "scenarios").glob("*.py") if path.stem != "__init__"
    ]
    scenarios = ["recovery.devtools.scenarios", *(f"recovery.devtools.scenarios.{module}" for module in modules)]
    client = ["recovery_client", "recovery_client.runtime", "recovery_client.types", "recovery_client.deferred"]
    loaded = sorted(["recovery.devtools", *scenarios, *client])
    assert result.stdout.strip() == str(loaded)


# The command -----------------------------------------------------------------------------------------------------


def test_the_catalogue_plays_the_scenarios_in_this_order():
    assert list(SCENARIOS) == [
        "reply-lost-after-commit",
        "lost-before-commit",
        "rate-limited-lookup",
        "invalid-result",
        "order-payment-shipment",
        "grant-unknown-budget",
        "needs-approval",
        "saga-compensated",
        "saga-cancel-refused",
        "no-submission",
        "status-api-down",
        "5xx-storm",
    ]
    assert [name for name, scenario in SCENARIOS.items() if scenario.exclusive] == ["status-api-down", "5xx-storm"]


def test_the_command_lists_the_scenarios_with_their_pinned_ends(capsys):
    call_command("demo_agent", "--list")
    out = capsys.readouterr().out
    for scenario in SCENARIOS.values():
        assert scenario.name in out and scenario.pinned_end in out


def test_the_command_says_to_start_the_console_when_it_is_not_reachable():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(CommandError, match=r"start `make run` first"):
        call_command("demo_agent", "--api", f"http://127.0.0.1:{port}", "--token", "rc_unused")

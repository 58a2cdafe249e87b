"""Retention of settled history (recovery/services/retention.py, docs/deploy.md): the receipts, gate answers,
diagnostics and response bodies of calls settled longer ago than RECOVERY_RETENTION_DAYS, in closed tasks, are
removed; nothing else is — not the calls, their attempts or decision cards, not the audit trail (which still
verifies), not the metrics' rollups — and the removal is audited and shown on the call page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.audit.chain import Actor, verify_all
from recovery.jobs import tasks as jobs
from recovery.models import (
    Attempt,
    AuditEvent,
    Call,
    Decision,
    Diagnostic,
    GateDecision,
    MetricRollup,
    MetricTotal,
    Receipt,
)
from recovery.models.roles import VIEWER
from recovery.providers.status import StatusAnswer
from recovery.services.metrics import metrics_fold
from recovery.services.reconcile import apply_answer
from recovery.services.retention import retention_prune
from recovery.services.tasks import task_complete
from tests.console import page_text, signed_in
from tests.test_console_call_page import RUNTIME, _fresh, load_refund_registry, unknown_refund

pytestmark = pytest.mark.django_db
ACTOR = Actor.system("tests")


@pytest.fixture(autouse=True)
def registry(db):
    load_refund_registry()


def settled_refund(*, days_ago: int, close_task: bool = True) -> Call:
    """An UNKNOWN refund (a timeout after sending, a pending check) that a second check settles COMMITTED, its task
    completed, and the whole of it moved `days_ago` into the past."""
    call = unknown_refund()
    apply_answer(
        call.pk,
        StatusAnswer(
            observed="committed",
            provider_status="succeeded",
            provider_ref="re_8848",
            http_status=200,
            request={"method": "GET", "url": f"http://127.0.0.1:9/refunds/by-key/{call.idempotency_key}"},
            response={"status": 200, "body": {"status": "succeeded", "refund_id": "re_8848"}},
        ),
        worker="tests-worker",
    )
    call = _fresh(call.pk)
    assert call.state == "COMMITTED"
    if close_task:
        task_complete(task=call.task, summary="refunded", deliverable=None, actor=RUNTIME)
    Call.objects.filter(pk=call.pk).update(state_changed_at=timezone.now() - timedelta(days=days_ago))
    return _fresh(call.pk)


def history(call: Call) -> dict[str, int]:
    attempts = Attempt.objects.filter(call=call)
    return {
        "receipts": Receipt.objects.filter(call=call).count(),
        "gate_decisions": GateDecision.objects.filter(call=call).count(),
        "diagnostics": Diagnostic.objects.filter(call=call).count(),
        "attempt_bodies": attempts.exclude(response=None, outcome_response=None, diagnostic=None).count(),
        "attempts": attempts.count(),
        "decisions": Decision.objects.filter(call=call).count(),
    }


def rollups() -> tuple[list, list]:
    return (
        sorted(MetricRollup.objects.values_list("period", "start", "tenant_id", "tool_id", "series", "label", "value")),
        sorted(MetricTotal.objects.values_list("tenant_id", "tool_id", "series", "label", "value")),
    )


def test_it_removes_only_the_settled_history_of_old_settled_calls_in_closed_tasks():
    old = settled_refund(days_ago=100)
    recent = settled_refund(days_ago=10)
    still_open = settled_refund(days_ago=100, close_task=False)
    unsettled = unknown_refund()
    Call.objects.filter(pk=unsettled.pk).update(state_changed_at=timezone.now() - timedelta(days=100))
    before = {call.pk: history(call) for call in (old, recent, still_open, unsettled)}
    assert before[old.pk]["receipts"] == 2 and before[old.pk]["gate_decisions"] >= 1
    assert before[old.pk]["diagnostics"] >= 1 and before[old.pk]["attempt_bodies"] >= 1
    metrics_fold()
    counted = rollups()

    pruned = retention_prune(now=timezone.now(), days=90, actor=ACTOR)

    assert (pruned.calls, pruned.receipts, pruned.gate_decisions) == (
        1,
        before[old.pk]["receipts"],
        before[old.pk]["gate_decisions"],
    )
    after = history(old)
    assert (after["receipts"], after["gate_decisions"], after["diagnostics"], after["attempt_bodies"]) == (0, 0, 0, 0)
    # What the story is told with stays: the call, its state and counters, its attempts and decision cards.
    assert (after["attempts"], after["decisions"]) == (before[old.pk]["attempts"], before[old.pk]["decisions"])
    kept = _fresh(old.pk)
    assert (kept.state, kept.checks_made, kept.last_receipt_status) == ("COMMITTED", old.checks_made, "committed")
    assert kept.history_pruned_at is not None
    for call in (recent, still_open, unsettled):
        assert history(call) == before[call.pk] and _fresh(call.pk).history_pruned_at is None

    event = AuditEvent.objects.get(action="retention.pruned")
    assert event.evidence["calls"] == 1 and event.evidence["receipts"] == before[old.pk]["receipts"]
    assert event.evidence["first_call"] == old.pk == event.evidence["last_call"]
    assert verify_all().ok  # the audit trail never referred to the removed rows for its verification
    metrics_fold()
    assert rollups() == counted  # the rollups were counted from the audit sequence: nothing to take back

    assert retention_prune(now=timezone.now(), days=90, actor=ACTOR).calls == 0  # once only
    assert AuditEvent.objects.filter(action="retention.pruned").count() == 1


def test_retention_off_removes_nothing_and_the_job_follows_the_setting(settings):
    old = settled_refund(days_ago=400)
    settings.RECOVERY_RETENTION_DAYS = 0
    assert jobs.prune_settled_history() == 0 and history(old)["receipts"] == 2

    settings.RECOVERY_RETENTION_DAYS = 365
    assert jobs.prune_settled_history() == 1 and history(old)["receipts"] == 0


def test_the_call_page_says_what_retention_removed(people):
    old = settled_refund(days_ago=100)
    retention_prune(now=timezone.now(), days=90, actor=ACTOR)

    body = signed_in(people, VIEWER).get(f"/calls/{old.pk}/").content.decode()

    assert "Retention removed this call's receipts, gate answers, diagnostics and response bodies" in page_text(body)
    assert 'id="history-pruned"' in body

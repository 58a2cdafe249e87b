"""The registry and the engine together: the example file's tools, loaded as an admin would, drive the engine."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from recovery.audit.chain import Actor
from recovery.engine.classify import classify
from recovery.engine.decide import decide
from recovery.engine.gate import admit
from recovery.engine.types import (
    BreakerView,
    CallView,
    Candidate,
    ClassifyContext,
    ErrorFacts,
    Facts,
    FieldError,
    GateContext,
    TaskView,
)
from recovery.models import Tool
from recovery.registry import load_registry, tool_policy

EXAMPLE = Path(__file__).resolve().parent.parent / "recovery" / "fixtures" / "registry.example.json"
NOW = datetime(2026, 8, 20, 18, 50, tzinfo=UTC)


@pytest.fixture
def refund(db):
    load_registry(json.loads(EXAMPLE.read_text()), actor=Actor.system("tests"))
    return tool_policy(Tool.objects.select_related("provider").get(name="refund.create"))


def test_the_seed_amount_is_refused_at_preflight_with_an_actionable_field_error(refund):
    call = CallView(
        call_id="1842",
        tool=refund.name,
        state="READY",
        idempotency_key="refund-order-8848-v3",
        fingerprint="f",
        attempts_made=0,
    )
    candidate = Candidate(attempt_id="a1", tool=refund.name, arguments={"order_id": "O-1842", "amount_cents": "800.0"})
    decision = admit(call, candidate, GateContext(now=NOW, tool=refund))
    assert not decision.allowed
    assert (decision.reason, decision.required_next.action) == ("preflight", "repair_args")
    assert decision.field_errors == (
        FieldError(
            field="amount_cents",
            expected="positive integer",
            received="800.0",
            suggestion="Use an integer expressed in cents.",
        ),
    )
    assert "amount_cents must be a positive integer in cents" in decision.public_message


def test_the_seed_refund_timeout_after_send_is_reconciled_never_replayed(refund):
    args = {"order_id": "O-8848", "amount_cents": 80000}
    ctx = ClassifyContext(call_id="1842", attempt_id="a2", idempotency_key="refund-order-8848-v3", arguments=args)
    facts = Facts(connection_opened=True, sent=True, error=ErrorFacts(kind="read_timeout"))
    outcome = classify(facts, refund, ctx)
    call = CallView(
        call_id="1842",
        tool=refund.name,
        state="SENT",
        idempotency_key="refund-order-8848-v3",
        fingerprint="f",
        attempts_made=2,
    )
    card = decide(outcome, call=call, task=TaskView(rounds_used=4), tool=refund, breaker=BreakerView(), now=NOW)
    assert (card.route, card.call_state, card.required_next.action) == ("reconcile", "UNKNOWN", "wait_for_reconcile")
    assert {"blind_replay", "duplicate_refund"} <= set(card.forbidden)
    assert card.required_next.after_ms == 0  # the registry's reconcile.first_check_s: 0, a check at once
    assert (card.budget.attempt, card.budget.max_attempts) == (2, 3)

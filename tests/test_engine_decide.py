"""decide(): the decision card of docs/design/decisions.md, with budgets, the deadline and the breaker applied."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.engine.classify import classify
from recovery.engine.decide import decide
from recovery.engine.types import (
    BackoffPolicy,
    BreakerView,
    Budgets,
    CallView,
    ClassifyContext,
    ErrorFacts,
    Facts,
    TaskView,
    ToolPolicy,
)

NOW = datetime(2026, 8, 20, 18, 50, tzinfo=UTC)
AMOUNT = {"type": "integer", "minimum": 1, "x-unit": "cents", "x-suggestion": "Use an integer expressed in cents."}
REFUND = ToolPolicy(
    name="refund.create",
    side_effect="write",
    risk="high",
    provider_ref_field="refund_id",
    result_schema={"type": "object", "required": ["refund_id"]},
    args_schema={"type": "object", "properties": {"amount_cents": AMOUNT}, "required": ["amount_cents"]},
    approvable_codes=frozenset({"needs_approval"}),
    budgets=Budgets(max_attempts=3),
    backoff=BackoffPolicy(base_ms=500, cap_ms=1_000),
    fallback="read_only_summary",
)
LOOKUP = ToolPolicy(
    name="order.lookup",
    side_effect="read",
    required_result_fields=("status",),
    budgets=Budgets(max_attempts=3),
    backoff=BackoffPolicy(base_ms=200, cap_ms=5_000),
    fallback="read_only_summary",
)


def card(tool, facts, *, attempts_made=1, task=None, breaker=None, args=None, now=NOW):
    args = {"amount_cents": 80000} if args is None else args
    ctx = ClassifyContext(call_id="1842", attempt_id="a2", idempotency_key="refund-order-8848-v3", arguments=args)
    outcome = classify(facts, tool, ctx)
    call = CallView(
        call_id="1842",
        tool=tool.name,
        state="SENT",
        idempotency_key="refund-order-8848-v3",
        fingerprint="f",
        attempts_made=attempts_made,
    )
    return decide(
        outcome,
        call=call,
        task=task or TaskView(rounds_used=attempts_made),
        tool=tool,
        breaker=breaker or BreakerView(),
        now=now,
        rng=random.Random(7),
    )


def status(code, **kw):
    return Facts(connection_opened=True, sent=True, http_status=code, **kw)


def test_it_reconciles_a_refund_that_timed_out_after_send():
    """The seed's example: a refund times out after it was sent — reconcile by key, never a blind replay."""
    facts = Facts(connection_opened=True, sent=True, error=ErrorFacts(kind="read_timeout", message="timed out"))
    decision = card(REFUND, facts, attempts_made=2)
    assert (decision.route, decision.call_state, decision.phase) == ("reconcile", "UNKNOWN", "commit_unknown")
    assert decision.side_effect == "unknown" and decision.error == "timeout_after_send"
    assert decision.required_next.action == "wait_for_reconcile"
    assert decision.next == ("query_provider_status", "if_unknown:human_review")
    assert {"blind_replay", "duplicate_refund"} <= set(decision.forbidden)
    assert "do not repeat" in decision.public_message.lower()
    assert (decision.budget.attempt, decision.budget.max_attempts) == (2, 3)


def test_it_retries_a_transient_failure_after_a_capped_jittered_backoff():
    decision = card(REFUND, status(503))
    assert (decision.route, decision.call_state, decision.required_next.action) == ("retry", "RETRYABLE", "retry_after")
    assert 400 <= decision.delay_ms <= 600  # 500 ms ±20 %, under the 1 s cap
    assert decision.required_next.after_ms == decision.delay_ms
    assert "unbounded_retry" in decision.forbidden


def test_retry_after_wins_even_above_the_cap():
    decision = card(LOOKUP, status(429, retry_after_ms=9_000))
    assert decision.delay_ms == 9_000 > LOOKUP.backoff.cap_ms


@pytest.mark.parametrize(
    ("task", "attempts_made", "limit"),
    [
        (TaskView(rounds_used=3), 3, "max_attempts"),
        (TaskView(rounds_used=4, budgets=Budgets(max_rounds=4)), 1, "max_rounds"),
        (TaskView(rounds_used=1, tokens_used=900, budgets=Budgets(token_budget=900)), 1, "token_budget"),
    ],
)
def test_it_ends_a_retryable_failure_with_no_budget_left_as_retry_exhausted(task, attempts_made, limit):
    decision = card(LOOKUP, status(503), attempts_made=attempts_made, task=task)
    assert (decision.route, decision.call_state, decision.outcome) == ("stop", "FAILED_PERMANENT", "retry_exhausted")
    assert decision.required_next.action == "stop"
    assert decision.required_next.detail == {"exhausted": limit}


def test_a_write_retry_budget_of_zero_stops_a_write_after_its_first_attempt():
    task = TaskView(rounds_used=1, write_retries_used=0, budgets=Budgets(write_retry=0))
    decision = card(REFUND, status(503), task=task)
    assert decision.outcome == "retry_exhausted"


def test_a_tool_can_send_exhaustion_to_human_review():
    tool = replace(LOOKUP, exhausted_to_review=True)
    decision = card(tool, status(503), attempts_made=3)
    assert (decision.call_state, decision.outcome, decision.route) == (
        "HUMAN_REVIEW",
        "human_review_required",
        "escalate",
    )


def test_it_stops_now_when_the_wait_and_one_call_do_not_fit_before_the_deadline():
    task = TaskView(rounds_used=1, budgets=Budgets(deadline=NOW + timedelta(seconds=5)))
    decision = card(LOOKUP, status(429, retry_after_ms=10_000), task=task)
    assert (decision.call_state, decision.outcome, decision.delay_ms) == ("FAILED_PERMANENT", "retry_exhausted", 0)
    assert decision.required_next.detail == {"exhausted": "deadline"}
    assert decision.budget.deadline_in_s == 5.0


def test_it_degrades_to_the_fallback_while_the_breaker_is_open():
    breaker = BreakerView(state="open", probe_available=False, retry_in_ms=12_000)
    decision = card(LOOKUP, status(500), breaker=breaker)
    assert (decision.route, decision.required_next.action) == ("degrade", "degrade")
    assert decision.fallback == "read_only_summary" == decision.required_next.detail["fallback"]
    assert decision.outcome == "degraded_read_only"
    assert decision.required_next.after_ms == 12_000
    assert decision.breaker_state == "open"


def test_a_write_whose_dependency_keeps_failing_is_reconciled_and_never_swapped_to_a_backup_write():
    decision = card(REFUND, status(500), breaker=BreakerView(state="open", probe_available=False))
    assert (decision.route, decision.call_state) == ("reconcile", "UNKNOWN")
    assert "switch_to_backup_write_tool" in decision.forbidden


def test_it_asks_for_repaired_arguments_with_field_errors():
    decision = card(REFUND, status(422), args={"amount_cents": "800.0"})
    assert (decision.route, decision.required_next.action) == ("repair", "repair_args")
    assert decision.required_next.detail["field_errors"] == [
        {"field": "amount_cents", "expected": "positive integer", "suggestion": "Use an integer expressed in cents."}
    ]
    assert decision.forbidden == ("same_call_same_arguments",)


def test_it_asks_for_fresh_credentials_after_a_401():
    decision = card(LOOKUP, status(401))
    assert (decision.route, decision.required_next.action) == ("reauth", "refresh_credentials")


def test_an_approvable_403_goes_to_a_person_and_another_stops():
    approvable = card(REFUND, status(403, error=ErrorFacts(code="needs_approval")))
    assert (approvable.route, approvable.call_state, approvable.required_next.action) == (
        "escalate",
        "HUMAN_REVIEW",
        "request_approval",
    )
    refused = card(REFUND, status(403, error=ErrorFacts(code="forbidden")))
    # docs/design/classification.md row 6: approve or stop; a 403 is not a reasoning obstacle to replan around.
    assert (refused.route, refused.call_state, refused.required_next.action) == ("stop", "FAILED_PERMANENT", "stop")
    assert "replan" not in refused.next and refused.next == ("report_not_executed",)


def test_an_invalid_read_result_is_rejected_and_retried_while_attempts_remain():
    facts = status(200, result={"order_id": "O-1"})  # no "status": fails validation
    first = card(LOOKUP, facts, attempts_made=1)
    assert (first.route, first.call_state, first.required_next.action) == ("reject", "RETRYABLE", "retry_after")
    assert "treating_result_as_fact" in first.forbidden
    last = card(LOOKUP, facts, attempts_made=3)
    assert (last.call_state, last.outcome) == ("FAILED_PERMANENT", "retry_exhausted")


def test_an_invalid_write_result_is_reconciled():
    decision = card(REFUND, status(200, provider_request_id="p-1", result="not an object"))
    assert (decision.route, decision.call_state) == ("reconcile", "UNKNOWN")


def test_an_accepted_write_waits_for_reconciliation():
    decision = card(REFUND, status(202, provider_request_id="p-881"))
    assert (decision.route, decision.call_state, decision.required_next.action) == (
        "reconcile",
        "ACCEPTED",
        "wait_for_reconcile",
    )
    assert decision.required_next.after_ms == REFUND.reconcile.first_check_s * 1000


def test_a_committed_call_needs_no_decision():
    assert card(REFUND, status(200, provider_request_id="p-1", result={"refund_id": "r-1"})) is None


def test_a_2xx_write_without_a_provider_reference_goes_to_a_person():
    decision = card(REFUND, status(200, result={"ok": True}))
    assert (decision.route, decision.call_state) == ("escalate", "HUMAN_REVIEW")
    assert decision.required_next.detail == {"hard_stop": "missing_provider_ref"}


def test_a_client_exception_before_sending_stops():
    facts = Facts(connection_opened=False, sent=False, error=ErrorFacts(kind="client_exception"))
    decision = card(REFUND, facts)
    assert (decision.route, decision.call_state, decision.required_next.action) == ("stop", "FAILED_PERMANENT", "stop")


def test_a_refused_connection_is_retried_with_the_same_key():
    facts = Facts(connection_opened=False, sent=False, error=ErrorFacts(kind="connection_refused"))
    decision = card(REFUND, facts)
    assert (decision.route, decision.call_state, decision.side_effect) == ("retry", "RETRYABLE", "not_sent")


def test_the_same_inputs_give_the_same_card():
    assert card(REFUND, status(503)) == card(REFUND, status(503))


@given(
    retry_after=st.none() | st.integers(min_value=0, max_value=120_000),
    seconds_left=st.none() | st.floats(min_value=0, max_value=300),
    attempts_made=st.integers(min_value=1, max_value=2),
    seed=st.integers(min_value=0, max_value=10_000),
)
@settings(max_examples=300, deadline=None)
def test_a_wait_never_exceeds_the_cap_or_retry_after_nor_the_time_left(retry_after, seconds_left, attempts_made, seed):
    deadline = None if seconds_left is None else NOW + timedelta(seconds=seconds_left)
    task = TaskView(rounds_used=attempts_made, budgets=Budgets(deadline=deadline))
    facts = status(429, retry_after_ms=retry_after) if retry_after is not None else status(503)
    ctx = ClassifyContext(call_id="1", attempt_id="a", idempotency_key="k", arguments={})
    call = CallView(
        call_id="1", tool=LOOKUP.name, state="SENT", idempotency_key="k", fingerprint="f", attempts_made=attempts_made
    )
    decision = decide(
        classify(facts, LOOKUP, ctx),
        call=call,
        task=task,
        tool=LOOKUP,
        breaker=BreakerView(),
        now=NOW,
        rng=random.Random(seed),
    )
    assert decision.delay_ms <= max(LOOKUP.backoff.cap_ms, retry_after or 0)
    if retry_after is not None and decision.call_state == "RETRYABLE":
        assert decision.delay_ms == retry_after  # never an attempt before the provider's Retry-After
    if deadline is not None:
        assert decision.delay_ms <= seconds_left * 1000
        if decision.call_state == "RETRYABLE":  # the wait plus one call fits before the deadline
            assert decision.delay_ms + 1_000 <= seconds_left * 1000

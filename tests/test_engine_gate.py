"""Admission (docs/design/gate.md): the checks in their order, each evidence kind allowed and denied, and the guards."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recovery.engine.canonical import canonical_json
from recovery.engine.fingerprint import fingerprint
from recovery.engine.gate import MESSAGES, admit, duplicate_intent
from recovery.engine.types import (
    APPROVAL_GRANTED,
    ARGS_CHANGED,
    AUTHENTICATION,
    AUTHORIZATION,
    CAPABILITY_MISSING,
    CLOSED,
    CREDENTIAL_REFRESHED,
    EVIDENCE_KINDS,
    FORCED_OPEN,
    HALF_OPEN,
    INVALID_ARGUMENTS,
    INVALID_RESULT,
    OPEN,
    OUTCOME_UNKNOWN,
    READ,
    STATE_VERIFIED,
    TIME_ELAPSED,
    TOOL_CHANGED,
    TRANSIENT,
    UNRECOVERABLE,
    WRITE,
    BreakerView,
    Budgets,
    CallView,
    Candidate,
    GateContext,
    PreviousAttempt,
    TaskView,
    ToolPolicy,
)

NOW = datetime(2026, 8, 20, 18, 0, tzinfo=UTC)
ARGS = {"order_id": "8848", "amount_cents": 800, "currency": "EUR"}
REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount_cents": {"type": "integer", "minimum": 1},
        "currency": {"type": "string"},
    },
    "required": ["order_id", "amount_cents"],
    "additionalProperties": False,
}
REFUND = ToolPolicy(
    name="refund.create",
    side_effect=WRITE,
    risk="high",
    args_schema=REFUND_SCHEMA,
    alternates=frozenset({"refund.create_v2"}),
    fallback="read_only_summary",
)
REFUND_V2 = ToolPolicy(name="refund.create_v2", side_effect=WRITE, args_schema=REFUND_SCHEMA)
LOOKUP = ToolPolicy(name="order.lookup", side_effect=READ, alternates=frozenset({"order.lookup_cached"}))
LOOKUP_CACHED = ToolPolicy(name="order.lookup_cached", side_effect=READ)


def make_call(tool: ToolPolicy = REFUND, **kw) -> CallView:
    values = {
        "call_id": "refund_042",
        "tool": tool.name,
        "state": "RETRYABLE",
        "idempotency_key": "refund-order-8848-v3",
        "fingerprint": fingerprint(tool.name, ARGS),
        "attempts_made": 1,
        "max_attempts": 5,
        "first_sent_at": NOW - timedelta(minutes=1),
    }
    return CallView(**(values | kw))


def make_previous(tool: ToolPolicy = REFUND, **kw) -> PreviousAttempt:
    values = {
        "number": 1,
        "tool": tool.name,
        "fingerprint": fingerprint(tool.name, ARGS),
        "credential_version": 1,
        "failure_class": TRANSIENT,
        "phase": "dispatch",
        "side_effect": "not_sent",
        "finished_at": NOW - timedelta(seconds=10),
        "wait_ms": 2_000,
    }
    return PreviousAttempt(**(values | kw))


def make_candidate(tool: ToolPolicy = REFUND, **kw) -> Candidate:
    values = {"attempt_id": "att-2", "tool": tool.name, "arguments": ARGS, "credential_version": 1}
    return Candidate(**(values | kw))


def make_context(tool: ToolPolicy = REFUND, **kw) -> GateContext:
    values = {"now": NOW, "tool": tool, "previous": make_previous(tool)}
    return GateContext(**(values | kw))


def gate(*, tool: ToolPolicy = REFUND, call=None, candidate=None, **context):
    call = call or make_call(tool)
    candidate = candidate or make_candidate(tool, evidence=(TIME_ELAPSED,))
    return admit(call, candidate, make_context(tool, **context))


def checked(decision) -> list[tuple[str, bool]]:
    return [(c.name, c.passed) for c in decision.checks]


ALL_CHECKS = ["state", "preflight", "dependencies", "budgets", "evidence", "key_retention", "retry_path", "breaker"]


# --- the happy paths ------------------------------------------------------------------------------------------------


def test_it_admits_a_first_attempt_without_evidence():
    call = make_call(state="READY", attempts_made=0, first_sent_at=None)
    decision = admit(call, make_candidate(), make_context(previous=None))

    assert decision.allowed
    assert decision.reason == "first_attempt"
    assert decision.evidence_used == ""
    assert checked(decision) == [(name, True) for name in ALL_CHECKS]
    assert decision.required_next is None
    assert decision.public_message == MESSAGES["first_attempt"]


def test_it_admits_a_retry_after_its_backoff_has_elapsed():
    decision = gate()

    assert decision.allowed
    assert (decision.reason, decision.evidence_used) == ("admitted", TIME_ELAPSED)
    assert not decision.uses_probe


# --- state ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "reason", "action"),
    [
        ("UNKNOWN", "outcome_unknown", "wait_for_reconcile"),
        ("STILL_UNKNOWN", "outcome_unknown", "wait_for_reconcile"),
        ("HUMAN_REVIEW", "human_review", "request_approval"),
        ("COMMITTED", "committed", "stop"),
        ("SENT", "in_flight", "wait_for_reconcile"),
        ("ACCEPTED", "in_progress", "wait_for_reconcile"),
        ("NOT_COMMITTED", "not_committed", "wait_for_reconcile"),
        ("FAILED_PERMANENT", "state_final", "replan"),
        ("COMPENSATING", "state_final", "stop"),
        ("COMPENSATED", "state_final", "stop"),
        ("PARTIAL_COMPENSATED", "state_final", "stop"),
        ("COMPENSATION_FAILED", "state_final", "stop"),
    ],
)
def test_it_denies_a_state_that_allows_no_attempt(state, reason, action):
    decision = gate(call=make_call(state=state))

    assert not decision.allowed
    assert decision.reason == reason
    assert decision.required_next.action == action
    assert checked(decision) == [("state", False)]  # stops at the first failed check
    assert decision.public_message == MESSAGES[reason]


@pytest.mark.parametrize("state", ["UNKNOWN", "STILL_UNKNOWN", "HUMAN_REVIEW"])
def test_it_admits_an_approved_same_key_replay(state):
    previous = make_previous(failure_class=OUTCOME_UNKNOWN, phase="commit_unknown", side_effect="unknown")
    candidate = make_candidate(evidence=(APPROVAL_GRANTED,))

    decision = gate(call=make_call(state=state), candidate=candidate, previous=previous, approval_available=True)

    assert decision.allowed
    assert decision.evidence_used == APPROVAL_GRANTED


def test_it_wants_the_approval_claimed_even_when_one_exists():
    decision = gate(call=make_call(state="UNKNOWN"), approval_available=True)  # claims time_elapsed only

    assert not decision.allowed
    assert decision.reason == "no_new_evidence"
    assert decision.required_next.detail == {"evidence": [APPROVAL_GRANTED]}


# --- preflight ------------------------------------------------------------------------------------------------------


def test_it_denies_arguments_that_fail_the_schema_with_field_errors():
    candidate = make_candidate(arguments={"order_id": "8848", "amount_cents": "800.0"}, evidence=(ARGS_CHANGED,))

    decision = gate(candidate=candidate)

    assert (decision.reason, decision.required_next.action) == ("preflight", "repair_args")
    assert [e.field for e in decision.field_errors] == ["amount_cents"]
    assert checked(decision) == [("state", True), ("preflight", False)]
    assert "800.0" not in decision.public_message  # the model's own text is never echoed


def test_it_validates_an_alternate_against_its_own_schema():
    strict = replace(REFUND_V2, args_schema=REFUND_SCHEMA | {"required": ["order_id", "amount_cents", "currency"]})
    candidate = make_candidate(REFUND_V2, arguments={"order_id": "8848", "amount_cents": 800})

    decision = gate(candidate=candidate, candidate_tool=strict)

    assert decision.reason == "preflight"
    assert [e.field for e in decision.field_errors] == ["currency"]


def test_it_denies_a_tool_that_is_not_an_accepted_alternate():
    other = ToolPolicy(name="refund.force", side_effect=WRITE)
    candidate = make_candidate(other, evidence=(TOOL_CHANGED,))

    decision = gate(candidate=candidate, candidate_tool=other)

    assert (decision.reason, decision.required_next.action) == ("tool_not_allowed", "replan")
    assert decision.required_next.detail == {"alternates": ["refund.create_v2"]}


def test_it_denies_arguments_that_are_not_json():
    decision = gate(candidate=make_candidate(arguments={"amount_cents": float("nan")}))

    assert decision.reason == "preflight"
    assert decision.field_errors[0].field == "arguments"


# --- dependencies ---------------------------------------------------------------------------------------------------


def test_it_admits_when_every_dependency_committed():
    assert gate(dependencies={"c1": "COMMITTED", "c2": "COMMITTED"}).allowed


@pytest.mark.parametrize(
    ("pending", "action"),
    [
        ("UNKNOWN", "wait_for_reconcile"),
        ("STILL_UNKNOWN", "wait_for_reconcile"),
        ("ACCEPTED", "wait_for_reconcile"),
        ("SENT", "wait_for_reconcile"),
        ("FAILED_PERMANENT", "replan"),
        ("COMPENSATED", "replan"),
    ],
)
def test_it_blocks_on_a_dependency_that_has_not_committed(pending, action):
    decision = gate(dependencies={"c9": pending, "c1": "COMMITTED", "c3": "FAILED_PERMANENT"})

    assert decision.reason == "blocked_by_dependency"
    assert decision.required_next.action == action
    assert decision.required_next.detail == {"blocked_by": ["c3", "c9"]}
    assert checked(decision)[-1] == ("dependencies", False)


# --- budgets --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call_kw", "tool_budgets", "task", "limit"),
    [
        ({"attempts_made": 5}, Budgets(), TaskView(), "max_attempts"),  # the call's own resolved limit
        ({"max_attempts": None, "attempts_made": 2}, Budgets(max_attempts=2), TaskView(), "max_attempts"),
        ({"attempts_made": 3}, Budgets(), TaskView(budgets=Budgets(max_attempts=3)), "max_attempts"),
        ({}, Budgets(max_rounds=20), TaskView(rounds_used=10, budgets=Budgets(max_rounds=10)), "max_rounds"),
        ({}, Budgets(), TaskView(budgets=Budgets(deadline=NOW - timedelta(seconds=1))), "deadline"),
        ({}, Budgets(), TaskView(budgets=Budgets(deadline=NOW + timedelta(milliseconds=500))), "deadline"),
        ({}, Budgets(), TaskView(tokens_used=9_000, budgets=Budgets(token_budget=8_000)), "token_budget"),
        ({}, Budgets(write_retry=2), TaskView(write_retries_used=2, budgets=Budgets(write_retry=9)), "write_retry"),
    ],
)
def test_it_denies_an_attempt_past_a_budget(call_kw, tool_budgets, task, limit):
    tool = replace(REFUND, budgets=tool_budgets)

    decision = gate(tool=tool, call=make_call(**call_kw), task=task)

    assert decision.reason == f"budget_exhausted:{limit}"
    assert decision.required_next.action == "stop"
    assert decision.required_next.detail == {"limit": limit}
    assert checked(decision)[-1] == ("budgets", False)


def test_it_lets_a_deadline_that_fits_one_call_through():
    task = TaskView(budgets=Budgets(deadline=NOW + timedelta(seconds=1)))
    assert gate(task=task, call_estimate_ms=1_000).allowed


def test_it_counts_write_retries_only_after_a_writes_first_attempt():
    task = TaskView(write_retries_used=3, budgets=Budgets(write_retry=0))
    first = make_call(state="READY", attempts_made=0, first_sent_at=None)

    assert admit(first, make_candidate(), make_context(task=task, previous=None)).allowed
    assert gate(task=task).reason == "budget_exhausted:write_retry"
    read = gate(tool=LOOKUP, task=task)
    assert read.allowed


def test_it_holds_the_tasks_writes_past_its_unknown_budget():
    tolerated = TaskView(unsettled_unknowns=2, budgets=Budgets(unknown_budget=2))
    past = TaskView(unsettled_unknowns=3, budgets=Budgets(unknown_budget=2))

    assert gate(task=tolerated).allowed
    decision = gate(task=past)
    assert (decision.reason, decision.required_next.action) == ("unknown_budget", "wait_for_reconcile")
    assert gate(tool=LOOKUP, task=past).allowed  # reads go on


def test_it_holds_writes_on_one_unsettled_unknown_of_a_tool_with_budget_zero():
    tool = replace(REFUND, budgets=Budgets(unknown_budget=0))
    own = TaskView(unsettled_unknowns=1, unsettled_by_tool={"refund.create": 1})
    others = TaskView(unsettled_unknowns=4, unsettled_by_tool={"order.cancel": 4})

    assert gate(tool=tool, task=own).reason == "unknown_budget"
    assert gate(tool=tool, task=others).allowed  # a tool's budget counts that tool's unknowns


def test_one_unsettled_grant_of_a_budget_zero_tool_holds_every_write_of_the_task():
    """docs/design/budgets.md: an access grant in doubt (unknown_budget 0) blocks the task's refunds too, until it
    settles."""
    grant_in_doubt = TaskView(
        unsettled_unknowns=1, unsettled_by_tool={"access.grant": 1}, unknown_budget_by_tool={"access.grant": 0}
    )
    decision = gate(task=grant_in_doubt)  # a refund.create call of the same task
    assert (decision.reason, decision.required_next.action) == ("unknown_budget", "wait_for_reconcile")
    assert gate(tool=LOOKUP, task=grant_in_doubt).allowed  # reads go on
    tolerant = TaskView(unsettled_unknowns=1, unsettled_by_tool={"access.grant": 1}, unknown_budget_by_tool={})
    assert gate(task=tolerant).allowed


def test_it_does_not_hold_a_calls_own_unknown_against_its_approved_replay():
    tool = replace(REFUND, budgets=Budgets(unknown_budget=0))
    task = TaskView(unsettled_unknowns=1, unsettled_by_tool={"refund.create": 1}, budgets=Budgets(unknown_budget=0))
    previous = make_previous(tool, failure_class=OUTCOME_UNKNOWN, side_effect="unknown")
    candidate = make_candidate(evidence=(APPROVAL_GRANTED,))

    decision = gate(
        tool=tool,
        call=make_call(state="UNKNOWN"),
        candidate=candidate,
        previous=previous,
        task=task,
        approval_available=True,
    )

    assert decision.allowed


# --- evidence, kind by kind -----------------------------------------------------------------------------------------


def test_it_denies_time_elapsed_before_the_backoff_has_elapsed():
    previous = make_previous(finished_at=NOW - timedelta(milliseconds=500), wait_ms=2_000)

    decision = gate(previous=previous)

    assert decision.reason == "no_new_evidence"
    assert (decision.required_next.action, decision.required_next.after_ms) == ("retry_after", 1_500)
    assert checked(decision)[-1] == ("evidence", False)


@pytest.mark.parametrize("failure_class", [AUTHENTICATION, AUTHORIZATION, INVALID_ARGUMENTS, UNRECOVERABLE])
def test_it_never_admits_the_same_call_on_time_alone_after_a_non_transient_failure(failure_class):
    long_ago = NOW - timedelta(days=3)
    previous = make_previous(LOOKUP, failure_class=failure_class, side_effect="not_executed", finished_at=long_ago)

    decision = gate(tool=LOOKUP, previous=previous)

    assert decision.reason == "no_new_evidence"
    assert TIME_ELAPSED not in decision.required_next.detail["evidence"]


def test_it_admits_time_elapsed_after_a_reads_invalid_result():
    previous = make_previous(LOOKUP, failure_class=INVALID_RESULT, side_effect="none_confirmed")
    assert gate(tool=LOOKUP, previous=previous).evidence_used == TIME_ELAPSED


def test_it_denies_time_elapsed_after_a_writes_invalid_result():
    previous = make_previous(failure_class=INVALID_RESULT, side_effect="unknown", finished_at=NOW - timedelta(days=1))

    decision = gate(previous=previous)

    assert decision.reason == "no_new_evidence"
    assert decision.required_next.action == "wait_for_reconcile"
    assert decision.required_next.detail == {"evidence": [STATE_VERIFIED, APPROVAL_GRANTED]}


def test_it_admits_changed_arguments_after_a_validation_rejection():
    previous = make_previous(failure_class=INVALID_ARGUMENTS, side_effect="not_executed")
    candidate = make_candidate(arguments=ARGS | {"amount_cents": 750}, evidence=(ARGS_CHANGED,))

    assert gate(previous=previous, candidate=candidate).evidence_used == ARGS_CHANGED


def test_it_denies_args_changed_when_the_arguments_are_the_same():
    previous = make_previous(failure_class=INVALID_ARGUMENTS, side_effect="not_executed")
    candidate = make_candidate(arguments=dict(reversed(ARGS.items())), evidence=(ARGS_CHANGED,))  # key order only

    decision = gate(previous=previous, candidate=candidate)

    assert (decision.reason, decision.required_next.action) == ("no_new_evidence", "repair_args")
    assert decision.required_next.detail["evidence"][0] == ARGS_CHANGED


def test_it_denies_args_changed_when_the_previous_attempt_may_have_been_executed():
    # A read's invalid result: the provider did run it, so different arguments prove no repair of a rejection.
    previous = make_previous(LOOKUP, failure_class=INVALID_RESULT, side_effect="none_confirmed", wait_ms=60_000)
    candidate = make_candidate(LOOKUP, arguments={"order_id": "9"}, evidence=(ARGS_CHANGED,))

    assert gate(tool=LOOKUP, previous=previous, candidate=candidate).reason == "no_new_evidence"


def test_it_locks_a_writes_arguments_once_an_effect_may_exist():
    previous = make_previous(failure_class=OUTCOME_UNKNOWN, side_effect="unknown")
    candidate = make_candidate(arguments=ARGS | {"amount_cents": 750}, evidence=(ARGS_CHANGED, STATE_VERIFIED))

    decision = gate(previous=previous, candidate=candidate, latest_receipt="not_committed", latest_receipt_at=NOW)

    assert (decision.reason, decision.required_next.action) == ("args_locked", "replan")


def test_it_admits_a_refreshed_credential_after_an_authentication_failure():
    previous = make_previous(failure_class=AUTHENTICATION, side_effect="not_executed", credential_version=3)
    candidate = make_candidate(credential_version=4, evidence=(CREDENTIAL_REFRESHED,))

    assert gate(previous=previous, candidate=candidate).evidence_used == CREDENTIAL_REFRESHED


@pytest.mark.parametrize(("old", "new"), [(3, 3), (3, 2), (None, 4), (3, None)])
def test_it_denies_a_credential_that_is_not_newer(old, new):
    previous = make_previous(failure_class=AUTHENTICATION, side_effect="not_executed", credential_version=old)
    candidate = make_candidate(credential_version=new, evidence=(CREDENTIAL_REFRESHED,))

    decision = gate(previous=previous, candidate=candidate)

    assert (decision.reason, decision.required_next.action) == ("no_new_evidence", "refresh_credentials")


def test_it_admits_an_accepted_alternate_after_nothing_was_executed():
    previous = make_previous(failure_class=CAPABILITY_MISSING, side_effect="not_executed")
    candidate = make_candidate(REFUND_V2, evidence=(TOOL_CHANGED,))

    decision = gate(previous=previous, candidate=candidate, candidate_tool=REFUND_V2)

    assert decision.evidence_used == TOOL_CHANGED


def test_it_never_substitutes_a_write_whose_effect_may_exist():
    previous = make_previous(failure_class=OUTCOME_UNKNOWN, side_effect="unknown")
    candidate = make_candidate(REFUND_V2, evidence=(TOOL_CHANGED,))

    decision = gate(previous=previous, candidate=candidate, candidate_tool=REFUND_V2)

    assert (decision.reason, decision.required_next.action) == ("args_locked", "replan")


def test_it_denies_tool_changed_for_a_read_that_was_executed():
    previous = make_previous(LOOKUP, failure_class=INVALID_RESULT, side_effect="none_confirmed", wait_ms=60_000)
    candidate = make_candidate(LOOKUP_CACHED, evidence=(TOOL_CHANGED,))

    decision = gate(tool=LOOKUP, previous=previous, candidate=candidate, candidate_tool=LOOKUP_CACHED)

    assert decision.reason == "no_new_evidence"


def test_it_denies_tool_changed_when_the_tool_did_not_change():
    previous = make_previous(REFUND_V2, failure_class=INVALID_ARGUMENTS, side_effect="not_executed")
    candidate = make_candidate(REFUND_V2, evidence=(TOOL_CHANGED,))

    decision = gate(previous=previous, candidate=candidate, candidate_tool=REFUND_V2)

    assert decision.reason == "no_new_evidence"


def test_it_admits_a_same_key_retry_after_a_receipt_says_not_committed():
    previous = make_previous(failure_class=OUTCOME_UNKNOWN, side_effect="unknown")
    candidate = make_candidate(evidence=(STATE_VERIFIED,))
    receipt_at = previous.finished_at + timedelta(seconds=5)

    decision = gate(
        previous=previous, candidate=candidate, latest_receipt="not_committed", latest_receipt_at=receipt_at
    )

    assert decision.evidence_used == STATE_VERIFIED


@pytest.mark.parametrize(
    ("observation", "age"),
    [("not_committed", timedelta(seconds=-1)), ("not_committed", timedelta(0)), ("pending", timedelta(seconds=5))],
)
def test_it_denies_state_verified_without_a_newer_not_committed_receipt(observation, age):
    previous = make_previous(failure_class=OUTCOME_UNKNOWN, side_effect="unknown")
    candidate = make_candidate(evidence=(STATE_VERIFIED,))

    decision = gate(
        previous=previous, candidate=candidate, latest_receipt=observation, latest_receipt_at=previous.finished_at + age
    )

    assert (decision.reason, decision.required_next.action) == ("no_new_evidence", "wait_for_reconcile")


def test_it_admits_an_approval_and_denies_its_absence():
    previous = make_previous(failure_class=AUTHORIZATION, side_effect="not_executed")
    candidate = make_candidate(evidence=(APPROVAL_GRANTED,))

    assert gate(previous=previous, candidate=candidate, approval_available=True).evidence_used == APPROVAL_GRANTED
    denied = gate(previous=previous, candidate=candidate, approval_available=False)
    assert (denied.reason, denied.required_next.action) == ("no_new_evidence", "request_approval")


def test_it_denies_an_identical_attempt_after_outcome_unknown_with_wait_for_reconcile():
    previous = make_previous(failure_class=OUTCOME_UNKNOWN, side_effect="unknown", finished_at=NOW - timedelta(days=1))
    # Even a fresh credential is no evidence that the first request did not take effect.
    candidate = make_candidate(credential_version=2, evidence=(TIME_ELAPSED, CREDENTIAL_REFRESHED))

    decision = gate(previous=previous, candidate=candidate)

    assert decision.reason == "no_new_evidence"
    assert decision.required_next.action == "wait_for_reconcile"
    assert decision.required_next.detail == {"evidence": [STATE_VERIFIED, APPROVAL_GRANTED]}


def test_it_uses_the_first_claimed_kind_that_holds():
    previous = make_previous(failure_class=AUTHORIZATION, side_effect="not_executed")
    candidate = make_candidate(
        credential_version=2, evidence=("vibes", ARGS_CHANGED, CREDENTIAL_REFRESHED, APPROVAL_GRANTED)
    )

    decision = gate(previous=previous, candidate=candidate, approval_available=True)

    assert decision.evidence_used == CREDENTIAL_REFRESHED
    evidence_check = next(c for c in decision.checks if c.name == "evidence")
    assert "vibes" not in evidence_check.detail


# --- key retention --------------------------------------------------------------------------------------------------


def test_it_denies_a_same_key_replay_after_the_provider_forgot_the_key():
    call = make_call(first_sent_at=NOW - timedelta(seconds=REFUND.key_retention_s))

    decision = gate(call=call)

    assert (decision.reason, decision.required_next.action) == ("key_expired", "request_approval")
    assert checked(decision)[-1] == ("key_retention", False)


def test_it_admits_a_replay_while_the_key_is_kept():
    assert gate(call=make_call(first_sent_at=NOW - timedelta(seconds=REFUND.key_retention_s - 1))).allowed


def test_it_does_not_apply_key_retention_to_reads():
    call = make_call(LOOKUP, first_sent_at=NOW - timedelta(days=30))
    assert gate(tool=LOOKUP, call=call).allowed


# --- the retry path (docs/replay.md) and replay reconciliation (docs/replay.md) ---------------------------------------

SAFE_REFUND = replace(REFUND, replay_safe=True, retry_path="safe", retry_path_key_age_s=3_600)
UNSAFE_REFUND = replace(SAFE_REFUND, retry_path="unsafe", retry_path_key_age_s=None)
UNKNOWN_PREVIOUS = {"failure_class": OUTCOME_UNKNOWN, "phase": "commit_unknown", "side_effect": "unknown"}


def replay_reconcile(tool: ToolPolicy, *, state: str = "STILL_UNKNOWN", age_s: int = 60, **context):
    call = make_call(tool, state=state, first_sent_at=NOW - timedelta(seconds=age_s))
    candidate = make_candidate(tool, evidence=("replay_reconcile",))
    values = {"status_unavailable": True, "previous": make_previous(tool, **UNKNOWN_PREVIOUS)} | context
    return admit(call, candidate, make_context(tool, **values))


def test_an_unsafe_retry_path_refuses_a_same_key_retry_after_a_possible_effect():
    previous = make_previous(UNSAFE_REFUND, **UNKNOWN_PREVIOUS)
    receipt = {"latest_receipt": "not_committed", "latest_receipt_at": NOW - timedelta(seconds=1)}
    candidate = make_candidate(UNSAFE_REFUND, evidence=(STATE_VERIFIED,))

    decision = gate(tool=UNSAFE_REFUND, candidate=candidate, previous=previous, **receipt)

    assert (decision.reason, decision.required_next.action) == ("retry_path_unsafe", "stop")
    assert checked(decision)[-1] == ("retry_path", False)
    assert "ignore idempotency keys" in decision.public_message
    # The same retry on a tool nobody probed is admitted: the runtime's state_verified vouches for it.
    assert gate(tool=replace(UNSAFE_REFUND, retry_path="unprobed"), candidate=candidate, previous=previous, **receipt)


def test_a_provably_unsent_retry_is_not_a_replay_even_on_an_unsafe_tool():
    decision = gate(tool=UNSAFE_REFUND, previous=make_previous(UNSAFE_REFUND, side_effect="not_sent"))
    assert decision.allowed
    assert dict(checked(decision))["retry_path"] is True


def test_replay_reconciliation_is_admitted_on_a_proved_tool_for_a_young_key():
    decision = replay_reconcile(SAFE_REFUND)

    assert decision.allowed and decision.evidence_used == "replay_reconcile"
    assert checked(decision) == [(name, True) for name in ALL_CHECKS]


@pytest.mark.parametrize(
    "tool, reason",
    [
        (replace(SAFE_REFUND, retry_path="unprobed", retry_path_key_age_s=None), "retry_path_unprobed"),
        (UNSAFE_REFUND, "retry_path_unsafe"),
        (replace(SAFE_REFUND, replay_safe=False), "retry_path_unsafe"),
    ],
)
def test_replay_reconciliation_needs_a_safe_probe(tool, reason):
    decision = replay_reconcile(tool)
    assert (decision.reason, decision.required_next.action) == (reason, "wait_for_reconcile")
    assert checked(decision)[-1] == ("retry_path", False)


@pytest.mark.parametrize(
    "age_s, covered_s, kept_s, allowed",
    [
        (3_599, 3_600, 86_400, True),
        (3_600, 3_600, 86_400, False),
        (3_599, 3_600, 3_899, False),
        (3_598, 3_600, 3_899, True),
    ],
)
def test_replay_reconciliation_never_replays_a_key_past_the_probe_or_the_retention_margin(
    age_s, covered_s, kept_s, allowed
):
    tool = replace(SAFE_REFUND, retry_path_key_age_s=covered_s, key_retention_s=kept_s)
    decision = replay_reconcile(tool, age_s=age_s)
    assert decision.allowed is allowed
    if not allowed:
        assert decision.reason == "replay_key_too_old"
        assert decision.required_next.detail["limit_s"] == min(covered_s, kept_s - 300)


def test_replay_reconcile_evidence_holds_only_when_reconciliation_says_the_status_query_cannot_answer():
    decision = replay_reconcile(SAFE_REFUND, status_unavailable=False)  # a runtime cannot claim it
    assert (decision.reason, decision.required_next.action) == ("outcome_unknown", "wait_for_reconcile")
    assert "replay_reconcile" not in str(decision.required_next.detail)


def test_replay_reconciliation_is_last_refused_by_the_tools_breaker():
    decision = replay_reconcile(SAFE_REFUND, breaker=BreakerView(state=OPEN, probe_available=False, retry_in_ms=5_000))
    assert decision.reason == "breaker_open"
    assert checked(decision) == [(name, name != "breaker") for name in ALL_CHECKS]


# --- breaker, last --------------------------------------------------------------------------------------------------


def test_it_fails_fast_with_degrade_while_the_breaker_is_open():
    decision = gate(breaker=BreakerView(state=OPEN, probe_available=False, retry_in_ms=12_000))

    assert (decision.reason, decision.required_next.action) == ("breaker_open", "degrade")
    assert decision.required_next.after_ms == 12_000
    assert decision.required_next.detail["fallback"] == "read_only_summary"
    assert checked(decision) == [(name, name != "breaker") for name in ALL_CHECKS]


def test_it_denies_while_forced_open():
    decision = gate(breaker=BreakerView(state=FORCED_OPEN, probe_available=False))
    assert (decision.reason, decision.required_next.action) == ("breaker_open", "degrade")
    assert decision.required_next.after_ms == 0 and decision.required_next.detail["forced_open"] is True
    assert decision.checks[-1].detail == "breaker forced_open by an operator; only an operator's reset closes it"


def test_a_forced_open_denial_names_the_operator_and_the_reason():
    breaker = BreakerView(state=FORCED_OPEN, probe_available=False, forced_by="alice", forced_reason="INC-42")
    decision = gate(breaker=breaker)
    assert decision.checks[-1].detail == (
        "breaker forced_open by an operator: alice, INC-42; only an operator's reset closes it"
    )


def test_it_admits_the_half_open_probe_and_only_it():
    probe = gate(breaker=BreakerView(state=HALF_OPEN, probe_available=True))
    taken = gate(breaker=BreakerView(state=HALF_OPEN, probe_available=False))

    assert probe.allowed and probe.uses_probe
    assert not taken.allowed and taken.reason == "breaker_open" and not taken.uses_probe


def test_it_never_spends_the_probe_on_an_attempt_denied_earlier():
    previous = make_previous(finished_at=NOW, wait_ms=5_000)  # backoff not over

    decision = gate(previous=previous, breaker=BreakerView(state=HALF_OPEN, probe_available=True))

    assert decision.reason == "no_new_evidence"
    assert not decision.uses_probe
    assert "breaker" not in [c.name for c in decision.checks]


def test_it_reports_the_budget_before_the_breaker():
    task = TaskView(rounds_used=10, budgets=Budgets(max_rounds=10))
    decision = gate(task=task, breaker=BreakerView(state=OPEN, probe_available=False))
    assert decision.reason == "budget_exhausted:max_rounds"


# --- duplicate intent -----------------------------------------------------------------------------------------------


def test_it_refuses_a_second_write_with_the_same_intent():
    fp = fingerprint(REFUND.name, ARGS)
    existing = [("c1", "other", "COMMITTED"), ("c2", fp, "UNKNOWN")]
    assert duplicate_intent(side_effect=WRITE, fingerprint=fp, existing=existing) == "c2"


def test_it_allows_a_new_write_after_a_failed_permanent_original():
    fp = fingerprint(REFUND.name, ARGS)
    existing = [("c1", fp, "FAILED_PERMANENT"), ("c2", "other", "READY")]
    assert duplicate_intent(side_effect=WRITE, fingerprint=fp, existing=existing) is None


def test_it_never_conflicts_reads():
    fp = fingerprint(LOOKUP.name, ARGS)
    assert duplicate_intent(side_effect=READ, fingerprint=fp, existing=[("c1", fp, "COMMITTED")]) is None


# --- properties -----------------------------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=5)
evidence = st.lists(st.sampled_from(EVIDENCE_KINDS), unique=True, max_size=6).map(tuple)
side_effects = st.sampled_from(["not_sent", "not_executed", "unknown", "executed", "none_confirmed", None])
non_transient = st.sampled_from(
    [
        INVALID_ARGUMENTS,
        AUTHENTICATION,
        AUTHORIZATION,
        CAPABILITY_MISSING,
        OUTCOME_UNKNOWN,
        INVALID_RESULT,
        UNRECOVERABLE,
    ]
)
breakers = st.builds(
    BreakerView,
    state=st.sampled_from([CLOSED, OPEN, HALF_OPEN, FORCED_OPEN]),
    probe_available=st.booleans(),
    retry_in_ms=st.integers(0, 60_000),
)


@given(
    tool=st.sampled_from([REFUND, LOOKUP]),
    failure_class=non_transient,
    side_effect=side_effects,
    elapsed_s=st.integers(min_value=0, max_value=10 * 365 * 86_400),
    wait_ms=st.integers(min_value=0, max_value=600_000),
    claimed=evidence,
    credential=st.none() | st.integers(0, 5),
    state=st.sampled_from(["RETRYABLE", "UNKNOWN", "STILL_UNKNOWN", "HUMAN_REVIEW"]),
)
def test_it_never_admits_an_identical_candidate_after_a_non_transient_failure(
    tool, failure_class, side_effect, elapsed_s, wait_ms, claimed, credential, state
):
    if failure_class == INVALID_RESULT and not tool.is_write:
        failure_class = UNRECOVERABLE  # a read's invalid result is the one non-transient case time may fix
    previous = make_previous(
        tool,
        failure_class=failure_class,
        side_effect=side_effect,
        credential_version=credential,
        finished_at=NOW - timedelta(seconds=elapsed_s),
        wait_ms=wait_ms,
    )
    candidate = make_candidate(tool, credential_version=credential, evidence=claimed)
    call = make_call(tool, state=state, first_sent_at=None)

    decision = admit(call, candidate, make_context(tool, previous=previous))

    assert not decision.allowed
    assert not decision.uses_probe


@given(
    tool=st.sampled_from([REFUND, LOOKUP]),
    args=arguments,
    claimed=evidence,
    approval=st.booleans(),
    receipt=st.sampled_from([None, "not_committed", "committed"]),
    credential=st.none() | st.integers(0, 5),
    failure_class=st.none() | st.sampled_from([TRANSIENT, OUTCOME_UNKNOWN, INVALID_ARGUMENTS]),
    breaker=breakers,
)
def test_it_never_admits_a_committed_call(tool, args, claimed, approval, receipt, credential, failure_class, breaker):
    previous = make_previous(
        tool, failure_class=failure_class, side_effect="not_sent", finished_at=NOW - timedelta(days=9)
    )
    candidate = make_candidate(tool, arguments=args, credential_version=credential, evidence=claimed)
    context = make_context(
        tool,
        previous=previous,
        approval_available=approval,
        latest_receipt=receipt,
        latest_receipt_at=NOW,
        breaker=breaker,
    )

    decision = admit(make_call(tool, state="COMMITTED"), candidate, context)

    assert not decision.allowed
    assert decision.reason == "committed"


@given(
    state=st.sampled_from(["READY", "RETRYABLE", "UNKNOWN", "HUMAN_REVIEW", "COMMITTED"]),
    claimed=evidence,
    approval=st.booleans(),
    elapsed_ms=st.integers(0, 10_000),
    breaker=breakers,
    rounds=st.integers(0, 12),
)
def test_it_only_ever_reports_a_probe_on_an_admitted_half_open_attempt(
    state, claimed, approval, elapsed_ms, breaker, rounds
):
    previous = make_previous(finished_at=NOW - timedelta(milliseconds=elapsed_ms), wait_ms=5_000)
    context = make_context(
        previous=previous,
        approval_available=approval,
        breaker=breaker,
        task=TaskView(rounds_used=rounds, budgets=Budgets(max_rounds=10)),
    )

    decision = admit(make_call(state=state), make_candidate(evidence=claimed), context)

    assert decision.uses_probe == (decision.allowed and breaker.state == HALF_OPEN)
    if decision.uses_probe:
        assert [c.name for c in decision.checks] == ALL_CHECKS


@given(args=arguments, data=st.data())
def test_the_fingerprint_is_stable_under_key_order(args, data):
    shuffled = dict(data.draw(st.permutations(list(args.items()))))
    assert fingerprint(REFUND.name, shuffled) == fingerprint(REFUND.name, args)


@given(args=arguments.filter(bool), data=st.data(), new_value=json_scalars)
def test_the_fingerprint_differs_when_a_business_field_differs(args, data, new_value):
    key = data.draw(st.sampled_from(sorted(args)))
    changed = args | {key: new_value}
    if canonical_json(new_value) == canonical_json(args[key]):
        changed[key] = [new_value, "changed"]
    assert fingerprint(REFUND.name, changed) != fingerprint(REFUND.name, args)
    assert fingerprint(REFUND.name, args) != fingerprint(LOOKUP.name, args)

"""Circuit breaker rules (docs/breakers.md) over counts and time, without storage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recovery.engine.breaker import (
    BreakerRow,
    after_outcome,
    after_probe,
    effective_state,
    probe_lease_expired,
    probe_lease_until,
    should_open,
    view_of_row,
    window_totals,
)
from recovery.engine.classify import counts_as_failure
from recovery.engine.types import (
    AUTHENTICATION,
    AUTHORIZATION,
    CLOSED,
    FORCED_OPEN,
    HALF_OPEN,
    INVALID_ARGUMENTS,
    INVALID_RESULT,
    OPEN,
    OUTCOME_UNKNOWN,
    TRANSIENT,
    UNRECOVERABLE,
    BreakerPolicy,
)

POLICY = BreakerPolicy(window_s=60, bucket_s=10, min_calls=10, failure_rate=0.5, cooldown_s=30, half_open_probes=1)


@pytest.mark.parametrize(
    ("state", "failure_class", "http_status", "counted"),
    [
        ("COMMITTED", None, 200, False),
        ("ACCEPTED", None, 202, False),
        ("10", None, 201, False),  # the docs/design/classification.md row names a success too
        ("RETRYABLE", TRANSIENT, 503, True),
        ("RETRYABLE", TRANSIENT, 429, True),
        ("RETRYABLE", TRANSIENT, None, True),  # connection refused: no status at all
        ("UNKNOWN", OUTCOME_UNKNOWN, None, True),  # a write's read timeout
        ("UNKNOWN", OUTCOME_UNKNOWN, 502, True),
        ("HUMAN_REVIEW", None, 500, True),  # any 5xx, whatever it was classified as
        ("RETRYABLE", INVALID_ARGUMENTS, 422, None),
        ("RETRYABLE", AUTHENTICATION, 401, None),
        ("FAILED_PERMANENT", AUTHORIZATION, 403, None),
        ("RETRYABLE", INVALID_RESULT, 200, None),  # the provider answered; the agent's data was bad
        ("FAILED_PERMANENT", UNRECOVERABLE, 410, None),
        ("HUMAN_REVIEW", None, 200, None),  # a hard stop on a 2xx says nothing about the provider's health
    ],
)
def test_it_counts_only_health_failures(state, failure_class, http_status, counted):
    assert counts_as_failure(state, failure_class, http_status) is counted


def test_it_puts_a_time_in_its_bucket():
    assert POLICY.bucket_of(1_000_009.9) == 1_000_000
    assert POLICY.bucket_of(1_000_010) == 1_000_010


def test_it_totals_only_the_buckets_inside_the_window():
    now = 1_000_005  # current bucket 1_000_000; window = the six buckets 999_950 .. 1_000_000
    buckets = [
        (999_940, 100, 100),  # just outside the window
        (999_950, 3, 1),
        (999_990, 2, 2),
        (1_000_000, 1, 4),
        (1_000_010, 50, 50),  # from a clock running ahead
    ]
    assert window_totals(buckets, POLICY, now) == (13, 7)


def test_it_opens_at_min_calls_and_the_failure_rate():
    assert should_open(10, 5, POLICY)
    assert not should_open(9, 9, POLICY)  # too few calls to judge
    assert not should_open(10, 4, POLICY)
    assert not should_open(0, 0, BreakerPolicy(min_calls=0))


@given(calls=st.integers(min_value=0, max_value=10_000), data=st.data())
def test_it_opens_exactly_when_the_rate_is_reached(calls, data):
    failures = data.draw(st.integers(min_value=0, max_value=calls))
    opens = should_open(calls, failures, POLICY)
    assert opens == (calls >= POLICY.min_calls and failures >= POLICY.failure_rate * calls)


def test_it_stays_open_during_the_cooldown():
    view = effective_state(OPEN, 1_000, POLICY, 1_012.5)
    assert (view.state, view.probe_available, view.retry_in_ms) == (OPEN, False, 17_500)


def test_it_reads_half_open_after_the_cooldown():
    view = effective_state(OPEN, 1_000, POLICY, 1_030)
    assert (view.state, view.probe_available) == (HALF_OPEN, True)


def test_it_admits_only_the_configured_number_of_probes():
    assert not effective_state(HALF_OPEN, 1_000, POLICY, 2_000, live_probes=1).probe_available
    two = BreakerPolicy(half_open_probes=2)
    assert effective_state(OPEN, 1_000, two, 2_000, live_probes=1).probe_available


def test_it_never_decays_a_forced_open_breaker():
    view = effective_state(FORCED_OPEN, 0, POLICY, 10**9)
    assert (view.state, view.probe_available) == (FORCED_OPEN, False)


def test_it_reads_closed_as_closed():
    assert effective_state(CLOSED, None, POLICY, 1_000).state == CLOSED


def test_it_closes_on_a_probe_success_and_reopens_on_a_failure():
    assert after_probe(True) == CLOSED
    assert after_probe(False) == OPEN


def test_it_frees_a_crashed_probers_lease():
    until = probe_lease_until(1_000, POLICY)
    assert until == 1_000 + POLICY.probe_lease_s
    assert not probe_lease_expired(until, until - 1)
    assert probe_lease_expired(until, until)
    assert probe_lease_expired(None, 0)


# --- one outcome: after_outcome, the step the storage asks for once per outcome ------------------------------------

NOW = 2_000_000.0


def step(row: BreakerRow, failed: bool | None, *, probe: bool = False, calls: int = 10, failures: int = 5):
    return after_outcome(
        row, failed=failed, probe=probe, calls=calls, failures=failures, policy=POLICY, now_epoch_s=NOW
    )


@pytest.mark.parametrize(
    ("row", "failed", "probe", "calls", "failures", "change"),
    [
        (BreakerRow(), True, False, 10, 5, (CLOSED, OPEN, "opened")),  # no row yet: the first opening
        (BreakerRow(CLOSED), True, False, 10, 5, (CLOSED, OPEN, "opened")),
        (BreakerRow(CLOSED), False, False, 10, 5, (CLOSED, OPEN, "opened")),  # a success that keeps the rate up
        (BreakerRow(CLOSED), True, False, 9, 9, None),  # below min_calls
        (BreakerRow(CLOSED), True, False, 10, 4, None),  # below the rate
        (BreakerRow(CLOSED), None, False, 10, 10, None),  # not counted: nothing moves
        (BreakerRow(OPEN, NOW - 1), True, False, 50, 50, None),  # open already
        (BreakerRow(FORCED_OPEN, NOW - 1), False, True, 1, 0, None),  # only an operator moves it
        (BreakerRow(HALF_OPEN, NOW - 40, 1, NOW + 20), False, True, 1, 0, (HALF_OPEN, CLOSED, "closed")),
        (BreakerRow(HALF_OPEN, NOW - 40, 1, NOW + 20), True, True, 1, 1, (HALF_OPEN, OPEN, "reopened")),
        (BreakerRow(HALF_OPEN, NOW - 40, 1, NOW + 20), None, True, 1, 1, None),  # its reservation stays
        (BreakerRow(HALF_OPEN, NOW - 40, 1, NOW + 20), True, False, 10, 10, None),  # not the probe: waits for it
        (BreakerRow(CLOSED), True, True, 10, 5, (CLOSED, OPEN, "opened")),  # a probe after another settled it
    ],
)
def test_one_outcome_moves_the_breaker_as_the_rules_say(row, failed, probe, calls, failures, change):
    result = step(row, failed, probe=probe, calls=calls, failures=failures)
    assert ((result.from_state, result.to_state, result.event) if result.to_state else None) == change
    assert result.reset_counts == (change is not None and change[2] == "closed")


def test_an_opening_says_why_and_reads_open_for_the_cooldown():
    result = step(BreakerRow(CLOSED), True, calls=12, failures=7)
    assert result.reason == "7 of 12 calls failed in the last 60 s (opens at 50% with at least 10 calls)"
    assert result.evidence == {"calls": 12, "failures": 7, "window_s": 60}
    assert (result.view.state, result.view.retry_in_ms) == (OPEN, 30_000)


def test_a_probe_says_how_it_went():
    probing = BreakerRow(HALF_OPEN, NOW - 40, 1, NOW + 20)
    closed, reopened = step(probing, False, probe=True), step(probing, True, probe=True)
    assert (closed.reason, closed.evidence, closed.view.state) == (
        "the half-open probe succeeded",
        {"probe": "succeeded"},
        CLOSED,
    )
    assert (reopened.reason, reopened.evidence) == (
        "the half-open probe failed: a new cooldown starts",
        {"probe": "failed"},
    )
    assert (reopened.view.state, reopened.view.retry_in_ms) == (OPEN, 30_000)


def test_without_a_change_it_reads_the_row_as_admission_does():
    assert step(BreakerRow(OPEN, NOW - 12.5), True).view == view_of_row(BreakerRow(OPEN, NOW - 12.5), POLICY, NOW)
    assert view_of_row(BreakerRow(), POLICY, NOW).state == CLOSED
    held, lapsed = BreakerRow(HALF_OPEN, NOW - 40, 1, NOW + 1), BreakerRow(HALF_OPEN, NOW - 40, 1, NOW)
    assert not view_of_row(held, POLICY, NOW).probe_available  # its one probe is out under a live lease
    assert view_of_row(lapsed, POLICY, NOW).probe_available  # the lease ran out: free again

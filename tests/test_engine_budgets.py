"""Budgets and backoff (docs/design/budgets.md): the tighter-wins scope rule, the capped jittered delay, the deadline
check."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recovery.engine.budgets import backoff_delay, exhausted_limit, fits_deadline, remaining_ms, tighter
from recovery.engine.types import BackoffPolicy, Budgets

NOW = datetime(2026, 8, 20, 18, 0, tzinfo=UTC)

limits = st.none() | st.integers(min_value=0, max_value=1_000)
deadlines = st.none() | st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(UTC)
)
budgets = st.builds(
    Budgets,
    max_attempts=limits,
    max_rounds=limits,
    deadline=deadlines,
    token_budget=limits,
    write_retry=limits,
    unknown_budget=limits,
    max_business_effects=limits,
)
INT_FIELDS = ("max_attempts", "max_rounds", "token_budget", "write_retry", "unknown_budget", "max_business_effects")


# --- tighter() ------------------------------------------------------------------------------------------------------


def test_it_takes_the_smallest_limit_and_the_earliest_deadline():
    tool = Budgets(max_attempts=5, write_retry=2, deadline=NOW + timedelta(hours=1))
    task = Budgets(max_attempts=3, max_rounds=10, deadline=NOW + timedelta(minutes=5))

    merged = tighter(tool, task)

    assert merged.max_attempts == 3
    assert merged.write_retry == 2  # only the tool sets it: None means "no limit from the task"
    assert merged.max_rounds == 10
    assert merged.deadline == NOW + timedelta(minutes=5)
    assert merged.token_budget is None


def test_it_keeps_a_zero_limit():
    assert tighter(Budgets(unknown_budget=0), Budgets(unknown_budget=3)).unknown_budget == 0


def test_it_has_no_limits_without_scopes():
    assert tighter() == Budgets()


@given(st.lists(budgets, min_size=1, max_size=4))
def test_it_is_commutative(scopes):
    answers = {tighter(*order) for order in itertools.permutations(scopes)}
    assert len(answers) == 1


@given(st.lists(budgets, min_size=1, max_size=4))
def test_it_is_never_looser_than_any_scope(scopes):
    merged = tighter(*scopes)
    for scope in scopes:
        for name in (*INT_FIELDS, "deadline"):
            limit = getattr(scope, name)
            if limit is not None:
                assert getattr(merged, name) is not None
                assert getattr(merged, name) <= limit


# --- backoff_delay() ------------------------------------------------------------------------------------------------


def test_it_doubles_the_delay_within_twenty_percent():
    policy = BackoffPolicy(base_ms=1_000, cap_ms=1_000_000, jitter="proportional")
    rng = random.Random(7)
    for attempt, nominal in ((1, 1_000), (2, 2_000), (3, 4_000), (6, 32_000)):
        delay = backoff_delay(attempt, policy, retry_after_ms=None, rng=rng)
        assert 0.8 * nominal <= delay <= 1.2 * nominal


def test_it_applies_the_cap_after_the_jitter():
    policy = BackoffPolicy(base_ms=1_000, cap_ms=1_500, jitter="proportional")
    # 2 s nominal, jittered to at least 1.6 s: the cap must still win.
    delays = {backoff_delay(2, policy, retry_after_ms=None, rng=random.Random(seed)) for seed in range(50)}
    assert delays == {1_500}


def test_it_draws_full_jitter_between_zero_and_the_delay():
    policy = BackoffPolicy(base_ms=1_000, cap_ms=1_000_000, jitter="full")
    delays = [backoff_delay(3, policy, retry_after_ms=None, rng=random.Random(seed)) for seed in range(200)]
    assert all(0 <= d <= 4_000 for d in delays)
    assert min(delays) < 1_000 < max(delays) - 2_000  # spread over the whole range, not ±20 %


def test_it_lets_retry_after_win_even_above_the_cap():
    policy = BackoffPolicy(base_ms=500, cap_ms=2_000)
    assert backoff_delay(1, policy, retry_after_ms=60_000, rng=random.Random(1)) == 60_000
    assert backoff_delay(9, policy, retry_after_ms=0, rng=random.Random(1)) == 0
    assert backoff_delay(1, policy, retry_after_ms=-5, rng=random.Random(1)) == 0


def test_it_is_deterministic_for_a_seeded_rng():
    policy = BackoffPolicy(base_ms=300, cap_ms=60_000)
    first = [backoff_delay(n, policy, retry_after_ms=None, rng=random.Random(42)) for n in range(1, 8)]
    again = [backoff_delay(n, policy, retry_after_ms=None, rng=random.Random(42)) for n in range(1, 8)]
    assert first == again


def test_it_survives_absurd_attempt_numbers():
    policy = BackoffPolicy(base_ms=500, cap_ms=30_000, jitter="full")
    assert 0 <= backoff_delay(10_000, policy, retry_after_ms=None, rng=random.Random(3)) <= 30_000


def test_it_refuses_an_unknown_jitter():
    with pytest.raises(ValueError, match="jitter"):
        backoff_delay(1, BackoffPolicy(jitter="none"), retry_after_ms=None, rng=random.Random(0))


@given(
    attempt=st.integers(min_value=-3, max_value=200),
    base=st.integers(min_value=0, max_value=100_000),
    cap=st.integers(min_value=0, max_value=10_000_000),
    jitter=st.sampled_from(["proportional", "full"]),
    retry_after=st.none() | st.integers(min_value=-1_000, max_value=10_000_000),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_it_never_exceeds_the_cap_or_retry_after(attempt, base, cap, jitter, retry_after, seed):
    policy = BackoffPolicy(base_ms=base, cap_ms=cap, jitter=jitter)
    delay = backoff_delay(attempt, policy, retry_after_ms=retry_after, rng=random.Random(seed))
    assert 0 <= delay <= max(cap, retry_after or 0)
    if retry_after is not None:
        assert delay == max(0, retry_after)


# --- the deadline ---------------------------------------------------------------------------------------------------


def test_it_fits_anything_without_a_deadline():
    assert fits_deadline(now=NOW, deadline=None, wait_ms=10**9, call_estimate_ms=10**9)
    assert remaining_ms(now=NOW, deadline=None) is None


def test_it_needs_room_for_the_wait_plus_one_call():
    deadline = NOW + timedelta(seconds=10)
    assert fits_deadline(now=NOW, deadline=deadline, wait_ms=9_000, call_estimate_ms=1_000)
    assert not fits_deadline(now=NOW, deadline=deadline, wait_ms=9_001, call_estimate_ms=1_000)
    assert not fits_deadline(now=deadline + timedelta(milliseconds=1), deadline=deadline, wait_ms=0, call_estimate_ms=0)
    assert remaining_ms(now=NOW, deadline=deadline) == 10_000


@given(
    offset_ms=st.integers(min_value=-100_000, max_value=100_000),
    wait_ms=st.integers(min_value=0, max_value=200_000),
    call_ms=st.integers(min_value=0, max_value=50_000),
)
def test_it_never_approves_a_wait_that_ends_past_the_deadline(offset_ms, wait_ms, call_ms):
    deadline = NOW + timedelta(milliseconds=offset_ms)
    fits = fits_deadline(now=NOW, deadline=deadline, wait_ms=wait_ms, call_estimate_ms=call_ms)
    # A wait that fits leaves room for the call; one that does not would end (with its call) after the deadline.
    assert fits == (wait_ms + call_ms <= remaining_ms(now=NOW, deadline=deadline))
    if not fits:
        # ...and so would any longer wait: a caller told "no" can only stop, never wait more.
        assert not fits_deadline(now=NOW, deadline=deadline, wait_ms=wait_ms + 1, call_estimate_ms=call_ms)


# --- exhausted_limit() ----------------------------------------------------------------------------------------------


def _exhausted(budgets: Budgets, **kw) -> str | None:
    facts = {
        "attempts_made": 1,
        "rounds_used": 1,
        "tokens_used": 0,
        "is_write": True,
        "write_retries_used": 0,
        "now": NOW,
        "call_estimate_ms": 1_000,
    }
    return exhausted_limit(budgets=budgets, **(facts | kw))


@pytest.mark.parametrize(
    ("budgets", "facts", "limit"),
    [
        (Budgets(max_attempts=3), {"attempts_made": 3}, "max_attempts"),
        (Budgets(max_rounds=10), {"rounds_used": 10}, "max_rounds"),
        (Budgets(deadline=NOW), {}, "deadline"),
        (Budgets(deadline=NOW + timedelta(milliseconds=999)), {}, "deadline"),
        (Budgets(token_budget=5_000), {"tokens_used": 5_000}, "token_budget"),
        (Budgets(write_retry=2), {"write_retries_used": 2}, "write_retry"),
    ],
)
def test_it_names_the_exhausted_limit(budgets, facts, limit):
    assert _exhausted(budgets, **facts) == limit


def test_it_leaves_budget_just_below_every_limit():
    budgets = Budgets(
        max_attempts=3, max_rounds=10, token_budget=5_000, write_retry=2, deadline=NOW + timedelta(seconds=2)
    )
    assert _exhausted(budgets, attempts_made=2, rounds_used=9, tokens_used=4_999, write_retries_used=1) is None


def test_it_counts_write_retries_only_for_a_write_after_its_first_attempt():
    budgets = Budgets(write_retry=0)
    assert _exhausted(budgets, attempts_made=0) is None  # a first attempt is not a retry
    assert _exhausted(budgets, is_write=False) is None  # reads are not writes
    assert _exhausted(budgets, attempts_made=1) == "write_retry"

"""The drills' check API (recovery/drills/checks.py): a check holds when the observed value matches the expected one,
and both of its texts are rendered from the values, for plain equality and for each comparison. Pure Python."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from recovery.drills.checks import at_least, at_most, check, each, in_order, including, one_of, render
from recovery.drills.results import CheckRow

NOON = datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def test_a_check_passes_when_the_observed_value_equals_the_expected_one():
    expected = {"refund requests under the key": ["dropped_after_commit"], "connection opened": False}

    assert check("no second request", expected=expected, observed=dict(expected)) == CheckRow(
        name="no second request",
        expected="refund requests under the key: dropped_after_commit; connection opened: no",
        observed="refund requests under the key: dropped_after_commit; connection opened: no",
        passed=True,
    )


@pytest.mark.parametrize(
    "observed, text",
    [
        ({"refund requests": 2}, "refund requests: 2"),
        ({"refund requests": 1, "extra": 0}, "refund requests: 1; extra: 0"),  # a label the expectation lacks
        ({}, "none"),
        (None, "none"),
        ([1], "1"),
    ],
)
def test_a_check_fails_otherwise_and_says_what_was_observed(observed, text):
    row = check("no second request", expected={"refund requests": 1}, observed=observed)

    assert (row.passed, row.expected, row.observed) == (False, "refund requests: 1", text)


def test_sequences_match_item_by_item_and_lists_equal_tuples():
    assert check("keys", expected=["k", "k"], observed=("k", "k")).passed
    assert not check("keys", expected=["k", "k"], observed=["k"]).passed
    assert check("keys", expected=[("a", 1)], observed=[["a", 1]]).observed == "a, 1"


@pytest.mark.parametrize(
    "expected, observed, passed, expected_text, observed_text",
    [
        (at_least(2000), 2000, True, "at least 2000", "2000"),
        (at_least(2.0), 1.996, False, "at least 2", "2"),  # shown to two decimals, judged exactly
        (at_least(2.0), None, False, "at least 2", "none"),
        (at_most(600), 12.345, True, "at most 600", "12.35"),
        (at_most(None), 1.0, False, "at most none", "1"),  # no bound: it cannot hold
        (one_of("failed", "unreachable"), "unreachable", True, "failed or unreachable", "unreachable"),
        (one_of("failed", "unreachable"), "committed", False, "failed or unreachable", "committed"),
        (
            including("state_verified"),
            ["policy", "state_verified"],
            True,
            "including state_verified",
            "policy, state_verified",
        ),
        (including("state_verified"), [], False, "including state_verified", "none"),
        (including("state_verified"), None, False, "including state_verified", "none"),
    ],
)
def test_each_comparison_judges_and_writes_its_own_text(expected, observed, passed, expected_text, observed_text):
    row = check("a check", expected={"value": expected}, observed={"value": observed})

    assert row.passed is passed
    assert (row.expected, row.observed) == (f"value: {expected_text}", f"value: {observed_text}")


def test_in_order_holds_when_each_time_is_before_the_next():
    ordered = in_order("receipt", "retry admitted")
    later = NOON + timedelta(milliseconds=5)

    row = check(
        "before the retry", expected={"times": ordered}, observed={"times": {"receipt": NOON, "retry admitted": later}}
    )
    assert row == CheckRow(
        name="before the retry",
        expected="times: receipt before retry admitted",
        observed="times: (receipt: 12:00:00.250, retry admitted: 12:00:00.255)",
        passed=True,
    )
    assert not check("c", expected=ordered, observed={"receipt": later, "retry admitted": NOON}).passed
    assert not check("c", expected=ordered, observed={"receipt": NOON, "retry admitted": NOON}).passed  # strictly
    assert not check("c", expected=ordered, observed={"receipt": None, "retry admitted": NOON}).passed
    assert not check("c", expected=ordered, observed={"receipt": NOON}).passed


def test_each_counts_the_items_that_match_and_shows_the_first_that_do_not():
    rounds = {f"round {n}": {"approvals": 1, "refusals": 1} for n in range(1, 6)}
    expected = each({"approvals": 1, "refusals": 1}, of=5, unit="rounds")

    row = check("one approval and one refusal per round", expected=expected, observed=rounds)
    assert (row.passed, row.expected, row.observed) == (
        True,
        "5 rounds, each: (approvals: 1, refusals: 1)",
        "5 of 5 rounds",
    )

    odd = {**rounds, **{f"round {n}": {"approvals": 2, "refusals": 0} for n in (1, 2, 3, 4)}}
    row = check("one approval and one refusal per round", expected=expected, observed=odd)
    assert not row.passed
    assert row.observed == (
        "1 of 5 rounds; round 1: (approvals: 2, refusals: 0); round 2: (approvals: 2, refusals: 0);"
        " round 3: (approvals: 2, refusals: 0); 1 more"
    )
    row = check("c", expected=expected, observed=dict(list(rounds.items())[:4]))
    assert (row.passed, row.observed) == (False, "4 of 5 rounds (4 seen)")


def test_each_over_a_list_labels_its_items_by_position():
    row = check(
        "receipts",
        expected=each(one_of("failed", "unreachable"), of=3, unit="receipts"),
        observed=["failed", "committed", "failed"],
    )

    assert (row.passed, row.expected, row.observed) == (
        False,
        "3 receipts, each: failed or unreachable",
        "2 of 3 receipts; 2: committed",
    )


def test_values_render_as_plain_text():
    assert render({"a": True, "b": None, "c": [1, 2], "d": {"e": 2.5}}) == "a: yes; b: none; c: 1, 2; d: (e: 2.5)"
    assert render([]) == "none"
    assert render(10.0) == "10"
    assert render(NOON) == "12:00:00.250"

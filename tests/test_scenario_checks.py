"""The demo scenarios' checks (recovery/devtools/scenarios/checks.py), without a stage: a check passes exactly when its
comparison holds, and what its line says it expected and observed is made from the two values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from recovery.devtools.scenarios.checks import Check, after, at_least, contains, each, one_of, only

NOON = datetime(2025, 1, 2, 12, 0, 1, 234567, tzinfo=UTC)
LATER = NOON + timedelta(seconds=2)


def check(expected, observed) -> Check:
    return Check(name="it", expected=expected, observed=observed)


@pytest.mark.parametrize(
    ("expected", "observed", "passed"),
    [
        ("COMMITTED", "COMMITTED", True),
        ("COMMITTED", "UNKNOWN", False),
        (1, 1, True),
        (1, 2, False),
        ([1, 1], [1, 1], True),
        ([1, 1], [1, 0], False),
        (None, None, True),
        (None, "", False),
        (at_least(2), 2.0, True),
        (at_least(2), 1.999, False),
        (at_least(2), None, False),
        (after(NOON), LATER, True),
        (after(NOON), NOON, False),
        (after(LATER), NOON, False),
        (after(None), NOON, False),
        (after(NOON), None, False),
        (one_of("poll", "callback"), "callback", True),
        (one_of("poll", "callback"), None, False),
        (contains("status"), ["order_id", "status"], True),
        (contains("status"), ["order_id"], False),
        (contains("status"), None, False),
        (only(503), [503, 503], True),
        (only(503), [], True),
        (only(503), [503, 200], False),
        (each(at_least(2)), [2.0, 2.5], True),
        (each(at_least(2)), [2.0, 1.5], False),
        (each(at_least(2)), [], False),
        (each(one_of("failed", "unreachable")), ["failed", "unreachable"], True),
        (each(one_of("failed", "unreachable")), ["failed", "committed"], False),
    ],
)
def test_a_check_passes_exactly_when_its_comparison_holds(expected, observed, passed):
    assert check(expected, observed).passed is passed


@pytest.mark.parametrize(
    ("expected", "observed", "line"),
    [
        ("COMMITTED", "UNKNOWN", "FAIL it: expected COMMITTED, observed UNKNOWN"),
        (1, 1, "ok   it: expected 1, observed 1"),
        (["a", "b"], ["a", "b"], "ok   it: expected ['a', 'b'], observed ['a', 'b']"),
        (None, None, "ok   it: expected None, observed None"),
        (
            each(at_least(2, "Retry-After")),
            [2.004, 2.1],
            "ok   it: expected each >= 2 (Retry-After), observed [2.004, 2.1]",
        ),
        (
            after(NOON, "the payment's receipt"),
            LATER,
            "ok   it: expected after 12:00:01.234 (the payment's receipt), observed 12:00:03.234",
        ),
        (
            after(None, "the payment's receipt"),
            None,
            "FAIL it: expected after None (the payment's receipt), observed None",
        ),
        (one_of("poll", "callback"), "poll", "ok   it: expected poll or callback, observed poll"),
        (contains("status"), ["order_id"], "FAIL it: expected contains status, observed ['order_id']"),
        (only(503), [503], "ok   it: expected 503 only, observed [503]"),
        (
            each(one_of("failed", "unreachable")),
            ["failed"],
            "ok   it: expected each failed or unreachable, observed ['failed']",
        ),
    ],
)
def test_what_a_check_says_it_expected_and_observed_comes_from_the_values(expected, observed, line):
    assert check(expected, observed).line == line


def test_the_line_follows_the_values_not_a_text_written_beside_them():
    # The same comparison against another bound says the other bound, and decides by it.
    assert check(at_least(3, "Retry-After"), 2.5).line == "FAIL it: expected >= 3 (Retry-After), observed 2.5"
    assert check(at_least(2, "Retry-After"), 2.5).line == "ok   it: expected >= 2 (Retry-After), observed 2.5"

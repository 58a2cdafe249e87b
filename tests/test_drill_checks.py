"""The drills' check API (recovery/devtools/drills/checks.py): a check holds when the observed value matches the
expected one, and both of its texts are rendered from the values, for plain equality and for each comparison. Then the
checks of the compensation and saga drills, fed the sandbox's evidence (its request log and ledger, as its admin API
returns them) as it is when the drill passes and as it would be if the product had got it wrong. Pure Python: no
database, no sandbox."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from recovery_client.runtime import CallResult

from recovery.devtools.drills.cases.compensation import Order, ledger_effects
from recovery.devtools.drills.cases.compensation_refused import not_retried
from recovery.devtools.drills.cases.compensation_reply_lost import no_second_cancel
from recovery.devtools.drills.cases.saga_aborted import Saga, saga_ledger, undo_order
from recovery.devtools.drills.checks import at_least, at_most, check, each, in_order, including, one_of, render
from recovery.devtools.drills.results import CheckRow

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


# The compensation drills' checks, from the sandbox's evidence ------------------------------------------------------

ORDER = Order(
    task_id=7,
    result=CallResult(tool="drill.order.create", key="order-k", call_id=9, outcome="committed", state="COMMITTED"),
    order_id="O-42",
)
OWN_KEY = "order-k.compensation-1"


def cancel(outcome: str, *, key: str = OWN_KEY, status: int | None = None) -> dict:
    """One entry of the sandbox's request log, as GET /_sandbox/requests returns it."""
    return {"at": "2026-12-01T12:00:00Z", "method": "POST", "path": "/orders/O-42/cancel", "key": key,
            "status": status, "outcome": outcome}  # fmt: skip


def effect(kind: str, key: str, route: str) -> dict:
    """One entry of the sandbox's ledger, as GET /_sandbox/ledger returns it."""
    return {"key": key, "kind": kind, "route": route, "provider_ref": "ca_1", "at": "2026-12-01T12:00:00Z", "body": {}}


def test_the_compensation_key_is_derived_from_the_orders_key_and_the_entry_number():
    assert (ORDER.compensation_key, ORDER.cancel_route) == (OWN_KEY, "/orders/O-42/cancel")


def test_no_second_cancel_holds_for_one_lost_reply_and_fails_for_a_resend_or_a_new_key():
    assert no_second_cancel(ORDER, [cancel("dropped_after_commit")]).passed

    resent = no_second_cancel(ORDER, [cancel("dropped_after_commit"), cancel("replayed", status=200)])
    assert not resent.passed
    assert resent.observed == (
        "cancel requests: (key: order-k.compensation-1, outcome: dropped_after_commit),"
        " (key: order-k.compensation-1, outcome: replayed)"
    )
    assert resent.expected == "cancel requests: (key: order-k.compensation-1, outcome: dropped_after_commit)"
    regenerated = no_second_cancel(ORDER, [cancel("dropped_after_commit", key="order-k.compensation-x")])
    assert not regenerated.passed  # the undo must carry the entry's own derived key, never a new one
    assert not no_second_cancel(ORDER, []).passed  # never sent: nothing was undone


def test_the_ledger_check_counts_the_sandboxs_effects_under_each_key():
    order = [effect("orders", "order-k", "/orders")]
    cancelled = [effect("cancellations", OWN_KEY, "/orders/O-42/cancel")]

    row = ledger_effects(ORDER, cancellations=1, under_order=order, under_undo=cancelled)
    assert row == CheckRow(
        name="1 order, 1 cancellation in the sandbox ledger",
        expected="under the order's key: (orders: 1); under its compensation's key: (cancellations: 1);"
        " routes of the cancellations: /orders/O-42/cancel",
        observed="under the order's key: (orders: 1); under its compensation's key: (cancellations: 1);"
        " routes of the cancellations: /orders/O-42/cancel",
        passed=True,
    )
    twice = ledger_effects(ORDER, cancellations=1, under_order=order, under_undo=cancelled * 2)
    assert not twice.passed and "under its compensation's key: (cancellations: 2)" in twice.observed
    refused = ledger_effects(ORDER, cancellations=0, under_order=order, under_undo=[])
    assert refused.passed and refused.name == "1 order, 0 cancellations in the sandbox ledger"
    undone_anyway = ledger_effects(ORDER, cancellations=0, under_order=order, under_undo=cancelled)
    assert not undone_anyway.passed and undone_anyway.expected.startswith(
        "under the order's key: (orders: 1); under its compensation's key: none"
    )
    other_order = [effect("cancellations", OWN_KEY, "/orders/O-43/cancel")]
    assert not ledger_effects(ORDER, cancellations=1, under_order=order, under_undo=other_order).passed


def test_not_retried_fails_when_the_refused_cancel_was_sent_again_or_checked():
    failed = {"state": "failed", "attempts": 1, "receipts": 0}
    refused = [cancel("error_injected", status=409)]

    assert not_retried(refused, [], entry=failed, due=False).passed
    again = not_retried(refused * 2, [], entry={**failed, "attempts": 2}, due=False)
    assert not again.passed
    assert again.observed == (
        "cancel requests: 2; status queries by its key: 0; entry: (state: failed, attempts: 2, receipts: 0);"
        " due to be sent or checked: no"
    )
    checked = not_retried(refused, [{"method": "GET", "status": 200}], entry={**failed, "receipts": 1}, due=False)
    assert not checked.passed
    assert not not_retried(refused, [], entry={**failed, "state": "not_committed"}, due=True).passed
    assert not not_retried(refused, [], entry=None, due=None).passed  # no entry: nothing to judge, it fails


# The saga drills' checks, from the sandbox's evidence ---------------------------------------------------------------


def _step(tool: str, key: str, call_id: int) -> CallResult:
    return CallResult(tool=tool, key=key, call_id=call_id, outcome="committed", state="COMMITTED")


SAGA = Saga(
    task_id=7,
    order=_step("drill.order.create", "order-k", 1),
    payment=_step("drill.payment.capture", "pay-k", 2),
    shipment=_step("drill.shipment.create", "ship-k", 3),
    order_id="O-42",
)


def undo(path: str, key: str, at_s: int, status: int = 200) -> dict:
    """One undo request in the sandbox's request log, `at_s` seconds after noon."""
    return {"at": f"2026-12-01T12:00:{at_s:02d}Z", "method": "POST", "path": path, "key": key, "status": status,
            "outcome": "answered"}  # fmt: skip


REFUND = ("/refunds", "pay-k.compensation-1")
CANCEL = ("/orders/O-42/cancel", "order-k.compensation-1")


def test_the_undo_order_holds_for_the_refund_before_the_cancel_and_fails_otherwise():
    assert undo_order(SAGA, [undo(*CANCEL, 2), undo(*REFUND, 1)]).passed  # the log's order does not matter: times do

    reversed_ = undo_order(SAGA, [undo(*REFUND, 3), undo(*CANCEL, 2)])
    assert not reversed_.passed
    assert "times: (the refund (step 2): 12:00:03.000, the cancel (step 1): 12:00:02.000)" in reversed_.observed
    assert reversed_.expected.endswith("times: the refund (step 2) before the cancel (step 1)")
    at_once = undo_order(SAGA, [undo(*REFUND, 2), undo(*CANCEL, 2)])
    assert not at_once.passed  # strictly before: the second undo waits for the first to end
    assert not undo_order(SAGA, [undo(*REFUND, 1)]).passed  # the order was never cancelled
    twice = undo_order(SAGA, [undo(*REFUND, 1), undo(*REFUND, 2), undo(*CANCEL, 3)])
    assert not twice.passed  # a second refund request
    new_key = undo_order(SAGA, [undo("/refunds", "pay-k.compensation-x", 1), undo(*CANCEL, 2)])
    assert not new_key.passed  # each undo under its entry's own derived key
    refused = undo_order(SAGA, [undo(*REFUND, 1), undo(*CANCEL, 2, status=409)])
    assert not refused.passed


def test_the_saga_ledger_wants_one_effect_and_one_undo_per_step_and_no_shipment():
    good = {
        "order-k": [effect("orders", "order-k", "/orders")],
        "order-k.compensation-1": [effect("cancellations", "order-k.compensation-1", "/orders/O-42/cancel")],
        "pay-k": [effect("payments", "pay-k", "/payments")],
        "pay-k.compensation-1": [effect("refunds", "pay-k.compensation-1", "/refunds")],
    }
    assert saga_ledger(SAGA, good).passed

    never_refunded = saga_ledger(SAGA, {**good, "pay-k.compensation-1": []})
    assert not never_refunded.passed and "payment: (under its key: (payments: 1), under its undo's key: none)" in (
        never_refunded.observed
    )
    shipped = saga_ledger(SAGA, {**good, "ship-k": [effect("shipments", "ship-k", "/shipments")]})
    assert not shipped.passed
    refunded_twice = saga_ledger(SAGA, {**good, "pay-k.compensation-1": good["pay-k.compensation-1"] * 2})
    assert not refunded_twice.passed
    other_order = [effect("cancellations", "order-k.compensation-1", "/orders/O-43/cancel")]
    assert not saga_ledger(SAGA, {**good, "order-k.compensation-1": other_order}).passed

"""Finding a lost outcome where the provider has no lookup by key (docs/providers.md): `refund.listed` puts the call's
key in its request's metadata, and reconciliation lists the order's refunds and matches it.

*Lookup by listing*: the refund commits, its reply is dropped; one receipt of the listing, matching the marker,
settles it COMMITTED with the sandbox's refund id. *Eventually consistent search*: the sandbox keeps a new refund out
of its listings for a while; not listed yet is `pending` (the tool's `visible_after_s` has not passed), never
NOT_COMMITTED, and the refund is never sent again.
"""

from __future__ import annotations

from recovery.devtools.drills.cases.shared import check_one_request, check_settled_by_one_receipt
from recovery.devtools.drills.framework import Run
from recovery.devtools.drills.stage import LIST_LAG_MS, LISTED_REFUND
from recovery.models import Call, Receipt


def _lost_refund(run: Run, label: str, goal: str) -> tuple[str, int]:
    """A listed refund committed with its reply dropped, in a task of its own: its key and call id."""
    key, arguments = run.refund_args(label, 1)
    run.sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    agent = run.agent()
    task_id, result = run.refund(agent, key, arguments, task=f"drill-{label}", goal=goal, tool=LISTED_REFUND)
    agent.submit(task_id, f"refund {result.state}")
    return key, result.call_id


def _check_found_by_marker(run: Run, key: str, call_id: int, receipt: Receipt | None) -> None:
    """The receipt matched exactly the refund the sandbox's ledger holds for the key, and the call took its id."""
    refs = [entry["provider_ref"] for entry in run.sandbox.ledger(key)["entries"]]
    run.check(
        "found by the marker its request carried",
        expected={"matched": refs, "effects": len(refs), "call's provider_ref": refs[0] if refs else None},
        observed={
            "matched": (receipt.response or {}).get("matched") if receipt else None,
            "effects": receipt.effects_observed if receipt else None,
            "call's provider_ref": Call.objects.get(pk=call_id).provider_ref,
        },
    )


def play(run: Run) -> None:
    key, call_id = _lost_refund(run, "listed", "refund an order whose reply is lost; found by listing")
    receipts = list(Receipt.objects.filter(call_id=call_id, applied=True).order_by("id"))
    check_settled_by_one_receipt(run, receipts)
    _check_found_by_marker(run, key, call_id, receipts[-1] if receipts else None)
    check_one_request(run, key)


def play_lagging(run: Run) -> None:
    run.sandbox.configure(list_lag_ms=LIST_LAG_MS)
    try:
        _play_lagging(run)
    finally:
        run.sandbox.configure(list_lag_ms=0)


def _play_lagging(run: Run) -> None:
    key, call_id = _lost_refund(run, "search-lag", "refund an order whose reply is lost; the search lags")
    receipts = list(Receipt.objects.filter(call_id=call_id).order_by("id"))
    before = [r for r in receipts if r.observed != "committed"]
    run.check(
        "not listed at first: pending, nothing concluded",
        expected={"receipts before the match": {"at least one": True, "observed": ["pending"], "moved": []}},
        observed={
            "receipts before the match": {
                "at least one": bool(before),
                "observed": sorted({r.observed for r in before}),
                "moved": [r.pk for r in before if r.local_state_after != r.local_state_before],
            }
        },
    )
    check_settled_by_one_receipt(run, [r for r in receipts if r.applied])
    check_one_request(run, key)

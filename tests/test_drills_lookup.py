"""The lookup drills of docs/drills.md (`lookup-by-listing`, `eventually-consistent-search`) through the real stack:
the live API, a sandbox process whose refunds are listed (with a visibility lag for the second), background jobs."""

from __future__ import annotations

import pytest

from recovery.engine.states import CallState as S
from recovery.models import Receipt
from tests.test_drills import passed, stage, transitions, writes  # noqa: F401  (the stage fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_lost_reply_is_settled_by_a_listing_match_without_a_second_request(stage):  # noqa: F811
    (row,) = passed(stage, "lookup-by-listing").keys

    assert transitions(row.call_id) == [S.SENT, S.UNKNOWN, S.COMMITTED]
    (receipt,) = Receipt.objects.filter(call_id=row.call_id)
    (effect,) = stage.sandbox.ledger(row.key)["entries"]
    assert (receipt.observed, receipt.effects_observed) == ("committed", 1)
    assert receipt.provider_ref == effect["provider_ref"] and receipt.response["matched"] == [effect["provider_ref"]]
    assert "/refunds/list?" in receipt.request["url"]
    assert writes(stage, row.key) == [("POST", None, "dropped_after_commit")]


def test_a_lagging_search_is_waited_out_never_concluded_not_committed_nor_resent(stage):  # noqa: F811
    (row,) = passed(stage, "eventually-consistent-search").keys

    assert transitions(row.call_id) == [S.SENT, S.UNKNOWN, S.COMMITTED]
    observed = list(Receipt.objects.filter(call_id=row.call_id).order_by("id").values_list("observed", flat=True))
    assert observed[0] == "pending" and observed[-1] == "committed" and "not_committed" not in observed
    assert writes(stage, row.key) == [("POST", None, "dropped_after_commit")]
    assert stage.sandbox.configure()["list_lag_ms"] == 0  # the drill put the sandbox back

"""This release's drills of docs/drills.md through the real stack (the live API, a sandbox process, background jobs),
kept out of the PgBouncer set (`make test-pgbouncer`): the lookups (`lookup-by-listing`, `eventually-consistent-search`:
refunds listed, the second with a visibility lag), a deferred report that never arrives (`deferred-report-lost`) and
a lost MCP reply (`mcp-reply-lost`: the gateway, mcp-server-git and the fault proxy)."""

from __future__ import annotations

import pytest

from recovery.engine.states import CallState as S
from recovery.models import Attempt, Receipt
from tests.conftest import missing_service
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


def test_a_deferred_report_that_never_arrives_ends_committed_by_a_receipt_without_a_second_request(stage):  # noqa: F811
    (row,) = passed(stage, "deferred-report-lost").keys

    assert transitions(row.call_id) == [S.SENT, S.UNKNOWN, S.COMMITTED]
    assert Attempt.objects.get(call_id=row.call_id).reported_at is None  # the runtime's report never came
    (receipt,) = Receipt.objects.filter(call_id=row.call_id, applied=True)
    assert (receipt.observed, receipt.effects_observed) == ("committed", 1)
    assert writes(stage, row.key) == [("POST", 200, "answered")]
    assert stage.sandbox.ledger(row.key)["effects"] == 1


def test_a_lost_mcp_reply_is_absorbed_on_reissue_and_settled_by_the_status_tool_with_one_commit(stage):  # noqa: F811
    from recovery.devtools.mcp_stage import missing_servers

    reason = missing_servers()
    if reason:
        missing_service(reason)
    result = passed(stage, "mcp-reply-lost")
    (row,) = result.keys
    assert transitions(row.call_id) == ["SENT", "UNKNOWN", "COMMITTED"]
    assert row.observed_effects == 1


def _mcp_servers() -> None:
    from recovery.devtools.mcp_stage import missing_servers

    reason = missing_servers()
    if reason:
        missing_service(reason)


def test_an_mcp_write_held_for_approval_runs_once_after_the_clients_wait_and_its_reissue_gets_the_result(stage):  # noqa: F811
    _mcp_servers()
    (row,) = passed(stage, "mcp-approval-hold").keys
    assert transitions(row.call_id) == ["SENT", "COMMITTED"]
    assert row.observed_effects == 1
    assert Attempt.objects.filter(call_id=row.call_id).count() == 1


def test_an_mcp_upstream_killed_mid_call_is_settled_by_the_status_tool_and_started_again(stage):  # noqa: F811
    _mcp_servers()
    (row,) = passed(stage, "mcp-upstream-killed").keys
    assert transitions(row.call_id) == ["SENT", "UNKNOWN", "COMMITTED"]
    assert row.observed_effects == 1

"""The drills, one module each, named after its slug; each has `play(run)`, which drives the demo agent through
the drill and reports the table's checks (recovery/devtools/drills/table.py). CASES maps each slug to its `play`."""

from __future__ import annotations

from collections.abc import Callable

from recovery.devtools.drills.cases import (
    compensation_refused,
    compensation_reply_lost,
    deferred_report_lost,
    dependency_5xx,
    duplicate_callbacks,
    lookup_by_listing,
    lost_before_commit,
    mcp_holds,
    mcp_reply_lost,
    provider_ignores_keys,
    queue_backlog,
    rate_limit,
    refused_before_send,
    saga_aborted,
    square_wire,
    status_api_down,
    timeout_after_send,
    two_approvers,
    worker_killed_mid_replay,
)
from recovery.devtools.drills.framework import Run
from recovery.devtools.drills.table import DRILLS

CASES: dict[str, Callable[[Run], None]] = {
    "refused-before-send": refused_before_send.play,
    "timeout-after-send": timeout_after_send.play,
    "deferred-report-lost": deferred_report_lost.play,
    "lost-before-commit": lost_before_commit.play,
    "duplicate-callbacks": duplicate_callbacks.play,
    "rate-limit": rate_limit.play,
    "dependency-5xx": dependency_5xx.play,
    "status-api-down": status_api_down.play,
    "queue-backlog": queue_backlog.play,
    "worker-killed-mid-replay": worker_killed_mid_replay.play,
    "two-approvers": two_approvers.play,
    "provider-ignores-keys": provider_ignores_keys.play,
    "compensation-reply-lost": compensation_reply_lost.play,
    "compensation-refused": compensation_refused.play,
    "saga-aborted": saga_aborted.play,
    "saga-aborted-unknown-step": saga_aborted.play_unknown_step,
    "lookup-by-listing": lookup_by_listing.play,
    "eventually-consistent-search": lookup_by_listing.play_lagging,
    "square-wire": square_wire.play,
    "mcp-reply-lost": mcp_reply_lost.play,
    "mcp-approval-hold": mcp_holds.play_hold,
    "mcp-upstream-killed": mcp_holds.play_killed,
}
assert list(CASES) == list(DRILLS), "every drill of the table has its module, in the table's order"

"""Every action the audit trail records (docs/design/audit.md), in one enum: `<subject>.<what happened>`.

Product code appends events only under these names and reads them only through these members and the groups below,
so a name is spelled once and a reader finds every event of a kind by searching for its member.
"""

from __future__ import annotations

from enum import StrEnum


class AuditAction(StrEnum):
    # a call: registered, moved by recovery.statemachine.transitions (the only writer of its state), claimed by a
    # reviewer
    CALL_ADDED = "call.added"
    CALL_TRANSITION = "call.transition"
    CALL_CLAIMED = "call.claimed"
    CALL_RELEASED = "call.released"
    CALL_ASSIGNED = "call.assigned"  # to a named reviewer, beside the short claim (docs/notifications.md)
    CALL_UNASSIGNED = "call.unassigned"
    CALL_REPLAYED = "call.replayed"  # replay reconciliation sent its one same-key replay (docs/replay.md)
    CALL_CHECKED = "call.checked"  # a reconcile receipt that moved nothing (the metrics count every check)
    # the MCP gateway answered a re-issue of a write from the call it repeats, never sending it (docs/mcp-gateway.md)
    MCP_REISSUE_ABSORBED = "mcp.reissue_absorbed"
    # a compensation ledger entry (docs/compensation.md): made, moved by
    # recovery.statemachine.transitions.transition_entry, checked
    COMPENSATION_STARTED = "compensation.started"
    COMPENSATION_TRANSITION = "compensation.transition"
    COMPENSATION_CHECKED = "compensation.checked"
    # a duplicate probe's receipt (docs/replay.md), and a tool's retry path set by it, by an approved action or voided
    PROBE_RECORDED = "probe.recorded"
    RETRY_PATH_CHANGED = "tool.retry_path"
    # a task
    TASK_CREATED = "task.created"
    TASK_SUBMITTED = "task.submitted"
    TASK_ABANDONED = "task.abandoned"
    TASK_NO_SUBMISSION = "task.no_submission"
    TASK_SAGA = "task.saga"  # a saga abort's state: running, stopped, done
    # an operator's action request, one event per status it enters (recovery.models.ActionStatus)
    ACTION_PREVIEWED = "action.previewed"
    ACTION_REQUESTED = "action.requested"
    ACTION_APPROVED = "action.approved"
    ACTION_REJECTED = "action.rejected"
    ACTION_STALE = "action.stale"
    ACTION_EXPIRED = "action.expired"
    ACTION_WITHDRAWN = "action.withdrawn"
    ACTION_EXECUTING = "action.executing"
    ACTION_EXECUTED = "action.executed"
    ACTION_FAILED = "action.failed"
    ACTION_INTERRUPTED = "action.interrupted"
    # a bulk action on a frozen selection (its own story on the global chain) and its items' steps that no action
    # request tells (on their calls' chains)
    BULK_PREVIEWED = "bulk.previewed"
    BULK_REQUESTED = "bulk.requested"
    BULK_APPROVED = "bulk.approved"
    BULK_REJECTED = "bulk.rejected"
    BULK_EXPIRED = "bulk.expired"
    BULK_EXECUTING = "bulk.executing"
    BULK_INTERRUPTED = "bulk.interrupted"
    BULK_FINISHED = "bulk.finished"
    BULK_ITEM_SKIPPED = "bulk.item_skipped"
    BULK_ITEM_REFUSED = "bulk.item_refused"
    BULK_ITEM_INTERRUPTED = "bulk.item_interrupted"
    # a tool's circuit breaker, and the breaker of a provider's status endpoint
    BREAKER_OPENED = "breaker.opened"
    BREAKER_CLOSED = "breaker.closed"
    BREAKER_REOPENED = "breaker.reopened"
    # an operator's breaker operation (recovery.services.breaker_operations): a force open on one confirmation, a
    # reset requested by a reviewer and decided by a different approver
    BREAKER_FORCED_OPEN = "breaker.forced_open"
    BREAKER_RESET = "breaker.reset"
    BREAKER_RESET_REQUESTED = "breaker.reset_requested"
    BREAKER_RESET_REJECTED = "breaker.reset_rejected"
    BREAKER_RESET_STALE = "breaker.reset_stale"
    BREAKER_RESET_EXPIRED = "breaker.reset_expired"
    STATUS_BREAKER_OPENED = "status_breaker.opened"
    STATUS_BREAKER_CLOSED = "status_breaker.closed"
    # configuration and people
    REGISTRY_LOADED = "registry.loaded"
    REGISTRY_EDITED = "registry.edited"
    API_TOKEN_CREATED = "api_token.created"
    API_TOKEN_REVOKED = "api_token.revoked"
    USER_CREATED = "user.created"
    USER_UPDATED = "user.updated"
    NOTIFICATIONS_EDITED = "notifications.edited"  # a channel or a rule added, changed or deleted in the admin
    # the trail itself
    AUDIT_VERIFIED = "audit.verified"
    AUDIT_MAINTENANCE = "audit.maintenance"
    RETENTION_PRUNED = "retention.pruned"  # settled calls' receipts, gate answers and response bodies removed

    @classmethod
    def request_entered(cls, status: str) -> AuditAction:
        """The event of an action request entering `status` (an ActionStatus value)."""
        return cls(f"action.{status}")


# The story of operator action requests, and the events of each kind of breaker (an operator's force open and reset
# included: they change a tool breaker's state).
REQUEST_EVENTS = frozenset(a for a in AuditAction if a.name.startswith("ACTION_"))
TOOL_BREAKER_EVENTS = (
    AuditAction.BREAKER_OPENED,
    AuditAction.BREAKER_CLOSED,
    AuditAction.BREAKER_REOPENED,
    AuditAction.BREAKER_FORCED_OPEN,
    AuditAction.BREAKER_RESET,
)
# The steps of a reset request that move no breaker (its history shows the state changes above).
BREAKER_RESET_REQUEST_EVENTS = (
    AuditAction.BREAKER_RESET_REQUESTED,
    AuditAction.BREAKER_RESET_REJECTED,
    AuditAction.BREAKER_RESET_STALE,
    AuditAction.BREAKER_RESET_EXPIRED,
)
STATUS_BREAKER_EVENTS = (AuditAction.STATUS_BREAKER_OPENED, AuditAction.STATUS_BREAKER_CLOSED)

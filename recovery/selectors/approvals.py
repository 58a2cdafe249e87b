"""Reads of operator actions (docs/actions.md): the pending-approvals queue, one action request's page, a call's
requests.

Each read is a fixed number of statements whatever the number of requests: the queue is one statement (the
requests with their call, tool, task, tenant and requester joined), its count one more, the pending breaker resets
one, a request's page two (the request with everything it names, then its audit events), a call's requests one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from recovery.audit.actions import REQUEST_EVENTS
from recovery.models import (
    ActionRequest,
    ActionStatus,
    AuditEvent,
    BreakerOperation,
    BreakerOperationStatus,
    BulkAction,
    BulkStatus,
)

# The queue shows the oldest requests first, at most this many (beyond it the page says how many more wait).
QUEUE_LIMIT = 200
# A call page lists its most recent requests, at most this many.
CALL_LIMIT = 50

# Statuses in which an action request still waits for someone: a preview nobody requested yet, a request nobody
# decided yet. Both expire (RECOVERY_ACTION_TTL_S) and both go stale when the call moves.
OPEN = (ActionStatus.PREVIEWED, ActionStatus.REQUESTED)

_RELATED = ("call__tool__provider", "call__task__tenant", "previewed_by", "requested_by", "decided_by")


def _pending(now: datetime):
    """Requests an approver can decide now: requested and not past their expiry (a request past it waits only for
    the periodic sweep to mark it expired, and approving it would be refused)."""
    return ActionRequest.objects.filter(status=ActionStatus.REQUESTED, expires_at__gt=now)


def pending_approvals(*, now: datetime, limit: int = QUEUE_LIMIT) -> list[ActionRequest]:
    """The approvers' queue, oldest request first: one statement, the request's call (with its tool, task, tenant)
    and its requester joined."""
    rows = _pending(now).select_related("call__tool", "call__task__tenant", "requested_by")
    return list(rows.order_by("requested_at", "pk")[:limit])


def pending_approvals_count(*, now: datetime) -> int:
    """How many decisions wait for an approver now — action requests, bulk actions, breaker resets (the
    navigation's and the overview's figure): one statement."""
    bulks = BulkAction.objects.filter(status=BulkStatus.REQUESTED, expires_at__gt=now).values("pk")
    resets = BreakerOperation.objects.filter(status=BreakerOperationStatus.REQUESTED, expires_at__gt=now)
    return _pending(now).values("pk").union(bulks, resets.values("pk"), all=True).count()


def pending_breaker_resets(*, now: datetime, limit: int = QUEUE_LIMIT) -> list[BreakerOperation]:
    """Breaker resets a reviewer requested and nobody decided yet (recovery.services.breaker_operations), oldest
    first, with their tool and requester: one statement."""
    rows = BreakerOperation.objects.filter(status=BreakerOperationStatus.REQUESTED, expires_at__gt=now)
    return list(rows.select_related("tool", "requested_by").defer("preview").order_by("requested_at", "pk")[:limit])


@dataclass(frozen=True, kw_only=True)
class ActionRequestPage:
    request: ActionRequest
    events: list[AuditEvent]  # the audit events of this request, oldest first

    @property
    def stale(self) -> bool:
        """The call's state moved since the preview (its version counts state changes only): a decision now would
        be refused as stale, and a new preview is needed."""
        return self.request.status in OPEN and self.request.call.version != self.request.call_version


def action_request_page(request_id: int) -> ActionRequestPage | None:
    """One action request with its call and people (one statement) and its audit trail (one more); None for an
    unknown id.

    The trail is the call's events that name this request in their evidence: its own steps (`request`, written by
    recovery.services.actions) and the call's transitions it made (`action_request`). The call's events are found by
    their index (`audit_call_idx`), so this reads one call's history, never the whole trail.
    """
    found = ActionRequest.objects.select_related(*_RELATED, "attempt").filter(pk=request_id).first()
    if found is None:
        return None
    events = list(
        AuditEvent.objects.filter(call_id=found.call_id)
        .filter(Q(action__in=REQUEST_EVENTS, evidence__request=found.pk) | Q(evidence__action_request=found.pk))
        .only("seq", "action", "actor_label", "from_state", "to_state", "reason", "evidence", "created_at")
        .order_by("seq")
    )
    return ActionRequestPage(request=found, events=events)


def call_action_requests(call_id: int, *, limit: int = CALL_LIMIT) -> list[ActionRequest]:
    """A call's action requests, newest first, with the people named on them: one statement."""
    rows = ActionRequest.objects.filter(call_id=call_id).select_related("requested_by", "decided_by", "previewed_by")
    return list(rows.defer("plan", "result", "evidence").order_by("-previewed_at", "-pk")[:limit])

"""Reads of four-eyes requests (docs/actions.md#four-eyes): every kind waiting for a second person, through one registry
(`KINDS`: the approvals queue, the navigation's count, notifications), one action request's page and a call's
requests. A fixed number of statements each: one per kind for the queue, one for the count."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from recovery.audit.actions import REQUEST_EVENTS
from recovery.models import (
    ActionRequest,
    ActionStatus,
    AuditEvent,
    BreakerOperation,
    BulkAction,
    FourEyesRequest,
)
from recovery.models.approvals import REQUESTED

# The queue shows the oldest requests of each kind first, at most this many (beyond it the page says more wait).
QUEUE_LIMIT = 200
# A call page lists its most recent requests, at most this many.
CALL_LIMIT = 50

# Statuses in which an action request still waits for someone: a preview nobody requested yet, a request nobody
# decided yet. Both expire (RECOVERY_ACTION_TTL_S) and both go stale when the call moves.
OPEN = (ActionStatus.PREVIEWED, ActionStatus.REQUESTED)

_RELATED = ("call__tool__provider", "call__task__tenant", "previewed_by", "requested_by", "decided_by")


@dataclass(frozen=True, kw_only=True)
class ApprovalKind:
    """One kind of request a second person decides, as the pages that list them read it."""

    key: str  # how pages and notifications name the kind
    label: str  # "breaker reset": one of them, in a sentence
    model: type[FourEyesRequest]
    url_name: str  # the console's page of one request (its id the only argument)
    related: tuple[str, ...]  # what a queue row shows with the request
    deferred: tuple[str, ...] = ()  # what it does not

    def pending(self, now: datetime) -> QuerySet:
        """Requests an approver can decide now: requested and not past their expiry (one past it waits only for the
        periodic sweep to mark it expired, and deciding it would be refused)."""
        return self.model.objects.filter(status=REQUESTED, expires_at__gt=now)

    def waiting(self, now: datetime, limit: int = QUEUE_LIMIT) -> list:
        """The pending requests, oldest first, with what a queue row shows: one statement."""
        rows = self.pending(now).select_related(*self.related).defer(*self.deferred)
        return list(rows.order_by("requested_at", "pk")[:limit])


KINDS = (
    ApprovalKind(
        key="action",
        label="action request",
        model=ActionRequest,
        url_name="console:action",
        related=("call__tool", "call__task__tenant", "requested_by"),
    ),
    ApprovalKind(key="bulk", label="bulk action", model=BulkAction, url_name="console:bulk", related=("requested_by",)),
    ApprovalKind(
        key="breaker_reset",
        label="breaker reset",
        model=BreakerOperation,
        url_name="console:breaker-op",
        related=("tool", "requested_by"),
        deferred=("preview",),
    ),
)
KIND_BY_KEY = {kind.key: kind for kind in KINDS}


def pending_approvals_count(*, now: datetime) -> int:
    """How many decisions of every kind wait for an approver now (the navigation's and the overview's figure): one
    statement."""
    first, *rest = (kind.pending(now).values("pk") for kind in KINDS)
    return first.union(*rest, all=True).count()


def approvals_waiting(*, now: datetime, limit: int = QUEUE_LIMIT) -> dict[str, list]:
    """Every kind's pending requests (by its key), oldest first: one statement per kind."""
    return {kind.key: kind.waiting(now, limit) for kind in KINDS}


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

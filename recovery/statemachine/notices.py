"""Notification events written beside the change that caused them (docs/notifications.md): a call entering a queue
that needs a person or leaving it, an approval requested, a breaker opened. Each is one INSERT in a savepoint of the
caller's transaction, so a failed insert is logged and never undoes or blocks the change it describes; the
notifications job routes and delivers them after the commit.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, IntegrityError, transaction

from recovery.engine.states import CallState
from recovery.models import Call, EventKind, NotificationEvent

logger = logging.getLogger("recovery.notifications")

S = CallState
# The call states whose queues wait for a person, and the event each entry is.
NEEDS_PERSON = {
    S.STILL_UNKNOWN: EventKind.STILL_UNKNOWN,
    S.HUMAN_REVIEW: EventKind.HUMAN_REVIEW,
    S.PARTIAL_COMPENSATED: EventKind.COMPENSATION_PROBLEM,
    S.COMPENSATION_FAILED: EventKind.COMPENSATION_PROBLEM,
}
QUEUE_NAMES = {
    S.STILL_UNKNOWN: "Unknown outcomes",
    S.HUMAN_REVIEW: "Human review",
    S.PARTIAL_COMPENSATED: "Compensation problems",
    S.COMPENSATION_FAILED: "Compensation problems",
}


def call_path(call_id: int) -> str:
    """The console's call page (console/urls.py `console:call`), joined to CONSOLE_BASE_URL when a message is made."""
    return f"/calls/{call_id}/"


def notice(kind: str, *, subject: str, title: str, dedup: str | None = None, **fields) -> bool:
    """Write one event in a savepoint of the current transaction; False (logged, nothing else undone) when the insert
    failed, or when an event with the same `dedup` key exists."""
    try:
        with transaction.atomic():
            NotificationEvent.objects.create(kind=kind, subject=subject, title=title[:300], dedup=dedup, **fields)
    except IntegrityError:
        if dedup is None:
            logger.exception("could not record the %s notification event of %s", kind, subject)
        return False
    except DatabaseError:
        logger.exception("could not record the %s notification event of %s", kind, subject)
        return False
    return True


def call_fields(call: Call) -> dict:
    return {"call_id": call.pk, "tenant_id": call.tenant_id, "tool_id": call.tool_id, "risk": call.risk}


def notice_call_moved(call: Call, src: CallState, dst: CallState, *, outcome: str = "") -> None:
    """The event of a call's move, if it is one: entering a queue that needs a person, or leaving such a queue for
    a state that does not (resolved)."""
    subject = f"call:{call.pk}"
    if dst in NEEDS_PERSON:
        title = f"Call {call.pk} waits in {QUEUE_NAMES[dst]} ({dst})"
        notice(
            NEEDS_PERSON[dst],
            subject=subject,
            title=title,
            reason=(outcome or "")[:100],
            path=call_path(call.pk),
            **call_fields(call),
        )
    elif src in NEEDS_PERSON:
        title = f"Call {call.pk} is resolved: {src} → {dst}"
        notice(
            EventKind.RESOLVED,
            subject=subject,
            title=title,
            reason=str(dst),
            path=call_path(call.pk),
            **call_fields(call),
        )


def notice_breaker_opened(tool_id: int, tool: str, *, forced: bool, reason: str) -> None:
    """A tool's breaker opened (by its failures) or forced open by an operator."""
    how = "was forced open by an operator" if forced else "opened"
    notice(
        EventKind.BREAKER_OPENED,
        subject=f"breaker:{tool_id}",
        title=f"The circuit breaker of {tool} {how}",
        reason=reason[:100],
        path="/operations/breakers/",
        tool_id=tool_id,
    )


def notice_approval_requested(row, *, noun: str) -> None:
    """A four-eyes request of any kind (recovery.services.approvals) waits for a second person."""
    kind = row._meta.model_name
    notice(
        EventKind.APPROVAL_REQUESTED,
        subject=f"approval:{kind}:{row.pk}",
        title=f"A {noun} ({kind} {row.pk}) waits for a second person's approval",
        path="/approvals/",
    )

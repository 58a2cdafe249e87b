"""Assigning a queue item to a named reviewer (docs/notifications.md#assignment), beside the short claim: who owns it
until it is resolved. Each assignment is a row upserted with its audit event and a notification event (the assignee
hears of it) in one transaction; a refusal writes nothing.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.actions import REVIEW_PERMISSION
from recovery.models import Assignment, Call, EventKind
from recovery.services.errors import Refusal
from recovery.statemachine.notices import call_fields, call_path, notice


def _assignee(username: str):
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None or not user.has_perm(REVIEW_PERMISSION):
        raise Refusal("assignee", f"{username or 'Nobody'} is not an active reviewer.", field="assignee")
    return user


def call_assign(*, call_id: int, assignee: str, user, actor: Actor) -> Assignment:
    """Assign the call to the reviewer named `assignee` (a reviewer may assign to themselves or a colleague)."""
    if not (user.is_active and user.has_perm(REVIEW_PERMISSION)):
        raise Refusal("role", f"Assigning needs the reviewer role ({REVIEW_PERMISSION}).")
    target = _assignee(assignee.strip())
    call = Call.objects.filter(pk=call_id).only("id", "task_id", "tenant_id", "tool_id", "risk").first()
    if call is None:
        raise Refusal("not_found", f"There is no call {call_id}.", status=404)
    with transaction.atomic():
        row, _ = Assignment.objects.update_or_create(
            call=call, defaults={"assignee": target, "assigned_by": user, "assigned_at": timezone.now()}
        )
        append_event(
            action=AuditAction.CALL_ASSIGNED,
            actor=actor,
            task_id=call.task_id,
            call_id=call.pk,
            evidence={"assignee": target.get_username()},
        )
        notice(
            EventKind.ASSIGNED,
            subject=f"call:{call.pk}",
            title=f"Call {call.pk} is assigned to {target.get_username()} by {user.get_username()}",
            path=call_path(call.pk),
            **call_fields(call),
        )
    return row


def call_unassign(*, call_id: int, user, actor: Actor) -> bool:
    """Remove the call's assignment; False (nothing written) when it had none."""
    if not (user.is_active and user.has_perm(REVIEW_PERMISSION)):
        raise Refusal("role", f"Unassigning needs the reviewer role ({REVIEW_PERMISSION}).")
    with transaction.atomic():
        found = Assignment.objects.filter(call_id=call_id).select_related("assignee", "call").first()
        if found is None:
            return False
        found.delete()
        append_event(
            action=AuditAction.CALL_UNASSIGNED,
            actor=actor,
            task_id=found.call.task_id,
            call_id=call_id,
            evidence={"was": found.assignee.get_username()},
        )
    return True

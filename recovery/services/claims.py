"""Reviewer claims on queue items (docs/console.md): a lease, so two reviewers never work one item unknowingly.
A claim is a conditional UPDATE with its audit event, and not a state change: it never touches the call's state or
version.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.models import Call


class ClaimRefused(Exception):
    """The item is held by someone else (or does not exist): nothing was written."""

    def __init__(self, message: str, *, holder: str = "", until: datetime | None = None) -> None:
        super().__init__(message)
        self.holder, self.until = holder, until


@dataclass(frozen=True, kw_only=True)
class Claim:
    call_id: int
    holder: str
    until: datetime


def call_claim(*, call_id: int, user, actor: Actor, now: datetime | None = None) -> Claim:
    """Claim (or renew the claim on) a call for `user`; raises ClaimRefused while a colleague holds it."""
    now = now or timezone.now()
    until = now + timedelta(seconds=settings.RECOVERY_CLAIM_S)
    with transaction.atomic():
        updated = Call.objects.filter(Call.claim_free(user, now), pk=call_id).update(claimed_by=user, claim_until=until)
        if updated != 1:
            held = Call.objects.filter(pk=call_id).values("claimed_by__username", "claim_until").first()
            if held is None:
                raise ClaimRefused(f"There is no call {call_id}.")
            raise ClaimRefused(
                f"Call {call_id} is claimed by {held['claimed_by__username']} until "
                f"{held['claim_until']:%H:%M:%S} UTC.",
                holder=held["claimed_by__username"],
                until=held["claim_until"],
            )
        task_id = Call.objects.filter(pk=call_id).values_list("task_id", flat=True).get()
        append_event(
            action=AuditAction.CALL_CLAIMED,
            actor=actor,
            task_id=task_id,
            call_id=call_id,
            evidence={"until": until.isoformat()},
        )
    return Claim(call_id=call_id, holder=user.get_username(), until=until)


def call_release(*, call_id: int, user, actor: Actor, now: datetime | None = None) -> bool:
    """Give up `user`'s claim; False (and nothing written) when the user does not hold it."""
    now = now or timezone.now()
    with transaction.atomic():
        updated = Call.objects.filter(pk=call_id, claimed_by=user).update(claimed_by=None, claim_until=None)
        if updated != 1:
            return False
        task_id = Call.objects.filter(pk=call_id).values_list("task_id", flat=True).get()
        append_event(action=AuditAction.CALL_RELEASED, actor=actor, task_id=task_id, call_id=call_id)
    return True

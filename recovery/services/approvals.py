"""Four eyes, the steps (docs/actions.md#four-eyes): request, approve or reject, withdraw and expire, for every kind of
request a second person decides (recovery.models.approvals). Each step is one conditional UPDATE on (id, status)
with the kind's audit event in the same transaction: of two deciders exactly one moves the request, the other gets a
Refusal, and the database's four-eyes constraint backs the check. A kind (`FourEyes`) brings its rows, its wording
and its audit events; its plan and its apply step stay in its own module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.engine.actions import REVIEW_PERMISSION
from recovery.models import FourEyesRequest
from recovery.models.approvals import REQUESTED
from recovery.services.errors import Refusal
from recovery.statemachine.notices import notice_approval_requested

APPROVE_PERMISSION = "recovery.approve_action"
REASON_MAX = 2000
PREVIEWED, WITHDRAWN, STALE, EXPIRED = "previewed", "withdrawn", "stale", "expired"


@dataclass(frozen=True, kw_only=True)
class FourEyes:
    """One kind of four-eyes request, as the steps need it."""

    model: type[FourEyesRequest]
    noun: str  # how a status sentence names one: "This bulk is rejected now"
    thing: str  # what its requester asked for: "Only the person who requested this action can withdraw it"
    own: str  # the four-eyes refusal; {what} is the step refused ("Approving a bulk action")
    expired: str  # the expiry refusal; {why} says what nobody did before when
    reason_use: str  # "recorded with the bulk and read by the other person"
    # The kind's audit event of a move: record(row, to, actor, reason=..., was=<status left>, user=<who, or None>).
    record: Callable[..., None]
    related: tuple[str, ...] = ("requested_by", "decided_by")  # what a step reads with the row
    sweep_limit: int = 500


@dataclass(frozen=True, kw_only=True)
class Asked:
    """A step a person asked for on one request, checked so far: the row as read, their reason, when."""

    kind: FourEyes
    row: Any  # the kind's model
    user: Any
    actor: Actor
    reason: str
    what: str  # "Approving a bulk action": how a refusal names the step
    now: datetime


# --- the checks every step makes ------------------------------------------------------------------------------------


def require_role(user, permission: str, what: str) -> None:
    """Refusal("role") unless `user` is active and holds `permission` (the reviewer's or the approver's)."""
    if not (user.is_active and user.has_perm(permission)):
        role = "reviewer" if permission == REVIEW_PERMISSION else "approver"
        raise Refusal("role", f"{what} needs the {role} role ({permission}).")


def clean_reason(reason: str | None, *, use: str = "recorded with the action and read by the other person") -> str:
    """A person's reason, stripped: required, at most REASON_MAX characters (Refusal on field "reason")."""
    reason = (reason or "").strip()
    if not reason:
        raise Refusal("reason", f"Give a reason: it is {use}.", field="reason")
    if len(reason) > REASON_MAX:
        raise Refusal("reason", f"The reason must be at most {REASON_MAX} characters.", field="reason")
    return reason


def ttl() -> timedelta:
    """How long a preview waits to be requested, and a request to be decided."""
    return timedelta(seconds=settings.RECOVERY_ACTION_TTL_S)


def load(kind: FourEyes, pk: int):
    """The row with what the steps read (the model's DoesNotExist for an unknown id)."""
    return kind.model.objects.select_related(*kind.related).get(pk=pk)


def not_pending(kind: FourEyes, row, *, reread: bool = True) -> Refusal:
    """The refusal of a step on a row that moved (its status read again, unless the caller just read it)."""
    status = row.status
    if reread:
        status = kind.model.objects.filter(pk=row.pk).values_list("status", flat=True).first()
    return Refusal("not_pending", f"This {kind.noun} is {status} now: nothing more can be done with it.")


def step_evidence(to: str, was: str, user) -> dict:
    """Who moved the request, as action and bulk events name them: its requester or its decider; for a job's move
    (stale, expired), the status it left."""
    if to in (STALE, EXPIRED):
        return {"was": was}
    if user is None or to == WITHDRAWN:
        return {}
    return {"requested_by" if to == REQUESTED else "decided_by": user.get_username()}


# --- expiry ---------------------------------------------------------------------------------------------------------


def mark(kind: FourEyes, row, actor: Actor, *, to: str, reason: str, now: datetime) -> bool:
    """row: its status as read → `to` (stale, expired) with its audit event; False when it moved first."""
    with transaction.atomic():
        moved = kind.model.objects.filter(pk=row.pk, status=row.status).update(status=to, updated_at=now)
        if moved:
            kind.record(row, to, actor, reason=reason, was=row.status, user=None)
    if moved:
        row.status = to
    return bool(moved)


def _not_in_time(row) -> str:
    return f"not {'decided' if row.status == REQUESTED else 'requested'} before {row.expires_at.isoformat()}"


def expire(kind: FourEyes, row, actor: Actor, now: datetime) -> bool:
    """A preview or a request past its expiry → EXPIRED; False when it moved first."""
    return mark(kind, row, actor, to=EXPIRED, reason=_not_in_time(row), now=now)


def refuse_if_expired(kind: FourEyes, row, actor: Actor, now: datetime) -> None:
    """Past its expiry, the row is marked EXPIRED and the step refused (the expiry is the news, so it is kept)."""
    if not row.past_expiry(now):
        return
    why = _not_in_time(row)
    if not expire(kind, row, actor, now):
        raise not_pending(kind, row)
    raise Refusal("expired", kind.expired.format(why=why))


def expire_due(kind: FourEyes, *, actor: Actor, now: datetime | None = None, statuses=(PREVIEWED, REQUESTED), **where):
    """Periodic: the kind's rows in `statuses` (and `where`) past their expiry → EXPIRED, each with its event; how
    many."""
    now = now or timezone.now()
    due = kind.model.objects.filter(status__in=statuses, expires_at__lte=now, **where).select_related(*kind.related)
    return sum(expire(kind, row, actor, now) for row in due.order_by("expires_at")[: kind.sweep_limit])


# --- request --------------------------------------------------------------------------------------------------------


def requestable(kind: FourEyes, pk: int, *, user, actor: Actor, reason: str, what: str, binds=None) -> Asked:
    """A PREVIEWED row a reviewer may request now: the role, the reason, the status, what the reviewer read
    (`binds(row)` refuses a preview that is not the one they read) and the expiry, in that order."""
    require_role(user, REVIEW_PERMISSION, what)
    reason = clean_reason(reason, use=kind.reason_use)
    now = timezone.now()
    row = load(kind, pk)
    if row.status != PREVIEWED:
        raise not_pending(kind, row, reread=False)
    if binds is not None:
        binds(row)
    refuse_if_expired(kind, row, actor, now)
    return Asked(kind=kind, row=row, user=user, actor=actor, reason=reason, what=what, now=now)


def request(asked: Asked, *, then: Callable[[], None] | None = None):
    """PREVIEWED → REQUESTED with the reviewer's reason and a new expiry, its event, and `then()` in the same
    transaction; the row read again."""
    kind, row, now = asked.kind, asked.row, asked.now
    with transaction.atomic():
        moved = kind.model.objects.filter(pk=row.pk, status=PREVIEWED).update(
            status=REQUESTED,
            requested_by=asked.user,
            requested_at=now,
            reason=asked.reason,
            expires_at=now + ttl(),
            updated_at=now,
        )
        if not moved:
            raise not_pending(kind, row)
        kind.record(row, REQUESTED, asked.actor, reason=asked.reason, was=PREVIEWED, user=asked.user)
        notice_approval_requested(row, noun=kind.noun)
        if then is not None:
            then()
    return load(kind, row.pk)


def create_requested(kind: FourEyes, *, user, actor: Actor, reason: str, now: datetime, **fields):
    """A new row REQUESTED at once (a kind with no stored preview) and its event, in one transaction."""
    with transaction.atomic():
        row = kind.model.objects.create(
            status=REQUESTED,
            requested_by=user,
            requested_at=now,
            reason=reason,
            expires_at=now + ttl(),
            updated_at=now,
            **fields,
        )
        kind.record(row, REQUESTED, actor, reason=reason, was="", user=user)
        notice_approval_requested(row, noun=kind.noun)
    return row


# --- approve, reject, withdraw ----------------------------------------------------------------------------------------


def decidable(kind: FourEyes, pk: int, *, user, actor: Actor, reason: str, what: str) -> Asked:
    """A REQUESTED row `user` may decide now: the approver's role, the reason, the status, four eyes (never the
    requester) and the expiry, in that order."""
    require_role(user, APPROVE_PERMISSION, what)
    reason = clean_reason(reason, use=kind.reason_use)
    now = timezone.now()
    row = load(kind, pk)
    if row.status != REQUESTED:
        raise not_pending(kind, row, reread=False)
    if row.requested_by_user(user):
        raise Refusal("four_eyes", kind.own.format(what=what))
    refuse_if_expired(kind, row, actor, now)
    return Asked(kind=kind, row=row, user=user, actor=actor, reason=reason, what=what, now=now)


def decide(asked: Asked, *, to: str, changes: dict | None = None, then=None, record: bool = True):
    """REQUESTED → `to` (approved, applied, rejected) by the asker: exactly one decider's conditional UPDATE moves
    it, and the database's four-eyes constraint refuses a decider who requested it. Its event (unless the kind's
    `then` writes its own: record=False) and `then()` run in the same transaction; `then()`'s answer is returned."""
    kind, row, now = asked.kind, asked.row, asked.now
    fields = {"status": to, "decided_by": asked.user, "decided_at": now, "decision_reason": asked.reason}
    fields.update(changes or {}, updated_at=now)
    try:
        with transaction.atomic():
            if not kind.model.objects.filter(pk=row.pk, status=REQUESTED).update(**fields):
                raise not_pending(kind, row)
            if record:
                kind.record(row, to, asked.actor, reason=asked.reason, was=REQUESTED, user=asked.user)
            return then() if then is not None else None
    except IntegrityError as exc:
        constraint = kind.model.four_eyes_constraint()
        if constraint not in str(exc):
            raise
        message = f"{kind.own.format(what=asked.what)} The database refused it ({constraint})."
        raise Refusal("four_eyes", message) from None


def withdraw(kind: FourEyes, pk: int, *, user, actor: Actor, reason: str):
    """REQUESTED → WITHDRAWN by its requester while nobody has decided (the same conditional UPDATE as a decision,
    so of a withdrawal and an approval exactly one moves it); the row read again."""
    reason = clean_reason(reason, use=kind.reason_use)
    now = timezone.now()
    row = load(kind, pk)
    if not row.requested_by_user(user):
        raise Refusal("role", f"Only the person who requested this {kind.thing} can withdraw it.")
    if row.status != REQUESTED:
        raise not_pending(kind, row, reread=False)
    with transaction.atomic():
        moved = kind.model.objects.filter(pk=row.pk, status=REQUESTED).update(
            status=WITHDRAWN, decided_at=now, decision_reason=reason, updated_at=now
        )
        if not moved:
            raise not_pending(kind, row)
        kind.record(row, WITHDRAWN, actor, reason=reason, was=REQUESTED, user=user)
    return load(kind, pk)

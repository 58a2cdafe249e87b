"""An operator's force open and reset of a tool's circuit breaker (docs/breakers.md, docs/actions.md).

    shown = breaker_preview(tool_id=3, operation="reset")                     # the dry run: changes nothing
    breaker_force_open(tool_id=3, user=reviewer, actor=..., reason="...")     # protective: one confirmation
    op = breaker_request_reset(tool_id=3, user=reviewer, actor=..., reason="...", seen=shown.version)
    breaker_approve_reset(operation_id=op.pk, user=approver, actor=..., reason="...")  # a different person

Force open is protective, so one reviewer's confirmation applies it: the breaker goes to `forced_open` (a row
created for a breaker that never opened) by a conditional UPDATE whose WHERE names the state it leaves, or an INSERT
… ON CONFLICT DO NOTHING for a missing row (services.breakers.breaker_create, as the first opening uses); the
operation and its audit event are written in the same transaction. Nothing but a reset moves it again:
breaker_reserve_probe matches only open and half_open rows, and breaker_record only closes or reopens a half_open one
and only opens a closed one.

A reset lets traffic through again, so it needs four eyes: a reviewer requests it with a reason, a different person
with the approver role approves (or rejects) it — the database's `breaker_operation_four_eyes` backs the check. The
request binds to the breaker's row as the reviewer's dry run read it (its state and updated_at, which every change of
the row sets): approving applies the reset by an UPDATE whose WHERE names both, so a breaker that moved since (a probe
closed it, it reopened, someone forced it open) is left alone and the request goes STALE. Of two approvals (or a
double click) the conditional UPDATE on the request's status lets one through. Requests expire after
RECOVERY_ACTION_TTL_S. An applied reset closes the breaker, deletes its window's buckets and clears its probes.

A refusal is a Refusal with a code (role, reason, not_applicable, pending, four_eyes, stale,
expired, not_pending) and a message for a person; nothing changed, except where the refusal is the news (stale,
expired: the request's status records it). Every step is an audit event on the system chain naming the tool.

Lock order, as in services.breakers: the operation row, then the breaker row and its buckets, then the audit heads.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine import breaker as rules
from recovery.engine.actions import REVIEW_PERMISSION
from recovery.engine.states import CallState as S
from recovery.engine.types import CLOSED, FORCED_OPEN
from recovery.models import (
    Breaker,
    BreakerBucket,
    BreakerOperation,
    BreakerOperationKind,
    BreakerOperationStatus,
    Call,
    Tool,
)
from recovery.registry.policy import breaker_policy
from recovery.selectors.breakers import view_of_state
from recovery.services.breakers import breaker_create
from recovery.services.errors import Refusal

K, ST = BreakerOperationKind, BreakerOperationStatus
APPROVE_PERMISSION = "recovery.approve_action"
REASON_MAX = 2000
SWEEP_LIMIT = 500
FORCE_TRIES = 3  # a force open re-reads the state when another process moved the breaker between read and UPDATE
# Calls of the tool that may still make an attempt, which the breaker governs: the admittable ones, those on their
# way there (NOT_COMMITTED retries under its key) and those in flight (SENT, ACCEPTED: their next attempt, if any).
# COMMITTED, FAILED_PERMANENT and the compensation states make no further attempt of this tool.
OPEN_CALL_STATES = (
    S.READY, S.RETRYABLE, S.SENT, S.ACCEPTED, S.UNKNOWN, S.STILL_UNKNOWN, S.NOT_COMMITTED, S.HUMAN_REVIEW,
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BreakerPreview:
    """The dry run of an operation on one tool's breaker: what it would block or let through again, read now."""

    tool_id: int
    tool: str
    operation: str
    stored: str  # the row's state; "closed" when the breaker never opened (no row)
    state: str  # as admission reads it now (open past its cooldown reads half_open)
    opened_at: datetime | None
    updated_at: datetime | None  # the row's; None: no row
    probes_reserved: int
    window_calls: int
    window_failures: int
    window_buckets: int  # bucket rows a reset deletes
    window_s: int
    calls_by_state: dict[str, int] = field(default_factory=dict)  # open calls of the tool, OPEN_CALL_STATES order
    tasks: int = 0  # tasks with at least one of those calls
    refusal: str = ""  # why the operation cannot be done now ("" when it can)

    @property
    def open_calls(self) -> int:
        return sum(self.calls_by_state.values())

    @property
    def version(self) -> str:
        """The breaker row as read: a reset request binds to it (and its form carries it from the dry run)."""
        return f"{self.stored}@{self.updated_at.isoformat() if self.updated_at else ''}"

    def figures(self) -> dict:
        """The figures stored with the operation, as the person saw them."""
        return {
            "stored": self.stored,
            "state": self.state,
            "opened_at": self.opened_at.isoformat() if self.opened_at else None,
            "probes_reserved": self.probes_reserved,
            "window": {
                "calls": self.window_calls,
                "failures": self.window_failures,
                "buckets": self.window_buckets,
                "window_s": self.window_s,
            },
            "calls_by_state": dict(self.calls_by_state),
            "open_calls": self.open_calls,
            "tasks": self.tasks,
        }


# --- the dry run -----------------------------------------------------------------------------------------------------


def breaker_preview(*, tool_id: int, operation: str, now: datetime | None = None) -> BreakerPreview:
    """What `operation` (force_open, reset) would do to the tool's breaker now. Reads only: four statements (the tool
    with its breaker row, its buckets, its open calls by state, the tasks they belong to). Tool.DoesNotExist for an
    unknown id."""
    if operation not in K.values:
        raise Refusal("not_applicable", f"There is no breaker operation {operation!r}.")
    now = now or timezone.now()
    tool = Tool.objects.select_related("breaker_row").get(pk=tool_id)
    policy = breaker_policy(tool)
    row = getattr(tool, "breaker_row", None)
    stored = row.state if row is not None else CLOSED
    state_row = None if row is None else (row.state, row.opened_at, row.probes_reserved, row.probe_lease_until)
    view = view_of_state(state_row, policy, now)
    buckets = list(BreakerBucket.objects.filter(tool_id=tool.pk).values_list("bucket_start", "successes", "failures"))
    calls, failures = rules.window_totals(buckets, policy, now.timestamp())
    open_calls = Call.objects.filter(tool_id=tool.pk, state__in=OPEN_CALL_STATES)
    counted = Counter(dict(open_calls.order_by().values_list("state").annotate(n=Count("pk"))))
    tasks = open_calls.order_by().values("task_id").distinct().count() if counted else 0
    return BreakerPreview(
        tool_id=tool.pk,
        tool=tool.name,
        operation=operation,
        stored=stored,
        state=view.state,
        opened_at=row.opened_at if row is not None else None,
        updated_at=row.updated_at if row is not None else None,
        probes_reserved=row.probes_reserved if row is not None else 0,
        window_calls=calls,
        window_failures=failures,
        window_buckets=len(buckets),
        window_s=policy.window_s,
        calls_by_state={str(s): counted[s] for s in OPEN_CALL_STATES if counted.get(s)},
        tasks=tasks,
        refusal=_refusal(operation, stored),
    )


def _refusal(operation: str, stored: str) -> str:
    if operation == K.FORCE_OPEN and stored == FORCED_OPEN:
        return "The breaker is already forced open: only a reset closes it."
    if operation == K.RESET and stored == CLOSED:
        return "The breaker is closed: there is nothing to reset."
    return ""


# --- checks shared by every step -------------------------------------------------------------------------------------


def _require(user, permission: str, what: str) -> None:
    if not (user.is_active and user.has_perm(permission)):
        role = "reviewer" if permission == REVIEW_PERMISSION else "approver"
        raise Refusal("role", f"{what} needs the {role} role ({permission}).")


def clean_reason(reason: str | None) -> str:
    reason = (reason or "").strip()
    if not reason:
        message = "Give a reason: it is recorded with the operation and shown on the breakers page."
        raise Refusal("reason", message, field="reason")
    if len(reason) > REASON_MAX:
        raise Refusal("reason", f"The reason must be at most {REASON_MAX} characters.", field="reason")
    return reason


def _ttl() -> timedelta:
    return timedelta(seconds=settings.RECOVERY_ACTION_TTL_S)


def _event(
    action: AuditAction, op: BreakerOperation, actor: Actor, *, reason: str, from_state="", to_state="", **evidence
) -> None:
    append_event(
        action=action,
        actor=actor,
        from_state=from_state,
        to_state=to_state,
        reason=reason,
        evidence={
            "tool": op.tool.name,
            "operation": op.operation,
            "breaker_operation": op.pk,
            "requested_by": op.requested_by.get_username(),
            **evidence,
        },
    )


# --- force open ------------------------------------------------------------------------------------------------------


def breaker_force_open(*, tool_id: int, user, actor: Actor, reason: str) -> BreakerOperation:
    """Force the tool's breaker open on one reviewer's confirmation: the move, the operation (APPLIED, no decider)
    and its audit event in one transaction. Refused when it is forced open already."""
    _require(user, REVIEW_PERMISSION, "Forcing a breaker open")
    reason = clean_reason(reason)
    for _ in range(FORCE_TRIES):
        now = timezone.now()
        shown = breaker_preview(tool_id=tool_id, operation=K.FORCE_OPEN, now=now)
        if shown.refusal:
            raise Refusal("not_applicable", shown.refusal)
        with transaction.atomic():
            if not _force(shown, now):
                continue  # another process moved the breaker after we read it: read it again
            op = BreakerOperation.objects.create(
                tool_id=shown.tool_id,
                operation=K.FORCE_OPEN,
                status=ST.APPLIED,
                reason=reason,
                requested_by=user,
                requested_at=now,
                breaker_state=shown.stored,
                breaker_updated_at=shown.updated_at,
                preview=shown.figures(),
                applied_at=now,
                updated_at=now,
            )
            _event(
                AuditAction.BREAKER_FORCED_OPEN,
                op,
                actor,
                reason=reason,
                from_state=shown.stored,
                to_state=FORCED_OPEN,
                open_calls=shown.open_calls,
                tasks=shown.tasks,
            )
        return _load(op.pk)
    raise Refusal("busy", "The breaker kept changing while it was being forced open: try again.")


def _force(shown: BreakerPreview, now: datetime) -> bool:
    """The stored state `shown` read → forced_open; False when the row is not in that state any more."""
    if shown.updated_at is None:  # no row: the breaker never opened (False: a concurrent opener created it first)
        return breaker_create(shown.tool_id, FORCED_OPEN, now=now)
    return bool(
        Breaker.objects.filter(tool_id=shown.tool_id, state=shown.stored).update(
            state=FORCED_OPEN, opened_at=now, probes_reserved=0, probe_lease_until=None, updated_at=now
        )
    )


# --- reset: request ------------------------------------------------------------------------------------------------


def breaker_request_reset(*, tool_id: int, user, actor: Actor, reason: str, seen: str) -> BreakerOperation:
    """A reviewer asks for a reset of the breaker as their dry run showed it (`seen`: BreakerPreview.version):
    REQUESTED, waiting for a different person with the approver role. Refused when the breaker is closed, moved since
    the dry run, or already has a pending reset."""
    _require(user, REVIEW_PERMISSION, "Requesting a breaker reset")
    reason = clean_reason(reason)
    now = timezone.now()
    shown = breaker_preview(tool_id=tool_id, operation=K.RESET, now=now)
    if shown.refusal:
        raise Refusal("not_applicable", shown.refusal)
    if seen != shown.version:
        raise Refusal(
            "stale", f"The breaker moved since your dry run (it is {shown.stored} now): read the dry run again."
        )
    _expire(BreakerOperation.objects.filter(tool_id=tool_id, status=ST.REQUESTED, expires_at__lte=now), now)
    pending = BreakerOperation.objects.filter(tool_id=tool_id, status=ST.REQUESTED).select_related("requested_by")
    if found := pending.first():
        raise _already_pending(found)
    try:
        with transaction.atomic():
            op = BreakerOperation.objects.create(
                tool_id=tool_id,
                operation=K.RESET,
                status=ST.REQUESTED,
                reason=reason,
                requested_by=user,
                requested_at=now,
                breaker_state=shown.stored,
                breaker_updated_at=shown.updated_at,
                preview=shown.figures(),
                expires_at=now + _ttl(),
                updated_at=now,
            )
            _event(AuditAction.BREAKER_RESET_REQUESTED, op, actor, reason=reason, from_state=shown.stored)
    except IntegrityError:  # breaker_one_pending_reset: another reviewer's request got in first
        raise _already_pending(pending.first()) from None
    return _load(op.pk)


def _already_pending(found: BreakerOperation | None) -> Refusal:
    who = f" by {found.requested_by.get_username()}" if found is not None else ""
    return Refusal(
        "pending", f"A reset of this breaker is already requested{who}: an approver approves or rejects it first."
    )


# --- reset: decide -------------------------------------------------------------------------------------------------


def _load(operation_id: int) -> BreakerOperation:
    return BreakerOperation.objects.select_related("tool", "requested_by", "decided_by").get(pk=operation_id)


def _decidable(operation_id: int, user, what: str, now: datetime) -> BreakerOperation:
    """The reset request, REQUESTED, not the user's own, not expired; refused otherwise (the role first)."""
    _require(user, APPROVE_PERMISSION, what)
    op = _load(operation_id)
    if op.operation != K.RESET or op.status != ST.REQUESTED:
        raise Refusal("not_pending", f"This operation is {op.status}: nothing more can be done with it.")
    if op.requested_by_id == user.pk:
        raise Refusal(
            "four_eyes", "You requested this reset: a different person with the approver role decides it (four eyes)."
        )
    if op.expires_at is not None and now >= op.expires_at:
        _expire(BreakerOperation.objects.filter(pk=op.pk, status=ST.REQUESTED), now)
        raise Refusal("expired", "This reset request expired: request it again from a new dry run.")
    return op


def breaker_approve_reset(*, operation_id: int, user, actor: Actor, reason: str) -> BreakerOperation:
    """REQUESTED → APPLIED by a second person: the breaker closes, its window and probes are cleared. STALE instead
    (and refused) when the breaker moved since the request; applied once however many approve at once."""
    _require(user, APPROVE_PERMISSION, "Approving a breaker reset")
    reason = clean_reason(reason)
    now = timezone.now()
    op = _decidable(operation_id, user, "Approving a breaker reset", now)
    with transaction.atomic():
        # The request's row first: a second approval waits here and then finds it decided.
        claimed = BreakerOperation.objects.filter(pk=op.pk, status=ST.REQUESTED).update(
            status=ST.APPLIED, decided_by=user, decided_at=now, decision_reason=reason, applied_at=now, updated_at=now
        )
        if not claimed:
            raise _not_pending(op.pk)
        closed = Breaker.objects.filter(
            tool_id=op.tool_id, state=op.breaker_state, updated_at=op.breaker_updated_at
        ).update(state=CLOSED, opened_at=None, probes_reserved=0, probe_lease_until=None, updated_at=now)
        if closed:
            cleared = BreakerBucket.objects.filter(tool_id=op.tool_id)
            calls = sum(s + f for s, f in cleared.values_list("successes", "failures"))
            buckets = cleared._raw_delete(connection.alias)
            _event(
                AuditAction.BREAKER_RESET,
                op,
                actor,
                reason=f"{op.reason} (approved: {reason})",
                from_state=op.breaker_state,
                to_state=CLOSED,
                decided_by=user.get_username(),
                cleared_calls=calls,
                cleared_buckets=buckets,
            )
        else:
            BreakerOperation.objects.filter(pk=op.pk).update(status=ST.STALE, applied_at=None, updated_at=now)
            why = _moved(op)
            _event(AuditAction.BREAKER_RESET_STALE, op, actor, reason=why, from_state=op.breaker_state)
    if not closed:
        raise Refusal("stale", f"Not applied: {_moved(op)}. Request a reset again if it is still needed.")
    return _load(op.pk)


def _moved(op: BreakerOperation) -> str:
    now_state = Breaker.objects.filter(tool_id=op.tool_id).values_list("state", flat=True).first() or CLOSED
    return f"the breaker moved since the request (it was {op.breaker_state}, it is {now_state} now)"


def _not_pending(operation_id: int) -> Refusal:
    status = BreakerOperation.objects.filter(pk=operation_id).values_list("status", flat=True).first()
    return Refusal("not_pending", f"This operation is {status} now: nothing more can be done with it.")


def breaker_reject_reset(*, operation_id: int, user, actor: Actor, reason: str) -> BreakerOperation:
    """REQUESTED → REJECTED by a second person, with a reason; the breaker is left as it is."""
    _require(user, APPROVE_PERMISSION, "Rejecting a breaker reset")
    reason = clean_reason(reason)
    now = timezone.now()
    op = _decidable(operation_id, user, "Rejecting a breaker reset", now)
    with transaction.atomic():
        moved = BreakerOperation.objects.filter(pk=op.pk, status=ST.REQUESTED).update(
            status=ST.REJECTED, decided_by=user, decided_at=now, decision_reason=reason, updated_at=now
        )
        if not moved:
            raise _not_pending(op.pk)
        _event(
            AuditAction.BREAKER_RESET_REJECTED,
            op,
            actor,
            reason=reason,
            from_state=op.breaker_state,
            decided_by=user.get_username(),
        )
    return _load(op.pk)


# --- expiry --------------------------------------------------------------------------------------------------------


def _expire(due, now: datetime, actor: Actor | None = None) -> int:
    """Each REQUESTED reset of `due` → EXPIRED (a conditional UPDATE each), with its audit event; how many."""
    actor = actor or Actor.job("breaker-operations-expire")
    expired = 0
    for op in due.select_related("tool", "requested_by").order_by("expires_at")[:SWEEP_LIMIT]:
        with transaction.atomic():
            if BreakerOperation.objects.filter(pk=op.pk, status=ST.REQUESTED).update(status=ST.EXPIRED, updated_at=now):
                why = f"not decided before {op.expires_at.isoformat()}"
                _event(AuditAction.BREAKER_RESET_EXPIRED, op, actor, reason=why, from_state=op.breaker_state)
                expired += 1
    return expired


def breaker_operations_expire_due(*, now: datetime | None = None) -> int:
    """Periodic: reset requests nobody decided before their expiry → EXPIRED; how many."""
    now = now or timezone.now()
    return _expire(BreakerOperation.objects.filter(status=ST.REQUESTED, expires_at__lte=now), now)

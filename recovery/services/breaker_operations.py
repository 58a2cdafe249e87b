"""An operator's force open and reset of a tool's circuit breaker (docs/breakers.md, "Forcing a breaker open and
resetting it"). A force open is protective: one reviewer's confirmation applies it. A reset is a four-eyes request
(recovery.services.approvals) bound to the breaker's row as the dry run read it: approving applies it to that row only,
else the request goes STALE. Lock order, as in services.breakers: the operation row, the breaker row and its buckets,
then the audit heads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.db import IntegrityError, transaction
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
from recovery.services import approvals
from recovery.services.breakers import breaker_create
from recovery.services.errors import Refusal
from recovery.statemachine.notices import notice_breaker_opened

K, ST = BreakerOperationKind, BreakerOperationStatus
REASON_MAX = approvals.REASON_MAX
REASON_USE = "recorded with the operation and shown on the breakers page"
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
    window_buckets: int  # buckets in the window holding an outcome (rules.window_buckets), which a reset forgets
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
    try:
        row = tool.breaker_row  # read with the tool
    except Breaker.DoesNotExist:
        row = None  # the breaker never opened
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
        window_buckets=rules.window_buckets(buckets, policy, now.timestamp()),
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


# --- the four-eyes kind ----------------------------------------------------------------------------------------------


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


_EVENTS = {
    ST.REQUESTED: AuditAction.BREAKER_RESET_REQUESTED,
    ST.REJECTED: AuditAction.BREAKER_RESET_REJECTED,
    ST.STALE: AuditAction.BREAKER_RESET_STALE,
    ST.EXPIRED: AuditAction.BREAKER_RESET_EXPIRED,
}


def _record(op: BreakerOperation, to: str, actor: Actor, *, reason: str, was: str, user) -> None:
    """A four-eyes step of a reset request (an applied reset's event is its apply step's: what it cleared)."""
    decided = {"decided_by": user.get_username()} if to == ST.REJECTED else {}
    _event(_EVENTS[to], op, actor, reason=reason, from_state=op.breaker_state, **decided)


RESET = approvals.FourEyes(
    model=BreakerOperation,
    noun="operation",
    thing="reset",
    own="You requested this reset: a different person with the approver role decides it (four eyes).",
    expired="This reset request expired: request it again from a new dry run.",
    reason_use=REASON_USE,
    record=_record,
    related=("tool", "requested_by", "decided_by"),
    sweep_limit=SWEEP_LIMIT,
)


# --- force open ------------------------------------------------------------------------------------------------------


def breaker_force_open(*, tool_id: int, user, actor: Actor, reason: str) -> BreakerOperation:
    """Force the tool's breaker open on one reviewer's confirmation: the move, the operation (APPLIED, no decider)
    and its audit event in one transaction. Refused when it is forced open already."""
    approvals.require_role(user, REVIEW_PERMISSION, "Forcing a breaker open")
    reason = approvals.clean_reason(reason, use=REASON_USE)
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
            notice_breaker_opened(shown.tool_id, shown.tool, forced=True, reason="forced_open")
        return approvals.load(RESET, op.pk)
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
    approvals.require_role(user, REVIEW_PERMISSION, "Requesting a breaker reset")
    reason = approvals.clean_reason(reason, use=REASON_USE)
    now = timezone.now()
    shown = breaker_preview(tool_id=tool_id, operation=K.RESET, now=now)
    if shown.refusal:
        raise Refusal("not_applicable", shown.refusal)
    if seen != shown.version:
        raise Refusal(
            "stale", f"The breaker moved since your dry run (it is {shown.stored} now): read the dry run again."
        )
    approvals.expire_due(RESET, actor=_expiry_job(), now=now, statuses=(ST.REQUESTED,), tool_id=tool_id)
    pending = BreakerOperation.objects.filter(tool_id=tool_id, status=ST.REQUESTED).select_related("requested_by")
    if found := pending.first():
        raise _already_pending(found)
    try:
        op = approvals.create_requested(
            RESET,
            user=user,
            actor=actor,
            reason=reason,
            now=now,
            tool_id=tool_id,
            operation=K.RESET,
            breaker_state=shown.stored,
            breaker_updated_at=shown.updated_at,
            preview=shown.figures(),
        )
    except IntegrityError:  # breaker_one_pending_reset: another reviewer's request got in first
        raise _already_pending(pending.first()) from None
    return approvals.load(RESET, op.pk)


def _already_pending(found: BreakerOperation | None) -> Refusal:
    who = f" by {found.requested_by.get_username()}" if found is not None else ""
    return Refusal(
        "pending", f"A reset of this breaker is already requested{who}: an approver approves or rejects it first."
    )


# --- reset: decide -------------------------------------------------------------------------------------------------


def breaker_approve_reset(*, operation_id: int, user, actor: Actor, reason: str) -> BreakerOperation:
    """REQUESTED → APPLIED by a second person: the breaker closes, its window and probes are cleared. STALE instead
    (and refused) when the breaker moved since the request; applied once however many approve at once."""
    asked = approvals.decidable(
        RESET, operation_id, user=user, actor=actor, reason=reason, what="Approving a breaker reset"
    )
    # The request's row first (a second approval waits on it, then finds it decided), then the breaker's.
    changes = {"applied_at": asked.now}
    if not approvals.decide(asked, to=ST.APPLIED, changes=changes, then=lambda: _apply_reset(asked), record=False):
        raise Refusal("stale", f"Not applied: {_moved(asked.row)}. Request a reset again if it is still needed.")
    return approvals.load(RESET, operation_id)


def _apply_reset(asked: approvals.Asked) -> bool:
    """The breaker as it was requested → closed, its window and probes cleared, with its event; when it moved since,
    the request → STALE instead (its event). Whether it was applied."""
    op, now = asked.row, asked.now
    closed = Breaker.objects.filter(tool_id=op.tool_id, state=op.breaker_state, updated_at=op.breaker_updated_at)
    if not closed.update(state=CLOSED, opened_at=None, probes_reserved=0, probe_lease_until=None, updated_at=now):
        BreakerOperation.objects.filter(pk=op.pk).update(status=ST.STALE, applied_at=None, updated_at=now)
        _record(op, ST.STALE, asked.actor, reason=_moved(op), was=ST.REQUESTED, user=None)
        return False
    cleared = BreakerBucket.objects.filter(tool_id=op.tool_id)
    calls = sum(s + f for s, f in cleared.values_list("successes", "failures"))
    buckets, _ = cleared.delete()
    _event(
        AuditAction.BREAKER_RESET,
        op,
        asked.actor,
        reason=f"{op.reason} (approved: {asked.reason})",
        from_state=op.breaker_state,
        to_state=CLOSED,
        decided_by=asked.user.get_username(),
        cleared_calls=calls,
        cleared_buckets=buckets,
    )
    return True


def _moved(op: BreakerOperation) -> str:
    now_state = Breaker.objects.filter(tool_id=op.tool_id).values_list("state", flat=True).first() or CLOSED
    return f"the breaker moved since the request (it was {op.breaker_state}, it is {now_state} now)"


def breaker_reject_reset(*, operation_id: int, user, actor: Actor, reason: str) -> BreakerOperation:
    """REQUESTED → REJECTED by a second person, with a reason; the breaker is left as it is."""
    asked = approvals.decidable(
        RESET, operation_id, user=user, actor=actor, reason=reason, what="Rejecting a breaker reset"
    )
    approvals.decide(asked, to=ST.REJECTED)
    return approvals.load(RESET, operation_id)


# --- expiry --------------------------------------------------------------------------------------------------------


def _expiry_job() -> Actor:
    return Actor.job("breaker-operations-expire")


def breaker_operations_expire_due(*, now: datetime | None = None) -> int:
    """Periodic: reset requests nobody decided before their expiry → EXPIRED; how many."""
    return approvals.expire_due(RESET, actor=_expiry_job(), now=now, statuses=(ST.REQUESTED,))

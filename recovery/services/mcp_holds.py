"""Approval holds of the MCP gateway (docs/mcp-gateway.md, "Approval holds"): a call whose tool the registry holds for
an approval is denied its first admission (`approval_required`) and stays READY; the gateway stores the preview of
its execution — the exact `tools/call` — as an `execute_held` action request, which a reviewer requests and a
different approver approves through the one four-eyes service (recovery.services.actions). A worker then executes it
once (recovery.services.action_execution). No new call state: a held call is READY, an executed one moves as any
attempt's, and a refused one ends FAILED_PERMANENT through the transition function.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.engine.states import CallState
from recovery.models import ActionRequest, ActionStatus, Call
from recovery.services.action_plans import build_plan, call_facts, call_for_action
from recovery.services.actions import HOLD_ACTION, store_preview

S = CallState
A = ActionStatus
UNDECIDED = (A.PREVIEWED, A.REQUESTED)  # a person still has to act on it
WAITING = (*UNDECIDED, A.APPROVED, A.EXECUTING)  # the client waits on it


def latest_hold(call_id: int) -> ActionRequest | None:
    """The call's hold (an execute_held request), or None: the one a person acted on furthest (approved or executed
    before requested, requested before previewed — a reviewer may preview it again from the call page), else the
    newest."""
    rank = {A.EXECUTED: 0, A.EXECUTING: 0, A.APPROVED: 0, A.REQUESTED: 1}
    holds = list(ActionRequest.objects.filter(call_id=call_id, action=HOLD_ACTION).order_by("-pk"))
    return min(holds, key=lambda request: rank.get(request.status, 2), default=None)


def hold(call_id: int, actor: Actor) -> ActionRequest:
    """The held call's preview, stored by the gateway on its first denial (once: a re-issue finds it)."""
    existing = latest_hold(call_id)
    if existing is not None:
        return existing
    now = timezone.now()
    call = call_for_action(call_id)
    plan = build_plan(call, HOLD_ACTION, facts=call_facts(call, now=now), evidence={}, now=now)
    return store_preview(call, plan, {}, user=None, actor=actor, now=now)


@dataclass(frozen=True)
class Held:
    """Where a held call stands for the client: still waiting, or decided (and how)."""

    call: Call
    request: ActionRequest
    waiting: bool
    refusal: str = ""  # why it was refused (rejected, superseded, expired, cancelled); "" when it was not

    @property
    def cancelled(self) -> bool:
        return _cancelled(self.request)

    @property
    def waited_s(self) -> int:
        return int((timezone.now() - self.call.created_at).total_seconds())

    def shown(self) -> dict:
        return {"request_id": self.request.pk, "status": self.request.status, "waiting_s": self.waited_s}


def _cancelled(request: ActionRequest) -> bool:
    """Its client cancelled it (the tasks extension's `tasks/cancel`) before anyone approved it."""
    return bool((request.result or {}).get("cancelled_by_client"))


def where(call_id: int, now: datetime | None = None) -> Held | None:
    """The call's hold as the client is answered, or None when the call has none."""
    request = latest_hold(call_id)
    if request is None:
        return None
    now = now or timezone.now()
    call = Call.objects.select_related("tool__provider").get(pk=call_id)
    if _cancelled(request):
        return Held(call, request, False, f"call {call.pk} was cancelled by its client before approval; it never ran")
    superseded = (request.result or {}).get("superseded_by")
    if superseded:
        why = f"call {call.pk} was not executed: another hold of the same tool (call {superseded}) was approved"
        return Held(call, request, False, why)
    if request.status == A.REJECTED:
        return Held(call, request, False, f"call {call.pk} was rejected: {request.decision_reason}")
    expired = request.status == A.EXPIRED or (request.status in UNDECIDED and request.past_expiry(now))
    if expired:
        return Held(call, request, False, f"call {call.pk} was not approved before its hold expired; it never ran")
    if request.status in (A.WITHDRAWN, A.STALE) and call.state == S.READY:
        return Held(call, request, False, f"call {call.pk}'s hold is {request.status}: it never ran")
    return Held(call, request, request.status in WAITING and call.state in (S.READY, S.SENT))


@dataclass(frozen=True)
class HeldRow:
    """A pending hold as the Approvals page lists it."""

    request: ActionRequest
    waiting_s: int

    @property
    def call(self) -> Call:
        return self.request.call


def pending_holds(now: datetime | None = None, limit: int = 200) -> list[list[HeldRow]]:
    """The undecided holds, oldest first, grouped per (task, tool): a task's re-issues with other arguments are
    shown together, since approving one refuses the others."""
    now = now or timezone.now()
    rows = (
        ActionRequest.objects.filter(action=HOLD_ACTION, status__in=UNDECIDED, call__state=S.READY, expires_at__gt=now)
        .select_related("call__task__tenant", "call__tool__provider", "requested_by")
        .order_by("call__created_at")[:limit]
    )
    groups: dict[tuple[int, int], list[HeldRow]] = {}
    for request in rows:
        waited = int((now - request.call.created_at).total_seconds())
        groups.setdefault((request.call.task_id, request.call.tool_id), []).append(HeldRow(request, waited))
    return list(groups.values())

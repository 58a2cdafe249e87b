"""Executing approved operator actions (docs/actions.md, "Execution"): once, by a worker that claims the request by a
conditional UPDATE (APPROVED → EXECUTING with a lease), re-checks the call and runs the action — a move of the call in
one transaction, or a replay, reconcile or compensation sent with no transaction open and reported like any attempt.
A worker that dies leaves the request EXECUTING; past its lease `actions_sweep_interrupted` marks it INTERRUPTED,
never run again."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import anyio
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, appends_at_commit
from recovery.engine.actions import REVIEW_PERMISSION
from recovery.engine.reconcile import Observation
from recovery.engine.states import CallState
from recovery.engine.types import APPROVAL_GRANTED
from recovery.models import (
    ActionRequest,
    ActionStatus,
    Attempt,
    Call,
    Receipt,
    ReceiptSource,
    RetryPath,
)
from recovery.providers.mcp import CONNECT_S, facts_of_forward, forward_once, timeout_of
from recovery.providers.requests import TemplateError, send, tool_request
from recovery.registry import with_alternates
from recovery.selectors.context import action_attempt_id
from recovery.services import probes, reconcile
from recovery.services.action_plans import ACTION_BY_NAME, action_event, call_facts, held_request, require_allowed
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.calls import call_abandon
from recovery.services.compensations import compensation_send, compensation_settle, compensation_start
from recovery.services.errors import Refusal
from recovery.services.outcomes import attempt_report, facts_of
from recovery.statemachine.transitions import TransitionConflict, transition_call

A = ActionStatus
S = CallState
SWEEP_LIMIT = 500
logger = logging.getLogger("recovery.actions")


def _job() -> Actor:
    """The worker executing approved actions, as the audit trail names it."""
    return Actor.job("actions")


class _Failed(Exception):
    """The action could not run; `result` says why. Nothing it was about to do was done."""

    def __init__(self, what: str, **result):
        super().__init__(what)
        self.result = {"what": what, **result}


class _LeaseLost(Exception):
    """The request is no longer this worker's (the sweep marked it interrupted): its changes are rolled back."""


def _lease_s(request: ActionRequest) -> float:
    provider = request.call.tool.provider
    # A lease shorter than the provider's timeouts would let the sweep interrupt a worker still waiting for a reply.
    # The margin covers recording the reply; a worker that overruns it is marked interrupted but never run twice.
    if provider.mcp:  # an MCP server's start has its own allowance, then the call its own timeout
        return max(settings.RECOVERY_ACTION_LEASE_S, CONNECT_S + timeout_of(provider) + 10)
    return max(settings.RECOVERY_ACTION_LEASE_S, provider.connect_timeout_s + provider.read_timeout_s + 10)


def _claim(request_id: int, worker: str, now: datetime) -> ActionRequest | None:
    """APPROVED → EXECUTING for this worker, with a lease; None when it is not approved (any more)."""
    related = ("call__tool__provider", "requested_by", "decided_by")
    request = ActionRequest.objects.select_related(*related).filter(pk=request_id).first()
    if request is None or request.status != A.APPROVED:
        return None
    until = now + timedelta(seconds=_lease_s(request))
    with transaction.atomic():
        claimed = ActionRequest.objects.filter(pk=request_id, status=A.APPROVED).update(
            status=A.EXECUTING, execution_owner=worker[:100], execution_lease_until=until, updated_at=now
        )
        if claimed:
            action_event(
                AuditAction.ACTION_EXECUTING,
                request,
                request.call,
                _job(),
                reason=f"claimed by worker {worker}",
                status=A.EXECUTING,
                worker=worker,
                lease_until=until.isoformat(),
            )
    if not claimed:
        return None
    request.status, request.execution_owner, request.execution_lease_until = A.EXECUTING, worker[:100], until
    return request


def action_execute(request_id: int, *, worker: str) -> ActionRequest:
    """The job's body: claim the APPROVED request (a second claim gets nothing and returns) and run it once."""
    now = timezone.now()
    request = _claim(request_id, worker, now)
    if request is None:
        return ActionRequest.objects.get(pk=request_id)
    try:
        _EXECUTORS[request.action](request, worker)
    except _Failed as failed:
        _finish_alone(request, worker, A.FAILED, failed.result)
    except _LeaseLost:
        logger.warning(
            "action request %s: the lease was lost before it finished; left as the sweep marked it", request.pk
        )
    except Exception as exc:
        logger.exception("action request %s failed", request.pk)
        _finish_alone(request, worker, A.FAILED, {"what": f"the execution failed: {type(exc).__name__}"})
    return ActionRequest.objects.get(pk=request_id)


def _finish(request: ActionRequest, call: Call, worker: str, status: str, result: dict) -> None:
    """EXECUTING → EXECUTED / FAILED with its result and audit event, in the caller's transaction; _LeaseLost when
    the request is no longer this worker's (everything the caller did in its transaction then rolls back)."""
    now = timezone.now()
    done = ActionRequest.objects.filter(pk=request.pk, status=A.EXECUTING, execution_owner=worker[:100]).update(
        status=status, result=result, executed_at=now, execution_lease_until=None, updated_at=now
    )
    if not done:
        raise _LeaseLost
    action_event(
        AuditAction.request_entered(status),
        request,
        call,
        _job(),
        reason=result["what"],
        status=status,
        worker=worker,
        result=result,
    )


def _finish_alone(request: ActionRequest, worker: str, status: str, result: dict) -> None:
    """_finish in a transaction of its own, for work that ran outside one (the replay, the reconcile)."""
    call = request.call
    try:
        with transaction.atomic():
            _finish(request, call, worker, status, result)
    except _LeaseLost:
        # Interrupted by the sweep while it was still running: the story gets its end anyway, marked late.
        with transaction.atomic():
            late = "finished after its lease ended (already marked interrupted): " + result["what"]
            action_event(
                AuditAction.request_entered(status),
                request,
                call,
                _job(),
                reason=late,
                status=A.INTERRUPTED,
                worker=worker,
                result=result,
                late=True,
            )


def _current(request: ActionRequest, *, lock: bool = False) -> Call:
    """The call re-read now, checked against what was approved: the same version, the action still allowed."""
    calls = Call.objects.select_related("task__tenant", "step", "tool__provider", "claimed_by")
    if lock:
        calls = calls.select_for_update(of=("self",))
    call = calls.get(pk=request.call_id)
    if call.version != request.call_version:
        raise _Failed(
            f"the call changed since it was approved (version {request.call_version} → {call.version}, now "
            f"{call.state}): nothing was done; preview again",
            call_state=call.state,
        )
    facts = call_facts(call, now=timezone.now())
    try:
        require_allowed(call, facts, request.action, perms={REVIEW_PERMISSION}, held_by="")
    except Refusal as refused:
        raise _Failed(f"no longer allowed: {refused.message}", call_state=call.state) from None
    return call


def _why(request: ActionRequest) -> str:
    decider = request.decided_by.get_username() if request.decided_by else "one confirmation"
    requester = request.requested_by.get_username() if request.requested_by else "?"
    label = ACTION_BY_NAME[request.action].label
    return f"{label}: action request #{request.pk}, requested by {requester}, approved by {decider}: {request.reason}"


def _execute_replay(request: ActionRequest, worker: str) -> None:
    """Admission on approval_granted (an Attempt, the call SENT), the tool's request with the original key, and its
    reply (or exception) reported as any attempt's outcome. No transaction is open while the request is out."""
    actor = _job()
    call = _current(request)
    with_alternates(call.tool)
    try:
        outgoing = tool_request(call.tool, call)
    except TemplateError as exc:
        raise _Failed(f"the tool's request cannot be built: {exc}; nothing was sent", call_state=call.state) from None
    attempt = _admit_approved(request, call, actor, "the replay")
    facts = send(outgoing)
    seen = f"HTTP {facts['http_status']}" if "http_status" in facts else (facts.get("error") or {}).get("kind", "?")
    common = {"attempt_id": attempt.attempt_id, "attempt_number": attempt.number, "sent": seen}
    try:
        call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
        with_alternates(call.tool)
        answer = attempt_report(call=call, attempt=attempt, facts=facts_of(facts), actor=actor)
    except Exception:
        logger.exception("action request %s: the replay's reply could not be recorded", request.pk)
        what = (
            f"replayed with key {call.idempotency_key} ({seen}), but the reply could not be recorded: the call stays "
            "SENT until the sweeper makes it UNKNOWN and reconciliation settles it; it is never replayed again"
        )
        _finish_alone(request, worker, A.FAILED, {"what": what, **common, "call_state": S.SENT})
        return
    state = answer["call_state"]
    then = {
        S.UNKNOWN: ": the outcome is unknown, reconciliation settles it by key (never a second replay)",
        S.COMMITTED: "",
    }.get(state, "")
    what = f"replayed with the original key {call.idempotency_key}: {seen} → {state}{then}"
    result = {"what": what, **common, "call_state": state, "route": (answer.get("decision") or {}).get("route")}
    _finish_alone(request, worker, A.EXECUTED, result)


def _admit_approved(request: ActionRequest, call: Call, actor: Actor, what: str) -> Attempt:
    """The attempt an approved request sends: admitted on approval_granted under the request's own attempt id, or
    _Failed with nothing sent (`what`: how the failure names the send, "the replay")."""
    approved = AttemptRequest(attempt_id=action_attempt_id(request.pk), evidence=(APPROVAL_GRANTED,))
    try:
        admission = attempt_admit(call=call, request=approved, actor=actor)
    except Refusal as exc:
        raise _Failed(
            f"admission failed ({exc.code}: {exc.message}): nothing was sent", call_state=call.state
        ) from None
    if admission.status != 201:
        gate = admission.response.get("gate") or {}
        denied = f"the gate denied {what} ({gate.get('reason', 'already admitted once')}): nothing was sent"
        raise _Failed(denied, gate=gate.get("reason"), call_state=call.state)
    return Attempt.objects.select_related("tool__provider").get(call_id=call.pk, attempt_id=approved.attempt_id)


def _execute_held(request: ActionRequest, worker: str) -> None:
    """A held MCP call, approved (docs/mcp-gateway.md, "Approval holds"): admitted on approval_granted (an Attempt,
    the call SENT), the previewed `tools/call` sent once on a connection of this worker's own, and what came back
    reported as any attempt's outcome — the result kept for the client's re-issue; a timeout or a dying server
    leaves the call UNKNOWN for the status tool, never re-sent. No transaction is open while the call is out."""
    actor = _job()
    call = _current(request)
    tool = call.tool
    attempt = _admit_approved(request, call, actor, "the held call")
    body = held_request(call)["body"]
    done = anyio.run(forward_once, tool.provider, body["name"], body["arguments"], body["_meta"])
    facts = facts_of_forward(tool, done)
    common = {"attempt_id": attempt.attempt_id, "attempt_number": attempt.number}
    call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
    answer = attempt_report(call=call, attempt=attempt, facts=facts, actor=actor)
    state = answer["call_state"]
    then = " (its outcome is unknown: the status tool settles it, it is never re-sent)" if state == S.UNKNOWN else ""
    what = f"the held tools/call {body['name']} was sent once with key {call.idempotency_key}: {state}{then}"
    _finish_alone(request, worker, A.EXECUTED, {"what": what, **common, "call_state": state})


def _execute_reconcile(request: ActionRequest, worker: str) -> None:
    """The immediate status check of POST .../reconcile: a receipt, which may settle the call."""
    call = _current(request)
    receipt = reconcile.reconcile_call(call.pk, worker=worker)
    if receipt is None:
        raise _Failed("no check was made: another worker is checking this call right now, or it settled meanwhile")
    moved = (
        f"{receipt.local_state_before} → {receipt.local_state_after}"
        if receipt.applied
        else f"stayed {receipt.local_state_before}"
    )
    result = {
        "what": f"the provider's status API answered {receipt.observed}: the call {moved}",
        "receipt": receipt.pk,
        "observed": receipt.observed,
        "call_state": receipt.local_state_after,
    }
    _finish_alone(request, worker, A.EXECUTED, result)


def _execute_probe(request: ActionRequest, worker: str) -> None:
    """The duplicate probe (docs/replay.md): one same-key replay and one ledger read, no transaction open meanwhile; the
    probe's receipt and the retry path it decides are stored together. The call does not move."""
    call = _current(request)
    try:
        probe = probes.probe_call(call, actor=_job(), action=request)
    except TemplateError as exc:
        raise _Failed(f"the tool's request cannot be built: {exc}; nothing was sent", call_state=call.state) from None
    effects = "?" if probe.observed_effects is None else probe.observed_effects
    what = (
        f"duplicate probe #{probe.pk} of key {probe.idempotency_key}: second request {probe.second}, the provider's "
        f"ledger {probe.downstream_audit} ({effects} effect(s), {probe.expected_effects} expected) → {probe.decision}"
    )
    result = {"what": what, "probe": probe.pk, "decision": probe.decision, "call_state": call.state}
    _finish_alone(request, worker, A.EXECUTED, result)


def _restore_retry_path(request: ActionRequest, call: Call) -> dict:
    """Unsafe → safe by an approved action with its reason (docs/replay.md), covering keys as old as this call's."""
    tool = call.tool
    age = probes.key_age_s(call, timezone.now())
    probes.set_retry_path(tool, RetryPath.SAFE, actor=_job(), reason=_why(request), key_age_s=age)
    return {"what": f"{tool.name}'s retry path is safe again (keys up to {age} s old): {request.reason}"}


def _in_transaction(apply):
    """Run `apply(request, call)` (the call locked and checked) and the request's EXECUTED, in one transaction."""

    def execute(request: ActionRequest, worker: str) -> None:
        try:
            with transaction.atomic(), appends_at_commit():
                call = _current(request, lock=True)
                result = apply(request, call)
                _finish(request, call, worker, A.EXECUTED, {**result, "call_state": call.state})
        except TransitionConflict as exc:
            raise _Failed(f"the call moved at the same moment ({exc}): nothing was done; preview again") from None

    return execute


def _escalate(request: ActionRequest, call: Call) -> dict:
    before = call.state
    transition_call(
        call,
        S.HUMAN_REVIEW,
        actor=_job(),
        reason=_why(request),
        evidence={"action_request": request.pk},
        changes={"outcome": "human_review_required", "next_check_at": None},
    )
    return {"what": f"escalated: {before} → HUMAN_REVIEW"}


def _operator_receipt(request: ActionRequest, call: Call, observed: str, after: str) -> Receipt:
    evidence = request.evidence or {}
    now = timezone.now()
    return Receipt.objects.create(
        call=call,
        provider=call.tool.provider,
        source=ReceiptSource.OPERATOR,
        observed=observed,
        provider_status="operator",
        provider_ref=evidence.get("provider_ref", "")[:255],
        response={"evidence": evidence, "reason": request.reason},
        local_state_before=call.state,
        local_state_after=after,
        applied=True,
        forbidden=["blind_replay"] if observed == Observation.COMMITTED else [],
        next_actions=[],
        evidence=[f"action_request:{request.pk}", *(f"{key}:{value}" for key, value in sorted(evidence.items()))],
        checked_at=now,
        created_at=now,
    )


def _mark_committed(request: ActionRequest, call: Call) -> dict:
    receipt = _operator_receipt(request, call, Observation.COMMITTED, S.COMMITTED)
    changes = {"last_receipt_at": receipt.checked_at, "last_receipt_status": receipt.observed}
    if receipt.provider_ref and not call.provider_ref:
        changes["provider_ref"] = receipt.provider_ref
    evidence = {"action_request": request.pk, "receipt": receipt.pk}
    transition_call(call, S.COMMITTED, actor=_job(), reason=_why(request), evidence=evidence, changes=changes)
    return {
        "what": "marked committed on the evidence given: an operator receipt, HUMAN_REVIEW → COMMITTED",
        "receipt": receipt.pk,
    }


def _mark_not_committed(request: ActionRequest, call: Call) -> dict:
    then = S.RETRYABLE if call.has_attempts_left() else S.FAILED_PERMANENT
    receipt = _operator_receipt(request, call, Observation.NOT_COMMITTED, then)
    evidence = {"action_request": request.pk, "receipt": receipt.pk}
    changes = {"last_receipt_at": receipt.checked_at, "last_receipt_status": receipt.observed}
    transition_call(call, S.NOT_COMMITTED, actor=_job(), reason=_why(request), evidence=evidence, changes=changes)
    later = {"outcome": "retry_exhausted"} if then == S.FAILED_PERMANENT else {}
    reason = "a same-key retry may go, admitted on state_verified" if then == S.RETRYABLE else "no attempt is left"
    transition_call(call, then, actor=_job(), reason=reason, evidence=evidence, changes=later)
    return {
        "what": f"marked not committed on the evidence given: HUMAN_REVIEW → NOT_COMMITTED → {then}",
        "receipt": receipt.pk,
    }


def _grant_approval(request: ActionRequest, call: Call) -> dict:
    transition_call(call, S.RETRYABLE, actor=_job(), reason=_why(request), evidence={"action_request": request.pk})
    return {"what": "approval granted: the runtime's next attempt with approval_granted is admitted once (same key)"}


def _abandon(request: ActionRequest, call: Call) -> dict:
    before = call.state
    if before == S.HUMAN_REVIEW:
        transition_call(
            call,
            S.FAILED_PERMANENT,
            actor=_job(),
            reason=_why(request),
            evidence={"action_request": request.pk},
            changes={"outcome": "abandoned"},
        )
    else:
        try:
            call_abandon(call=call, actor=_job(), reason=_why(request))
        except Refusal as exc:
            raise _Failed(f"not abandoned: {exc.message}", call_state=before) from None
    return {"what": f"abandoned: {before} → FAILED_PERMANENT"}


def _execute_compensation(request: ActionRequest, worker: str) -> None:
    """The call's next compensation entry, made and sent once by this worker (docs/compensation.md): the entry moves the
    call to COMPENSATING in its own transaction, then its request goes out with its own key; what came back decides the
    entry (and, once final, the call). No transaction is open while the request is out."""
    call = _current(request)
    try:
        entry = compensation_start(call, actor=_job(), requested_by=request, send=False)
    except Refusal as exc:
        raise _Failed(f"no compensation was started ({exc.code}: {exc.message}): nothing was sent") from None
    common = {"compensation": entry.pk, "entry": entry.number, "idempotency_key": entry.idempotency_key}
    try:
        compensation_send(entry.pk, worker=worker)
    except Exception:
        logger.exception("action request %s: compensation %s could not be sent", request.pk, entry.pk)
        what = (
            f"compensation {entry.number} was made (key {entry.idempotency_key}) but its send failed here: the "
            "reconcile schedule sends or checks it; it is never sent twice without evidence"
        )
        _finish_alone(request, worker, A.EXECUTED, {"what": what, **common, "call_state": S.COMPENSATING})
        return
    entry.refresh_from_db()
    state = Call.objects.values_list("state", flat=True).get(pk=call.pk)
    then = {
        "unknown": ": its outcome is unknown, reconciliation settles it by its own key (never a second send)",
        "not_committed": ": nothing was executed, it is sent again with its own key",
    }.get(entry.state, "")
    what = f"compensation {entry.number} sent with its own key {entry.idempotency_key}: entry {entry.state}{then}"
    _finish_alone(
        request, worker, A.EXECUTED, {"what": what, **common, "entry_state": entry.state, "call_state": state}
    )


def _settle_entry(committed: bool):
    def settle(request: ActionRequest, call: Call) -> dict:
        try:
            entry = compensation_settle(
                call, committed=committed, evidence=request.evidence or {}, reason=_why(request), actor=_job()
            )
        except Refusal as exc:
            raise _Failed(f"nothing was settled: {exc.message}", call_state=call.state) from None
        call.refresh_from_db(fields=["state", "version"])
        return {
            "what": f"compensation {entry.number} marked {entry.state} on the evidence given: the call is {call.state}"
        }

    return settle


_EXECUTORS = {
    "reconcile_now": _execute_reconcile,
    "escalate": _in_transaction(_escalate),
    "replay_same_key": _execute_replay,
    "mark_committed": _in_transaction(_mark_committed),
    "mark_not_committed": _in_transaction(_mark_not_committed),
    "grant_approval": _in_transaction(_grant_approval),
    "abandon": _in_transaction(_abandon),
    "start_compensation": _execute_compensation,
    "approve_new_compensation": _execute_compensation,
    "mark_compensation_committed": _in_transaction(_settle_entry(committed=True)),
    "mark_compensation_failed": _in_transaction(_settle_entry(committed=False)),
    "probe_duplicate": _execute_probe,
    "restore_retry_path": _in_transaction(_restore_retry_path),
    "execute_held": _execute_held,
}


# --- the sweep -----------------------------------------------------------------------------------------------------


def actions_sweep_interrupted(*, now: datetime | None = None) -> int:
    """EXECUTING requests whose worker's lease has passed → INTERRUPTED, never run again; how many.

    The worker died (or hung) somewhere in the execution. Whatever it did stands: a replay it admitted left the
    call SENT, and the SENT sweeper makes it UNKNOWN after the tool's outcome timeout, for reconciliation to settle
    by key. Running it again could send the replay twice; so nothing re-runs an INTERRUPTED request.
    """
    now = now or timezone.now()
    due = ActionRequest.objects.filter(status=A.EXECUTING, execution_lease_until__lt=now).select_related("call")
    swept = 0
    for request in due.order_by("execution_lease_until")[:SWEEP_LIMIT]:
        call = request.call
        call.refresh_from_db(fields=["state", "version"])
        result = {
            "what": (
                f"the worker {request.execution_owner} stopped before finishing (its lease ended "
                f"{request.execution_lease_until.isoformat()}): never run again"
            ),
            "call_state": call.state,
            "attempt": request.attempt_id,
            "next": _after_interruption(call),
        }
        with transaction.atomic():
            moved = ActionRequest.objects.filter(
                pk=request.pk, status=A.EXECUTING, execution_owner=request.execution_owner
            ).update(status=A.INTERRUPTED, result=result, updated_at=now)
            if moved:
                action_event(
                    AuditAction.ACTION_INTERRUPTED,
                    request,
                    call,
                    Actor.job("actions-sweep"),
                    reason=f"{result['what']}; {result['next']}",
                    status=A.INTERRUPTED,
                    worker=request.execution_owner,
                    call_state=call.state,
                    attempt=request.attempt_id,
                )
        swept += moved
    return swept


def _after_interruption(call: Call) -> str:
    if call.state == S.COMPENSATING:
        return "its compensation entry is kept: the reconcile schedule sends or checks it by its own key"
    if call.state == S.SENT:
        return "the call stays SENT until the sweeper makes it UNKNOWN, then reconciliation settles it by key"
    return f"the call is {call.state}: a person may preview an action again"


def actions_approved_waiting(*, now: datetime | None = None, older_than_s: int = 30) -> list[int]:
    """APPROVED requests no worker has claimed for a while (their enqueue was lost, e.g. Redis was down at commit):
    the periodic job enqueues them again; the claim makes a duplicate harmless. A bulk's item requests are not
    among them: only their bulk's worker runs them (recovery.services.bulk), and its sweep interrupts them."""
    now = now or timezone.now()
    waiting = ActionRequest.objects.filter(
        status=A.APPROVED, updated_at__lte=now - timedelta(seconds=older_than_s), bulk_items__isnull=True
    )
    return list(waiting.order_by("pk").values_list("pk", flat=True)[:SWEEP_LIMIT])

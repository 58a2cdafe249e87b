"""Compensation ledgers (docs/compensation.md): undo a committed effect as its own reconciled side effect.
An entry's reply is read by the docs/design/classification.md table, its tool's `refusal_codes` first; its budget is its
own tool's max_attempts, never the task's. Every state change goes through transition_entry / transition_call.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.classify import classify
from recovery.engine.compensation_states import FINAL, SENDABLE, EntryState
from recovery.engine.reconcile import LEARNED_NOTHING, Observation, next_check
from recovery.engine.redact import redact_data
from recovery.engine.states import CallState
from recovery.engine.types import ClassifyContext
from recovery.jobs.queueing import enqueue, kick
from recovery.models import (
    Call,
    CompensationAttempt,
    CompensationEntry,
    CompensationReceipt,
    ReceiptSource,
    Task,
)
from recovery.providers.requests import TemplateError, send, tool_request
from recovery.providers.status import query_status
from recovery.registry import tool_policy
from recovery.services.compensation_plans import entry_plan
from recovery.services.errors import Refusal
from recovery.services.outcomes import RECONCILE_NOW, facts_of
from recovery.statemachine.transitions import TransitionConflict, transition_call, transition_entry

logger = logging.getLogger("recovery.compensations")

S, E = CallState, EntryState
# The call states a compensation may start from: the first entry of a committed effect, or a new entry after one
# that undid less than expected or nothing.
STARTABLE = frozenset({S.COMMITTED, S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED})
LEASE_S = 120  # a worker's hold on an entry while it sends or checks it
RETRY_S = 2  # a not-committed entry is sent again this long after (its own key: the provider deduplicates)
# The docs/design/classification.md table's call states, read for an entry.
_ENTRY_OF = {
    S.COMMITTED: E.COMMITTED,
    S.RETRYABLE: E.NOT_COMMITTED,
    S.UNKNOWN: E.UNKNOWN,
    S.ACCEPTED: E.UNKNOWN,
    S.FAILED_PERMANENT: E.FAILED,
    S.HUMAN_REVIEW: E.REVIEW,
}


def _job(name: str) -> Actor:
    return Actor.job(name)


# --- starting -------------------------------------------------------------------------------------------------


def compensation_start(
    call: Call, *, actor: Actor, requested_by=None, send: bool = True, executor: str = "console"
) -> CompensationEntry:
    """Make the next entry of `call` and move the call to COMPENSATING, in one transaction; a worker sends it.

    Refused (Refusal 409, nothing changed) unless the call is COMMITTED (the first entry) or
    PARTIAL_COMPENSATED / COMPENSATION_FAILED with every earlier entry final; two starts at once make one entry
    (the call's row is locked, and the partial unique index allows one open entry per call).
    """
    try:
        with transaction.atomic():
            call = Call.objects.select_for_update().select_related("tool__provider", "task", "step").get(pk=call.pk)
            number = _next_number(call)
            entry = _make_entry(call, number, actor=actor, requested_by=requested_by, executor=executor)
            why = "saga compensation started" if number == 1 else "approved new compensation"
            transition_call(call, S.COMPENSATING, actor=actor, reason=why, evidence={"compensation": entry.pk})
            if send:
                _enqueue_send(entry)
    except IntegrityError:
        raise Refusal(
            "compensation_in_progress", "another compensation of this call was just started", status=409
        ) from None
    entry.call = call
    return entry


def _next_number(call: Call) -> int:
    """The number of the call's next entry; Refusal 409 unless the call may start one now."""
    if call.state not in STARTABLE:
        raise Refusal(
            "not_compensable",
            f"a {call.state} call cannot start a compensation: only COMMITTED, PARTIAL_COMPENSATED or "
            "COMPENSATION_FAILED",
            status=409,
            detail={"call_state": call.state},
        )
    earlier = list(call.compensations.values_list("number", "state"))
    if any(state not in FINAL for _, state in earlier):
        raise Refusal("compensation_in_progress", "an earlier entry of this call is not final", status=409)
    if any(state == E.COMMITTED for _, state in earlier) and call.state != S.PARTIAL_COMPENSATED:
        raise Refusal("not_compensable", "an earlier entry already undid this effect", status=409)
    return len(earlier) + 1


def _make_entry(call: Call, number: int, *, actor: Actor, requested_by, executor: str) -> CompensationEntry:
    """Entry `number` of the locked `call`, as its plan says, with its audit event."""
    plan = entry_plan(call, number)
    entry = CompensationEntry.objects.create(
        call=call,
        number=number,
        tool=plan.tool,
        idempotency_key=plan.idempotency_key,
        arguments=plan.arguments,
        target=plan.target,
        target_version=call.version,
        expected_effect=plan.expected_effect,
        max_attempts=plan.max_attempts,
        requested_by=requested_by,
        executor=executor,
    )
    append_event(
        action=AuditAction.COMPENSATION_STARTED,
        actor=actor,
        task_id=call.task_id,
        call_id=call.pk,
        reason=f"compensation {number} of {call.tool.name}: {plan.expected_effect}",
        evidence={
            "compensation": entry.pk,
            "entry": number,
            "tool": plan.tool.name,
            "idempotency_key": plan.idempotency_key,
            "target_version": call.version,
        },
    )
    return entry


# The jobs, by name: recovery.jobs calls this module, so it cannot be imported here.
SEND_JOB = "recovery.jobs.tasks.send_compensation"


def _enqueue_send(entry: CompensationEntry) -> None:
    """Send the entry's next attempt once this transaction commits (one job per attempt number)."""
    enqueue(SEND_JOB, entry.pk, job_id=f"compensation-send-{entry.pk}-{entry.attempts_count + 1}")


# --- leases -----------------------------------------------------------------------------------------------------


def _claim(entry_id: int, *, worker: str, states, now: datetime, due: Q) -> bool:
    """Take the worker lease on an entry in `states` whose time has come (one worker at a time)."""
    free = Q(lease_until__isnull=True) | Q(lease_until__lte=now) | Q(lease_owner=worker)
    claimed = CompensationEntry.objects.filter(free, due, pk=entry_id, state__in=sorted(states)).update(
        lease_owner=worker, lease_until=now + timedelta(seconds=LEASE_S)
    )
    return claimed == 1


def _load(entry_id: int) -> CompensationEntry:
    return CompensationEntry.objects.select_related("tool__provider", "call__tool", "call__task").get(pk=entry_id)


# --- sending ----------------------------------------------------------------------------------------------------


def compensation_send(entry_id: int, *, worker: str, now: datetime | None = None) -> CompensationEntry | None:
    """Send a pending (or provably not committed) entry's request once, with its own key, and read the reply.
    None when another worker holds it or there is nothing to send."""
    now = now or timezone.now()
    due = Q(send_at__isnull=True) | Q(send_at__lte=now)
    if not _claim(entry_id, worker=worker, states=SENDABLE, now=now, due=due):
        return None
    entry = _load(entry_id)
    actor = _job("compensation")
    if not entry.has_attempts_left():
        with transaction.atomic():
            _move(entry, E.FAILED, actor=actor, reason=f"all {entry.max_attempts} attempts of the entry are used",
                  changes={"outcome": "retry_exhausted", "lease_owner": "", "lease_until": None})  # fmt: skip
        return entry
    try:
        request = tool_request(entry.tool, entry)
    except TemplateError as exc:
        with transaction.atomic():
            _move(entry, E.FAILED, actor=actor, reason=f"its request cannot be built: {exc}",
                  changes={"outcome": "request_template", "lease_owner": "", "lease_until": None})  # fmt: skip
        return entry
    number = entry.attempts_count + 1
    with transaction.atomic():
        transition_entry(
            entry,
            E.SENT,
            actor=actor,
            reason=f"attempt {number} sent with the entry's own key",
            evidence={"attempt": number, "idempotency_key": entry.idempotency_key},
            changes={"attempts_count": number, "send_at": None},
        )
        attempt = CompensationAttempt.objects.create(entry=entry, number=number, request=request.shown(), sent_at=now)
    wire = send(request)
    read_reply(entry, attempt, wire, actor=actor)
    return entry


def read_reply(entry: CompensationEntry, attempt: CompensationAttempt, wire: dict, *, actor: Actor) -> None:
    facts = facts_of(wire)
    policy = tool_policy(entry.tool)
    outcome = classify(
        facts,
        policy,
        ClassifyContext(
            call_id=entry.compensation_id,
            attempt_id=f"{entry.compensation_id}-{attempt.number}",
            idempotency_key=entry.idempotency_key,
            attempt_number=attempt.number,
            arguments=entry.arguments,
        ),
    )
    state = _ENTRY_OF.get(S(outcome.state), E.REVIEW)
    now = timezone.now()
    changes: dict[str, Any] = {"lease_owner": "", "lease_until": None}
    if outcome.provider_ref:
        changes["provider_ref"] = outcome.provider_ref[:255]
    if state == E.UNKNOWN:
        changes["next_check_at"] = now + timedelta(seconds=policy.reconcile.first_check_s)
    if state == E.NOT_COMMITTED:  # sent again by the periodic tick once this is due (a Retry-After is honoured)
        wait_s = max(RETRY_S, (facts.retry_after_ms or 0) / 1000)
        changes["send_at"] = now + timedelta(seconds=wait_s)
    if state in (E.FAILED, E.REVIEW):
        changes["outcome"] = outcome.error
    if state == E.COMMITTED:
        changes.update(_undone(entry, wire.get("result")))
    with transaction.atomic():
        error = wire.get("error") if isinstance(wire.get("error"), dict) else {}
        attempt.facts = redact_data({k: v for k, v in wire.items() if k != "error"} | {"error": error})
        attempt.http_status = wire.get("http_status")
        attempt.error_kind = (error.get("kind") or "")[:32]
        attempt.error_code = (outcome.error_code or error.get("code") or "")[:100]
        attempt.provider_ref = (outcome.provider_ref or "")[:255]
        attempt.row, attempt.label, attempt.state_after, attempt.finished_at = outcome.row, outcome.error, state, now
        attempt.save()
        _move(
            entry,
            state,
            actor=actor,
            reason=f"reply of attempt {attempt.number}: {outcome.error} (row {outcome.row})",
            evidence={"attempt": attempt.number, "row": outcome.row, "http_status": attempt.http_status},
            changes=changes,
        )


def _undone(entry: CompensationEntry, body: Any) -> dict[str, Any]:
    """What a committed undo's reply or status record says was undone: for an entry with an amount
    (`amount_cents`), the amount the provider reports (`undone_amount`), and whether that is the whole expected
    effect (`effects_observed` 1) or less (0: PARTIAL_COMPENSATED). Nothing when it does not say (one whole undo)."""
    expected = entry.arguments.get("amount_cents") if isinstance(entry.arguments, dict) else None
    got = body.get("amount_cents") if isinstance(body, dict) else None
    if not isinstance(expected, int) or not isinstance(got, int) or isinstance(got, bool) or got < 0:
        return {}
    return {"undone_amount": got, "effects_observed": 1 if got >= expected else 0}


# --- moving an entry, and the call with it ----------------------------------------------------------------------


def _move(entry: CompensationEntry, to: EntryState, *, actor: Actor, reason: str, evidence=None, changes=None) -> None:
    """transition_entry, then the call's end when the entry is final (in the caller's transaction)."""
    transition_entry(entry, to, actor=actor, reason=reason, evidence=evidence, changes=changes)
    if to in FINAL:
        _settle_call(entry, actor=actor)


def _settle_call(entry: CompensationEntry, *, actor: Actor) -> None:
    call = Call.objects.select_for_update().get(pk=entry.call_id)
    if call.state != S.COMPENSATING:
        return
    if entry.state == E.COMMITTED:
        partial = entry.effects_observed is not None and entry.effects_observed < entry.expected_effects
        to = S.PARTIAL_COMPENSATED if partial else S.COMPENSATED
        why = "compensation partly committed: " if partial else "compensation committed: "
    else:
        to, why = S.COMPENSATION_FAILED, "compensation failed, nothing undone: "
    if Task.objects.filter(pk=call.task_id, saga__in=("running", "stopped")).exists():
        enqueue("recovery.jobs.tasks.advance_saga", call.task_id, job_id=f"saga-{call.task_id}-after-{entry.pk}")
    transition_call(
        call,
        to,
        actor=actor,
        reason=why + entry.expected_effect,
        evidence={"compensation": entry.pk, "entry": entry.number, "outcome": entry.outcome},
    )


# --- reconciling an unknown entry -------------------------------------------------------------------------------


def compensation_check_soon(entry_id: int) -> bool:
    """A provider's callback about an entry's own request: an UNKNOWN entry's status check is due at once (the
    check records the receipt from the provider's records; the callback's word is not taken alone). Whether it was."""
    due = CompensationEntry.objects.filter(pk=entry_id, state=E.UNKNOWN).update(next_check_at=timezone.now())
    if due:
        kick("recovery.jobs.tasks.reconcile_now", RECONCILE_NOW)
    return bool(due)


def compensation_check(entry_id: int, *, worker: str, now: datetime | None = None, force: bool = False):
    """Ask the compensation tool's status query about an unknown entry, by its own key; record a receipt and move
    the entry as docs/reconciliation.md moves an unknown write. None when another worker holds it or it is not due."""
    now = now or timezone.now()
    due = Q() if force else Q(next_check_at__isnull=True) | Q(next_check_at__lte=now)
    if not _claim(entry_id, worker=worker, states={E.UNKNOWN}, now=now, due=due):
        return None
    entry = _load(entry_id)
    actor = _job("compensation-reconcile")
    policy = tool_policy(entry.tool).reconcile
    if not entry.tool.status_query:
        with transaction.atomic():
            _move(entry, E.REVIEW, actor=actor, reason="its tool has no status API: a person decides",
                  changes={"outcome": "no_status_api", "lease_owner": "", "lease_until": None})  # fmt: skip
        return None
    answer = query_status(entry.tool, entry)
    checks = entry.checks_made + 1
    with transaction.atomic():
        before = entry.state
        to = _apply_answer(entry, answer, checks=checks, policy=policy, now=now, actor=actor)
        receipt = CompensationReceipt.objects.create(
            entry=entry,
            source=ReceiptSource.POLL,
            observed=answer.observed,
            provider_status=answer.provider_status[:64],
            provider_ref=answer.provider_ref[:255],
            effects_observed=answer.effects,
            request=answer.request,
            response=answer.response,
            http_status=answer.http_status,
            state_before=before,
            state_after=entry.state,
            applied=to is not None,
            checked_at=now,
        )
        append_event(
            action=AuditAction.COMPENSATION_CHECKED,
            actor=actor,
            task_id=entry.call.task_id,
            call_id=entry.call_id,
            reason=f"status check {checks} of compensation {entry.number}: {answer.observed}",
            evidence={"compensation": entry.pk, "receipt": receipt.pk, "observed": answer.observed},
        )
    return receipt


def _apply_answer(entry, answer, *, checks: int, policy, now: datetime, actor: Actor) -> EntryState | None:
    """Write what the status answer says of the entry: its next check, or its move (returned; None: it stays)."""
    changes: dict[str, Any] = {"checks_made": checks, "last_receipt_at": now, "lease_owner": "", "lease_until": None}
    if answer.provider_ref:
        changes["provider_ref"] = answer.provider_ref[:255]
    if answer.provider_status:
        changes["provider_status"] = answer.provider_status[:64]
    to, why = _after_receipt(entry, answer.observed, checks=checks, policy=policy, now=now)
    if to is None:
        changes["next_check_at"] = next_check(policy, checks=checks, now=now, started_at=entry.created_at)
        CompensationEntry.objects.filter(pk=entry.pk).update(**changes)
        for name, value in changes.items():
            setattr(entry, name, value)
        return None
    if to == E.NOT_COMMITTED:
        changes["send_at"] = now  # the periodic tick sends it again with its own key
    if to in (E.REVIEW, E.FAILED):
        changes["outcome"] = why.split(":")[0]
    if to == E.COMMITTED:
        if answer.effects is not None:
            changes["effects_observed"] = min(answer.effects, entry.expected_effects)
        changes.update(_undone(entry, (answer.response or {}).get("body")))
    _move(entry, to, actor=actor, reason=f"receipt: {why}", changes=changes,
          evidence={"observed": answer.observed, "provider_status": answer.provider_status})  # fmt: skip
    return to


def _after_receipt(entry, observed: str, *, checks: int, policy, now: datetime) -> tuple[EntryState | None, str]:
    if observed == Observation.COMMITTED:
        return E.COMMITTED, "the provider has the undo"
    if observed == Observation.NOT_COMMITTED:
        if entry.has_attempts_left():
            return E.NOT_COMMITTED, "the provider never executed it: it is sent again with its own key"
        return E.FAILED, "retry_exhausted: the provider never executed it and no attempt is left"
    if observed in LEARNED_NOTHING or observed == Observation.PENDING:
        deadline = policy.deadline(entry.created_at)
        if policy.max_checks is not None and checks >= policy.max_checks:
            return E.REVIEW, f"poll_budget_exhausted: {checks} of {policy.max_checks} checks made"
        if deadline is not None and now >= deadline:
            return E.REVIEW, f"deadline_exceeded: the deadline {deadline.isoformat()} passed"
    return None, ""


# --- a person settles an entry in review ------------------------------------------------------------------------


def compensation_settle(call: Call, *, committed: bool, evidence: dict, reason: str, actor: Actor) -> CompensationEntry:
    """The call's entry in review, settled by an operator's evidence (an approved action, in the caller's
    transaction): an operator receipt, the entry committed or failed, and the call's end with it."""
    entry = (
        CompensationEntry.objects.select_for_update(of=("self",))
        .select_related("tool__provider", "call__task")
        .filter(call=call, state=E.REVIEW)
        .first()
    )
    if entry is None:
        raise Refusal("not_in_review", "the call has no compensation entry in review", status=409)
    to = E.COMMITTED if committed else E.FAILED
    now = timezone.now()
    receipt = CompensationReceipt.objects.create(
        entry=entry,
        source=ReceiptSource.OPERATOR,
        observed=Observation.COMMITTED if committed else Observation.NOT_COMMITTED,
        provider_status="operator",
        provider_ref=str(evidence.get("provider_ref", ""))[:255],
        response={"evidence": evidence, "reason": reason},
        state_before=entry.state,
        state_after=to,
        applied=True,
        evidence=evidence,
        checked_at=now,
    )
    changes: dict[str, Any] = {"last_receipt_at": now, "outcome": "" if committed else "operator_not_executed"}
    if committed and receipt.provider_ref and not entry.provider_ref:
        changes["provider_ref"] = receipt.provider_ref
    _move(entry, to, actor=actor, reason=reason, evidence={"receipt": receipt.pk}, changes=changes)
    return entry


# --- the schedule -----------------------------------------------------------------------------------------------

# A pending entry whose send job was lost (a worker died before taking it) is sent by the periodic tick after this.
LOST_SEND_S = 30


def compensations_due(*, now: datetime | None = None) -> tuple[list[int], list[int]]:
    """(entries to send, entries to check) now: not-committed entries whose retry is due and pending ones whose
    job was lost; unknown entries whose next check is due. Leases held by a live worker are skipped."""
    now = now or timezone.now()
    free = Q(lease_until__isnull=True) | Q(lease_until__lte=now)
    sends = CompensationEntry.objects.filter(free, executor="console").filter(
        Q(state=E.NOT_COMMITTED) & (Q(send_at__isnull=True) | Q(send_at__lte=now))
        | Q(state=E.PENDING, created_at__lte=now - timedelta(seconds=LOST_SEND_S))
    )
    checks = CompensationEntry.objects.filter(free, state=E.UNKNOWN, next_check_at__lte=now)
    return list(sends.values_list("pk", flat=True)[:500]), list(checks.values_list("pk", flat=True)[:500])


def compensations_sweep_sent(*, now: datetime | None = None) -> int:
    """Entries SENT whose worker's lease ended without a reply recorded (it died mid-send) → unknown: the undo may
    exist, so they are checked by their own key, never sent again blind; how many."""
    now = now or timezone.now()
    swept = 0
    stale = CompensationEntry.objects.filter(state=E.SENT, lease_until__lt=now).values_list("pk", flat=True)
    for entry_id in list(stale[:500]):
        entry = _load(entry_id)
        try:
            with transaction.atomic():
                transition_entry(
                    entry,
                    E.UNKNOWN,
                    actor=_job("compensation-sweep"),
                    reason="no reply was recorded before the sending worker's lease ended: the undo may exist",
                    changes={"next_check_at": now, "lease_owner": "", "lease_until": None},
                )
            swept += 1
        except TransitionConflict:
            continue
    return swept


def compensations_run_due(*, worker: str, now: datetime | None = None) -> int:
    """Periodic: sweep entries whose sender died, send and check what is due, here (the tick's own worker); how
    many entries were acted on."""
    acted = compensations_sweep_sent(now=now)
    sends, checks = compensations_due(now=now)
    for entry_id in sends:
        try:
            acted += compensation_send(entry_id, worker=worker) is not None
        except TransitionConflict:
            continue
    for entry_id in checks:
        try:
            acted += compensation_check(entry_id, worker=worker) is not None
        except TransitionConflict:
            continue
    return acted

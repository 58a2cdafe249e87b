"""Admission (docs/design/gate.md, docs/design/state-machine.md "Admission, outcome and single shot"): may this attempt
of a call be sent? The gate's answer, stored whether allowed or denied; with an outcome in the request, a single shot
(admission and outcome in one transaction; one the gate would have denied is kept, flagged and, a write, sent to a
person); and the one same-key replay reconciliation may make (docs/replay.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event, appends_at_commit
from recovery.engine.canonical import canonical_digest
from recovery.engine.fingerprint import fingerprint
from recovery.engine.gate import admit
from recovery.engine.states import UNSETTLED, CallState, is_allowed
from recovery.engine.types import APPROVAL_GRANTED, REPLAY_RECONCILE, Candidate, Facts, FieldError
from recovery.engine.types import GateDecision as Gate
from recovery.models import ActionRequest, Attempt, Call, GateDecision, Tool
from recovery.providers.requests import wire_of
from recovery.registry import tool_policy
from recovery.selectors.context import AdmissionRead, approval_for, gate_context
from recovery.services.answers import checks_json, gate_json, outcome_json
from recovery.services.breakers import breaker_release_probe, breaker_reserve_probe
from recovery.services.earlier_verdicts import earlier_verdicts
from recovery.services.errors import Refusal
from recovery.services.outcomes import (
    Judgement,
    Sent,
    facts_json,
    judge,
    set_facts,
    settle,
    store_decision,
    store_facts,
)
from recovery.services.report_terms import report_terms
from recovery.statemachine.hot_path import Counters, count_on_task, insert, insert_together, pipelined
from recovery.statemachine.transitions import TransitionConflict, transition_call

S = CallState


@dataclass(frozen=True, kw_only=True)
class AttemptRequest:
    """What a runtime asks to send: the attempt's id, an alternate tool or repaired arguments (None: the call's
    own), the credential version, the evidence it claims, and for a single shot the outcome it already has."""

    attempt_id: str
    tool: str | None = None
    arguments: dict | None = None
    credential_version: int | None = None
    evidence: tuple[str, ...] = ()
    outcome: Facts | None = None
    # False for an after-the-fact report that did not carry the arguments (an OpenTelemetry span without them,
    # recovery.services.observed): admission cannot check what it was not told, so preflight skips the schema.
    arguments_known: bool = True

    def as_json(self) -> dict[str, Any]:
        """The request as hashed: a repeated request is recognised by it."""
        wire = {
            "attempt_id": self.attempt_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "credential_version": self.credential_version,
            "evidence": list(self.evidence),
        }
        if self.outcome is not None:
            wire["outcome"] = facts_json(self.outcome)
        if not self.arguments_known:
            wire["arguments_known"] = False
        return wire


@dataclass
class Admission:
    status: int  # 201 admitted, 200 replayed answer, 409 denied
    response: dict
    attempt: Attempt | None = None  # the attempt admitted without an outcome (201), as its transaction wrote it


@dataclass(frozen=True, kw_only=True)
class _Admitting:
    """One admission under way: what each of its steps reads."""

    call: Call
    candidate: Candidate
    tool: Tool  # the tool the attempt will call (the call's own, or the alternate it names)
    gate: Gate
    actor: Actor
    now: datetime
    digest: str  # of the request, for a repeat to be recognised
    probe: bool  # admitted as the half-open breaker's probe (reserved)
    number: int  # the attempt's number within the call (the call's attempts so far, plus one)


def gate_ask(*, call: Call, request: AttemptRequest, actor: Actor, read: AdmissionRead | None = None) -> dict:
    """POST .../gate: would this candidate be admitted? Stored, never acted on. `read`: as for attempt_admit."""
    candidate, tool = _candidate(call, request)
    gate = _evaluate(call, candidate, tool, timezone.now(), read=read)
    row = insert(_gate_row(call, candidate, gate, actor=actor, dry_run=True))
    return gate_json(gate, row)


def attempt_admit(
    *, call: Call, request: AttemptRequest, actor: Actor, read: AdmissionRead | None = None, fresh: bool = False
) -> Admission:
    """POST .../attempts: admission, or a single shot when the request carries an outcome
    (docs/design/state-machine.md). `read`: what the call's admission read brought along with it
    (hot_path.call_for_attempt, for this attempt id); None: admission reads it. `fresh`: the call was inserted by the
    caller's transaction, still open, so no other transaction can see it, let alone race this admission: no
    savepoint (two statements) to come back to, and any error ends that transaction."""
    digest = canonical_digest(request.as_json())
    stored = _stored_attempt(call, request.attempt_id, read=read)
    if stored is not None:
        return _replay(stored, digest)
    now = timezone.now()
    candidate, tool = _candidate(call, request)
    known = request.arguments_known
    gate = _evaluate(call, candidate, tool, now, arguments_known=known, read=read)
    probe = gate.uses_probe
    if probe and not breaker_reserve_probe(tool, now=now):
        # Another admission reserved the half-open probe between our gate and our reservation: the gate answers
        # again, without a probe — a degrade denial with the fallback (or an admission, if that probe closed it).
        gate = _evaluate(call, candidate, tool, now, probe_taken=True, arguments_known=known, read=read)
        probe = False
    admitting = _Admitting(
        call=call,
        candidate=candidate,
        tool=tool,
        gate=gate,
        actor=actor,
        now=now,
        digest=digest,
        probe=probe,
        number=call.attempts_count + 1,
    )
    facts = request.outcome
    if not gate.allowed:
        if facts is None:
            row = insert(_gate_row(call, candidate, gate, actor=actor))
            return Admission(
                409, {"admitted": False, "call_id": call.pk, "call_state": call.state, "gate": gate_json(gate, row)}
            )
        return _bypassed_single_shot(admitting, facts)
    # An outcome is judged before our transaction: the breaker's short transaction never runs inside ours, so bucket
    # rows are never locked after an audit head (one lock order, no deadlock).
    judgement = _judge(admitting, facts, probe=probe) if facts is not None else None
    try:
        # The audit events are appended last: the global audit head is locked for the appends and the commit only.
        with transaction.atomic(savepoint=not fresh), appends_at_commit():
            attempt = _admission(admitting, read) if judgement is None else None
            response = attempt.response if attempt is not None else _single_shot(admitting, facts, judgement)
    except (TransitionConflict, IntegrityError):
        if fresh:  # no race is possible on a call no one else sees: a real fault, and the transaction is done
            raise
        if probe and judgement is None:
            breaker_release_probe(tool, now=now)  # never sent: a lost race must not use up the half-open probe
        raced = _stored_attempt(call, request.attempt_id)
        if raced is not None:
            return _replay(raced, digest)
        raise Refusal("conflict", "another attempt of this call was admitted at the same moment", status=409) from None
    return Admission(201, response, attempt)


def _candidate(call: Call, request: AttemptRequest) -> tuple[Candidate, Tool]:
    tool_name = request.tool or call.tool.name
    tool = (
        call.tool
        if tool_name == call.tool.name
        else Tool.objects.select_related("provider").filter(name=tool_name).first()
    )
    if tool is None:
        raise Refusal(
            "unknown_tool",
            f"no tool named {tool_name!r}",
            status=422,
            field_errors=[
                FieldError(
                    field="tool",
                    expected="a registered tool",
                    received=tool_name,
                    suggestion="Use the call's tool or one of its accepted alternates.",
                )
            ],
        )
    candidate = Candidate(
        attempt_id=request.attempt_id,
        tool=tool.name,
        arguments=call.arguments if request.arguments is None else request.arguments,
        credential_version=request.credential_version,
        evidence=tuple(request.evidence),
    )
    return candidate, tool


def _evaluate(
    call: Call,
    candidate: Candidate,
    tool: Tool,
    now: datetime,
    *,
    probe_taken: bool = False,
    arguments_known=True,
    read: AdmissionRead | None = None,
) -> Gate:
    """The gate's answer. `probe_taken`: this admission lost the half-open probe to another one after the gate had
    offered it, so the gate is asked again knowing that no probe is left. `arguments_known` False: no schema to
    check them against (AttemptRequest.arguments_known). `read`: as for attempt_admit."""
    policy = tool_policy(call.tool)
    candidate_policy = tool_policy(tool) if tool.pk != call.tool_id else None
    if not arguments_known:
        policy = replace(policy, args_schema={})
        candidate_policy = replace(candidate_policy, args_schema={}) if candidate_policy else None
    context, view = gate_context(
        call,
        tool=policy,
        candidate_tool=candidate_policy,
        executing_tool=tool,
        task=call.task,
        now=now,
        approval=_approval_available(call, candidate),
        read=read,
    )
    if probe_taken:
        context = replace(context, breaker=replace(context.breaker, probe_available=False))
    return admit(view, candidate, context)


# States whose admission the gate grants only on an approval; elsewhere it matters only when the candidate claims one.
_APPROVAL_STATES = frozenset({S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW})


def _approval_available(call: Call, candidate: Candidate) -> bool:
    """Whether an approved action request allows this call one admission now (docs/design/gate.md `approval_granted`).

    Asked (one query) only where an approval can change the answer, so the first attempts of ordinary calls — the
    ingest hot path — read nothing more.
    """
    if call.state not in _APPROVAL_STATES and APPROVAL_GRANTED not in candidate.evidence:
        return False
    return bool(approval_for(call, attempt_id=candidate.attempt_id))


def _use_approval(call: Call, attempt: Attempt, now: datetime) -> None:
    """Mark the approval this admission used, in the admission's transaction: exactly one admission per approval.

    A conditional UPDATE on "not used yet": of two admissions racing for one approval, the second finds it used
    (PostgreSQL re-checks the condition after the first commits) and raises TransitionConflict, which rolls its
    admission back.
    """
    ids = approval_for(call, attempt_id=attempt.attempt_id)
    used = ids and ActionRequest.objects.filter(pk=ids[0], approval_used_at__isnull=True).update(
        approval_used_at=now, attempt=attempt, updated_at=now
    )
    if not used:
        raise TransitionConflict(f"call {call.pk}: the approval this admission relied on was used by another one")


def _gate_row(
    call: Call,
    candidate: Candidate,
    gate: Gate,
    *,
    actor: Actor,
    dry_run: bool = False,
    attempt: Attempt | None = None,
) -> GateDecision:
    return GateDecision(
        call=call,
        attempt=attempt,
        candidate_attempt_id=candidate.attempt_id,
        candidate={
            "tool": candidate.tool,
            "fingerprint": fingerprint(candidate.tool, candidate.arguments),
            "credential_version": candidate.credential_version,
            "evidence": list(candidate.evidence),
        },
        dry_run=dry_run,
        allowed=gate.allowed,
        reason=gate.reason,
        evidence_used=gate.evidence_used,
        checks=checks_json(gate.checks),
        required_next=asdict(gate.required_next) if gate.required_next else {},
        actor_token_id=actor.token_id,
        actor_user_id=actor.user_id,
    )


def _stored_attempt(call: Call, attempt_id: str, *, read: AdmissionRead | None = None) -> Attempt | None:
    """The attempt this call already has under `attempt_id` (unique per call), asked on every admission. With the
    call's admission read, which says whether there is one, the row is read only when there is; without (None: after
    losing a race to a concurrent request, too), the database is asked now."""
    if read is None:
        return Attempt.objects.filter(call=call, attempt_id=attempt_id).first()
    return Attempt.objects.filter(pk=read.stored_attempt_pk).first() if read.stored_attempt_pk else None


def _replay(stored: Attempt, digest: str) -> Admission:
    if stored.request_hash != digest:
        raise Refusal(
            "attempt_id_reused",
            "this attempt_id was already used with a different body",
            status=422,
            field_errors=[
                FieldError(
                    field="attempt_id",
                    expected="a new attempt id for a new attempt",
                    received=stored.attempt_id,
                    suggestion="Use a fresh attempt_id.",
                )
            ],
        )
    if stored.response is None:
        raise Refusal("in_flight", "a request with this attempt_id is still being processed", status=409)
    return Admission(200, stored.response)


def _new_attempt(admitting: _Admitting, **fields: Any) -> Attempt:
    candidate, tool = admitting.candidate, admitting.tool
    return Attempt(
        call=admitting.call,
        attempt_id=candidate.attempt_id,
        number=admitting.number,
        tool=tool,
        arguments=candidate.arguments,
        fingerprint=fingerprint(tool.name, candidate.arguments),
        credential_version=candidate.credential_version,
        evidence=list(candidate.evidence),
        request_hash=admitting.digest,
        **fields,
    )


def _record_attempt(admitting: _Admitting, **fields: Any) -> Attempt:
    """The attempt row, its stored gate answer and the task's round, in the caller's transaction."""
    attempt = insert(_new_attempt(admitting, **fields))
    attempt.gate_row = insert(
        _gate_row(admitting.call, admitting.candidate, admitting.gate, actor=admitting.actor, attempt=attempt)
    )
    _count_round(admitting.call, attempt.number)
    return attempt


def _count_round(call: Call, number: int, *, tokens: int = 0, read_back: bool = True) -> Counters | None:
    """Count one admitted attempt on the task (a round; a write's retry after its first attempt)."""
    retry = 1 if call.side_effect == "write" and number > 1 else 0
    return count_on_task(call.task_id, rounds=1, write_retries=retry, tokens=tokens, read_back=read_back)


def _sent(admitting: _Admitting) -> None:
    """READY/RETRYABLE (or an approved replay's state) -> SENT for the attempt being admitted."""
    gate, number = admitting.gate, admitting.number
    transition_call(
        admitting.call,
        S.SENT,
        actor=admitting.actor,
        reason=f"attempt {number} admitted ({gate.evidence_used or gate.reason})",
        evidence={"attempt_id": admitting.candidate.attempt_id, "gate": gate.reason, "evidence": gate.evidence_used},
        changes={"attempts_count": number, "sent_at": admitting.now},
    )


def _admission(admitting: _Admitting, read: AdmissionRead | None) -> Attempt:
    """An admission without an outcome: the attempt (its stored answer in `response`), its gate answer, the approval
    it used, the call SENT."""
    call = admitting.call
    # Read before this admission is recorded (or by the read that came before it): it bounds the next one's.
    earlier = earlier_verdicts(call.task_id, read.reported if read is not None else None)
    if read is not None and read.reserved_ids is not None and admitting.gate.evidence_used != APPROVAL_GRANTED:
        return _first_admission(admitting, earlier, read.reserved_ids)
    attempt = _record_attempt(admitting, admitted_at=admitting.now, breaker_probe=admitting.probe)
    if admitting.gate.evidence_used == APPROVAL_GRANTED:
        _use_approval(call, attempt, admitting.now)
    _sent(admitting)
    attempt.response = _admitted_json(admitting, attempt, attempt.gate_row, earlier)
    attempt.save(update_fields=["response"])
    return attempt


def _first_admission(admitting: _Admitting, earlier: list[dict], reserved_ids: tuple[int, int]) -> Attempt:
    """_admission for a call registered in this transaction, the keys of its attempt and gate rows reserved by its
    read: the attempt goes in with its stored answer (the call SENT, as the move below leaves it) and the gate row
    with it, in one statement (hot_path.insert_together) instead of three. Those rows, the task's round and the
    call's move leave together (hot_path.pipelined): their answers in one round trip instead of three, the move's
    read at the block's end, which says whether it held (if not, the conflict undoes the whole registration's
    transaction)."""
    attempt = _new_attempt(admitting, admitted_at=admitting.now, breaker_probe=admitting.probe)
    attempt.pk = reserved_ids[0]
    row = _gate_row(admitting.call, admitting.candidate, admitting.gate, actor=admitting.actor, attempt=attempt)
    row.pk = reserved_ids[1]
    attempt.response = _admitted_json(admitting, attempt, row, earlier, call_state=S.SENT)  # the move it answers
    with pipelined():
        insert_together(attempt, row)
        _count_round(admitting.call, admitting.number, read_back=False)
        _sent(admitting)
    return attempt


def _admitted_json(
    admitting: _Admitting, attempt: Attempt, gate_row: GateDecision, earlier: list[dict], call_state: str = ""
) -> dict:
    return {
        "admitted": True,
        "call_id": admitting.call.pk,
        "attempt_id": attempt.attempt_id,
        "attempt_number": attempt.number,
        "call_state": call_state or admitting.call.state,
        "gate": gate_json(admitting.gate, gate_row),
        "wire": wire_of(admitting.tool),
        "report": report_terms(admitting.tool, probe=admitting.probe),
        "earlier": earlier,
    }


def _judge(admitting: _Admitting, facts: Facts, *, probe: bool) -> Judgement:
    candidate = admitting.candidate
    sent = Sent(
        tool=admitting.tool,
        arguments=candidate.arguments,
        attempt_id=candidate.attempt_id,
        number=admitting.number,
        probe=probe,
    )
    return judge(admitting.call, facts, sent, now=admitting.now)


def _single_shot(admitting: _Admitting, facts: Facts, judgement: Judgement) -> dict:
    """Admission and outcome in one transaction (docs/design/state-machine.md), in the fewest statements: the task's
    counters are moved once, the call moved twice, and the attempt inserted last, whole — facts, answer and all — unless
    the answer needs the id of a row that needs the attempt's (a decision card), which then costs one UPDATE more."""
    call, gate, actor, now = admitting.call, admitting.gate, admitting.actor, admitting.now
    outcome, breaker = judgement.outcome, judgement.breaker
    counters = _count_round(call, admitting.number, tokens=facts.tokens_used or 0)
    _sent(admitting)
    attempt = _new_attempt(admitting, admitted_at=now, breaker_probe=admitting.probe)
    set_facts(attempt, facts, outcome, call=call, now=now)
    decision = settle(call, attempt, facts, judgement, counters, actor=actor, now=now, single_shot=True)
    attempt.outcome_request_hash = canonical_digest(facts_json(facts))
    approved = gate.evidence_used == APPROVAL_GRANTED
    if decision is None and not approved:
        answer = outcome_json(call, attempt, outcome, decision=None, card_id=None, breaker=breaker.state)
        attempt.response = attempt.outcome_response = answer
        insert(attempt)
        insert(_gate_row(call, admitting.candidate, gate, actor=actor, attempt=attempt))
        return attempt.response
    insert(attempt)
    insert(_gate_row(call, admitting.candidate, gate, actor=actor, attempt=attempt))
    if approved:
        _use_approval(call, attempt, now)
    card = store_decision(call, attempt, decision) if decision else None
    answer = outcome_json(
        call, attempt, outcome, decision=decision, card_id=card.pk if card else None, breaker=breaker.state
    )
    attempt.response = attempt.outcome_response = answer
    attempt.save(update_fields=["response", "outcome_request_hash", "outcome_response"])
    return attempt.response


def _bypassed_single_shot(admitting: _Admitting, facts: Facts) -> Admission:
    """A single shot the gate would have denied: keep the facts, flag the attempt, send a write to a person.

    It did reach the provider, so its outcome counts on the tool's breaker like any other.
    """
    call, gate, actor, now = admitting.call, admitting.gate, admitting.actor, admitting.now
    number = admitting.number
    judgement = _judge(admitting, facts, probe=False)
    outcome = judgement.outcome
    with transaction.atomic(), appends_at_commit():  # the audit heads locked for the appends and the commit only
        attempt = _record_attempt(admitting, policy_bypassed=True)
        store_facts(attempt, facts, outcome, call=call, now=now)
        Call.objects.filter(pk=call.pk).update(attempts_count=number)
        call.attempts_count = number
        reason = f"policy-bypassing single shot ({gate.reason}): {outcome.error}"
        evidence = {
            "attempt_id": attempt.attempt_id,
            "gate": gate.reason,
            "row": outcome.row,
            "class": outcome.failure.failure_class if outcome.failure else "",
        }
        if call.side_effect == "write":
            if call.state != S.HUMAN_REVIEW:
                transition_call(
                    call,
                    S.HUMAN_REVIEW,
                    actor=actor,
                    reason=reason,
                    evidence=evidence,
                    changes={"outcome": "human_review_required"},
                )
        elif call.state not in (S.COMMITTED, S.FAILED_PERMANENT):
            if call.state != S.SENT and is_allowed(call.state, S.SENT):
                transition_call(call, S.SENT, actor=actor, reason=reason, evidence=evidence)
            if call.state == S.SENT and is_allowed(S.SENT, outcome.state):
                transition_call(call, outcome.state, actor=actor, reason=reason, evidence=evidence)
        response = outcome_json(call, attempt, outcome, decision=None, card_id=None, breaker=judgement.breaker.state)
        response["gate"] = gate_json(gate, None)
        attempt.response = response
        attempt.outcome_request_hash = canonical_digest(facts_json(facts))
        attempt.outcome_response = response
        attempt.save(update_fields=["response", "outcome_request_hash", "outcome_response"])
    return Admission(201, response)


# --- replay reconciliation (docs/replay.md) ---------------------------------------------------------------------------

REPLAY_ATTEMPT_ID = "reconcile-replay"  # the one replay reconciliation makes of a call: unique per call


def replay_admit(*, call: Call, actor: Actor, now: datetime) -> tuple[Gate, Attempt | None]:
    """Admission of the one same-key replay reconciliation may make of an unsettled call whose status query cannot
    answer: the real gate on `replay_reconcile` (the retry path must be safe, the key young enough, budgets and the
    tool's breaker must admit it), then — in one transaction — the durable mark (a conditional UPDATE: set once,
    never cleared, so a second worker or a retried job finds it and sends nothing), the attempt and its stored
    gate answer, and the task's round. The gate's answer, and the attempt when one was admitted."""
    candidate = Candidate(
        attempt_id=REPLAY_ATTEMPT_ID, tool=call.tool.name, arguments=call.arguments, evidence=(REPLAY_RECONCILE,)
    )
    policy = tool_policy(call.tool)
    context, view = gate_context(
        call, tool=policy, candidate_tool=None, executing_tool=call.tool, task=call.task, now=now, approval=False
    )
    gate = admit(view, candidate, replace(context, status_unavailable=True))
    if not gate.allowed:
        told = GateDecision.objects.filter(
            call=call, candidate_attempt_id=REPLAY_ATTEMPT_ID, allowed=False, reason=gate.reason
        ).exists()
        if not told:  # once per reason: the checks that follow would only repeat it
            insert(_gate_row(call, candidate, gate, actor=actor))
        return gate, None
    probe = gate.uses_probe
    if probe and not breaker_reserve_probe(call.tool, now=now):
        return gate, None  # another admission took the half-open probe: the next check asks again
    admitting = _Admitting(
        call=call,
        candidate=candidate,
        tool=call.tool,
        gate=gate,
        actor=actor,
        now=now,
        digest=canonical_digest({"attempt_id": REPLAY_ATTEMPT_ID, "evidence": [REPLAY_RECONCILE]}),
        probe=probe,
        number=call.attempts_count + 1,
    )
    try:
        with transaction.atomic(), appends_at_commit():
            marked = Call.objects.filter(
                pk=call.pk, version=call.version, state__in=sorted(UNSETTLED), replay_reconciled_at__isnull=True
            ).update(replay_reconciled_at=now, attempts_count=admitting.number)
            if not marked:
                raise TransitionConflict(f"call {call.pk}: replayed by reconciliation already, or it moved")
            attempt = _record_attempt(admitting, admitted_at=now, breaker_probe=probe)
            append_event(
                action=AuditAction.CALL_REPLAYED,
                actor=actor,
                task_id=call.task_id,
                call_id=call.pk,
                from_state=call.state,
                to_state=call.state,
                reason=f"replay reconciliation: attempt {attempt.number}, one same-key replay of "
                f"{call.idempotency_key} (the status query cannot answer)",
                evidence={"attempt_id": attempt.attempt_id, "gate": gate.reason, "evidence": REPLAY_RECONCILE},
            )
    except (TransitionConflict, IntegrityError):
        if probe:
            breaker_release_probe(call.tool, now=now)
        return gate, None
    call.attempts_count, call.replay_reconciled_at = admitting.number, now
    return gate, attempt

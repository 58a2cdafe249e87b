"""Calls and attempts from agent runtimes (SPEC §5, §8.1, §9): add a call, admit an attempt, report its outcome.

Every answer is computed by the engine from stored facts; every state change goes through transition_call; every
admission answer is stored as a GateDecision. Errors are values (ServiceError with a code, an HTTP status, field
errors); a rejected request writes nothing.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from recovery.audit import Actor, append_event, appends_at_commit
from recovery.engine import breaker as breaker_rules
from recovery.engine.canonical import canonical_json
from recovery.engine.classify import classify, preflight_failure
from recovery.engine.decide import decide
from recovery.engine.fingerprint import fingerprint
from recovery.engine.gate import admit, duplicate_intent
from recovery.engine.redact import redact, redact_data
from recovery.engine.types import (
    APPROVAL_GRANTED,
    Candidate,
    ClassifyContext,
    Decision,
    ErrorFacts,
    Facts,
    FieldError,
    Outcome,
)
from recovery.engine.validation import validate_args
from recovery.hot_path import Counters, count_on_task, insert
from recovery.models import (
    ActionRequest,
    Attempt,
    Call,
    Diagnostic,
    GateDecision,
    Receipt,
    Step,
    Task,
    TaskStatus,
    Tool,
)
from recovery.models import Decision as DecisionRow
from recovery.registry import tool_policy
from recovery.services.breakers import (
    breaker_record,
    breaker_release_probe,
    breaker_reserve_probe,
)
from recovery.services.context import approval_for, call_view, gate_context, task_view_for_decision
from recovery.states import CallState, is_allowed
from recovery.transitions import TransitionConflict, transition_call

S = CallState


class ServiceError(Exception):
    """A refusal with an HTTP status, a machine code, a message and optional field errors or details."""

    def __init__(self, status: int, code: str, message: str, *, field_errors=(), detail: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.field_errors = tuple(field_errors)
        self.detail = detail or {}


def field_errors_json(errors) -> list[dict]:
    return [asdict(e) if isinstance(e, FieldError) else dict(e) for e in errors]


def body_hash(body: Any) -> str:
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def allowed_tools(tenant) -> list[Tool]:
    tools = Tool.objects.order_by("name") if tenant.all_tools else tenant.tools.order_by("name")
    return list(tools.select_related("provider"))


# --- calls ---------------------------------------------------------------------------------------------------------


@dataclass
class CallAdded:
    call: Call
    created: bool
    preflight: tuple[FieldError, ...]
    blocked_by: list[int] = field(default_factory=list)


def blocked_by(call: Call) -> list[int]:
    """Calls of the step's dependencies that are not COMMITTED: admission refuses this call until they are."""
    deps = call.step.depends_on.all()
    return sorted(Call.objects.filter(step__in=deps).exclude(state=S.COMMITTED).values_list("pk", flat=True)) + sorted(
        # a dependency step with no call yet blocks too (reported by step index, negative to tell them apart)
        -s.index
        for s in deps.exclude(calls__isnull=False)
    )


def call_add(
    *,
    task: Task,
    step_index: int,
    depends_on: list[int],
    tool_name: str,
    arguments: dict,
    idempotency_key: str,
    actor: Actor,
) -> CallAdded:
    tenant = task.tenant
    tools = {t.name: t for t in allowed_tools(tenant)}
    tool = tools.get(tool_name)
    if tool is None:
        raise ServiceError(
            422,
            "capability_missing",
            f"{tool_name!r} is not a capability of this tenant: replan with one of the listed tools.",
            field_errors=[
                FieldError(
                    field="tool",
                    expected="an authorized tool",
                    received=tool_name,
                    suggestion="Choose one of the tenant's capabilities.",
                )
            ],
            detail={"capabilities": sorted(tools)},
        )
    if task.status != TaskStatus.OPEN:
        raise ServiceError(409, "task_closed", f"the task is {task.status}: no new calls")
    bad_deps = [d for d in depends_on if d >= step_index]
    if bad_deps:
        raise ServiceError(
            422,
            "invalid_dependency",
            "a step may depend only on earlier steps",
            field_errors=[
                FieldError(
                    field="depends_on",
                    expected=f"step indexes below {step_index}",
                    received=bad_deps,
                    suggestion="Order the steps so dependencies come first.",
                )
            ],
        )
    policy = tool_policy(tool)
    print_ = fingerprint(tool.name, arguments)
    existing = Call.objects.filter(tenant=tenant, tool=tool, idempotency_key=idempotency_key).first()
    if existing is not None:
        return _same_key(existing, task, print_)
    if policy.is_write:
        others = Call.objects.filter(task=task, fingerprint=print_).values_list("pk", "fingerprint", "state")
        duplicate = duplicate_intent(
            side_effect=policy.side_effect, fingerprint=print_, existing=[(str(pk), fp, st) for pk, fp, st in others]
        )
        if duplicate:
            raise ServiceError(
                409,
                "duplicate_intent",
                f"call {duplicate} already carries this write intent: a new idempotency key must not launder a "
                "replay. Retry that call under its own key.",
                detail={"existing_call": int(duplicate)},
            )
    preflight = validate_args(policy.args_schema, arguments)
    max_attempts = policy.budgets.max_attempts
    task_max = (task.budget or {}).get("max_attempts")
    if task_max is not None:
        max_attempts = min(max_attempts, task_max) if max_attempts is not None else task_max
    try:
        with transaction.atomic():
            step, _ = Step.objects.get_or_create(task=task, index=step_index)
            if depends_on:
                deps = []
                for index in depends_on:
                    dep, _ = Step.objects.get_or_create(task=task, index=index)
                    deps.append(dep)
                step.depends_on.add(*deps)
            call = Call.objects.create(
                tenant=tenant,
                task=task,
                step=step,
                tool=tool,
                idempotency_key=idempotency_key,
                arguments=arguments,
                fingerprint=print_,
                side_effect=tool.side_effect,
                risk=tool.risk,
                max_attempts=max_attempts or 1_000_000,
                outcome_timeout_s=tool.outcome_timeout_s,
            )
            append_event(
                action="call.added",
                actor=actor,
                task_id=task.pk,
                call_id=call.pk,
                to_state=call.state,
                reason=f"{tool.name} step {step_index}",
                evidence={
                    "idempotency_key": idempotency_key,
                    "fingerprint": print_,
                    "preflight_errors": len(preflight),
                },
            )
    except IntegrityError:
        # A concurrent add of the same key won: answer as for a repeated request.
        existing = Call.objects.filter(tenant=tenant, tool=tool, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return _same_key(existing, task, print_)
    return CallAdded(call=call, created=True, preflight=preflight, blocked_by=blocked_by(call))


def preflight_answer(call: Call, preflight: tuple[FieldError, ...]) -> tuple[dict | None, dict | None]:
    """The add-call answer's `failure` and `required_next` (both None when the arguments passed): the failure an
    attempt would have carried, so a runtime reads one shape whether the arguments failed early or late."""
    if not preflight:
        return None, None
    failure = preflight_failure(tool_policy(call.tool), call_id=str(call.pk), field_errors=preflight)
    public = _public_failure(asdict(failure) | {"side_effect": "not_sent"})
    errors = [{"field": e.field, "expected": e.expected, "suggestion": e.suggestion} for e in preflight]
    return public, {"action": "repair_args", "after_ms": 0, "detail": {"field_errors": errors}}


def _same_key(existing: Call, task: Task, print_: str) -> CallAdded:
    if existing.fingerprint != print_ or existing.task_id != task.pk:
        raise ServiceError(
            422,
            "idempotency_conflict",
            "this idempotency key was already used with other arguments (or by another task): use a new key for a "
            "new intent, or the same arguments for this one",
            field_errors=[
                FieldError(
                    field="idempotency_key",
                    expected="a key not used for another intent",
                    received=existing.idempotency_key,
                    suggestion="Generate a new key.",
                )
            ],
            detail={"existing_call": existing.pk},
        )
    policy = tool_policy(existing.tool)
    preflight = validate_args(policy.args_schema, existing.arguments)
    return CallAdded(call=existing, created=False, preflight=preflight, blocked_by=blocked_by(existing))


def call_abandon(*, call: Call, actor: Actor, reason: str) -> Call:
    if call.state == S.FAILED_PERMANENT and call.outcome == "abandoned":
        return call  # a repeated abandon (a reply lost on the way back): the call as it stands
    if call.state not in (S.READY, S.RETRYABLE, S.NOT_COMMITTED):
        raise ServiceError(
            409, "not_abandonable", f"a {call.state} call cannot be abandoned: only READY, RETRYABLE or NOT_COMMITTED"
        )
    try:
        return transition_call(
            call,
            S.FAILED_PERMANENT,
            actor=actor,
            reason=reason.strip() or "abandoned",
            changes={"outcome": "abandoned"},
        )
    except TransitionConflict as exc:
        raise ServiceError(409, "conflict", str(exc)) from None


# --- attempts ------------------------------------------------------------------------------------------------------


@dataclass
class Admission:
    status: int  # 201 admitted, 200 replayed answer, 409 denied
    response: dict


def _checks_json(checks) -> list[dict]:
    # What asdict() gives for these flat records, without its recursive deep copy: every admission stores and
    # answers seven of them.
    return [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in checks]


def _gate_json(gate, row: GateDecision | None) -> dict:
    required = gate.required_next
    return {
        "id": row.pk if row else None,
        "allowed": gate.allowed,
        "reason": gate.reason,
        "evidence_used": gate.evidence_used,
        "checks": _checks_json(gate.checks),
        "required_next": asdict(required) if required else None,
        "public_message": gate.public_message,
        "field_errors": field_errors_json(gate.field_errors),
    }


def _candidate(call: Call, body: dict) -> tuple[Candidate, Tool]:
    tool_name = body.get("tool") or call.tool.name
    tool = (
        call.tool
        if tool_name == call.tool.name
        else Tool.objects.select_related("provider").filter(name=tool_name).first()
    )
    if tool is None:
        raise ServiceError(
            422,
            "unknown_tool",
            f"no tool named {tool_name!r}",
            field_errors=[
                FieldError(
                    field="tool",
                    expected="a registered tool",
                    received=tool_name,
                    suggestion="Use the call's tool or one of its accepted alternates.",
                )
            ],
        )
    arguments = body.get("arguments")
    candidate = Candidate(
        attempt_id=body["attempt_id"],
        tool=tool.name,
        arguments=call.arguments if arguments is None else arguments,
        credential_version=body.get("credential_version"),
        evidence=tuple(body.get("evidence") or ()),
    )
    return candidate, tool


def _evaluate(call: Call, candidate: Candidate, tool: Tool, now: datetime, *, probe_taken: bool = False):
    """The gate's answer. `probe_taken`: this admission lost the half-open probe to another one after the gate had
    offered it, so the gate is asked again (the breaker read afresh) knowing that no probe is left."""
    policy = tool_policy(call.tool)
    candidate_policy = tool_policy(tool) if tool.pk != call.tool_id else None
    context, view = gate_context(
        call,
        tool=policy,
        candidate_tool=candidate_policy,
        executing_tool=tool,
        task=call.task,
        now=now,
        approval=_approval_available(call, candidate),
    )
    if probe_taken:
        context = replace(context, breaker=replace(context.breaker, probe_available=False))
    return admit(view, candidate, context), policy


# States whose admission the gate grants only on an approval; elsewhere it matters only when the candidate claims one.
_APPROVAL_STATES = frozenset({S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW})


def _approval_available(call: Call, candidate: Candidate) -> bool:
    """Whether an approved action request allows this call one admission now (SPEC §5 `approval_granted`).

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


def gate_ask(*, call: Call, body: dict, actor: Actor) -> dict:
    """POST .../gate: would this candidate be admitted? Stored, never acted on."""
    candidate, tool = _candidate(call, body)
    gate, _ = _evaluate(call, candidate, tool, timezone.now())
    row = _store_gate(call, candidate, gate, actor, dry_run=True)
    return _gate_json(gate, row)


def _store_gate(call, candidate, gate, actor, *, dry_run=False, attempt=None) -> GateDecision:
    row = GateDecision(
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
        checks=_checks_json(gate.checks),
        required_next=asdict(gate.required_next) if gate.required_next else {},
        actor_token_id=actor.token_id,
        actor_user_id=actor.user_id,
    )
    return insert(row)


def attempt_admit(*, call: Call, body: dict, actor: Actor) -> Admission:
    """POST .../attempts: admission, or a single shot when the body carries an outcome (SPEC §8.1)."""
    digest = body_hash(body)
    stored = _stored_attempt(call, body["attempt_id"])
    if stored is not None:
        return _replay(stored, digest)
    now = timezone.now()
    candidate, tool = _candidate(call, body)
    gate, _ = _evaluate(call, candidate, tool, now)
    probe = gate.uses_probe
    if probe and not breaker_reserve_probe(tool, now=now):
        # Another admission reserved the half-open probe between our gate and our reservation: the gate answers
        # again, without a probe — a degrade denial with the fallback (or an admission, if that probe closed it).
        gate, _ = _evaluate(call, candidate, tool, now, probe_taken=True)
        probe = False
    outcome_body = body.get("outcome")
    if not gate.allowed:
        if outcome_body is None:
            row = _store_gate(call, candidate, gate, actor)
            return Admission(
                409, {"admitted": False, "call_id": call.pk, "call_state": call.state, "gate": _gate_json(gate, row)}
            )
        return _bypassed_single_shot(call, candidate, tool, gate, outcome_body, digest, actor, now)
    judged = None
    if outcome_body is not None:
        # Classify and count the breaker outcome before our transaction: the breaker's short transaction never
        # runs inside ours, so bucket rows are never locked after an audit head (one lock order, no deadlock).
        number = call.attempts_count + 1
        outcome = _classify(call, tool, candidate.arguments, candidate.attempt_id, number, outcome_body, now)
        judged = (outcome, _record_breaker(tool, outcome, outcome_body, probe=probe, now=now))
    try:
        # The audit events are appended last: the global audit head is locked for the appends and the commit only.
        with transaction.atomic(), appends_at_commit():
            if judged is not None:
                response = _single_shot(call, candidate, tool, gate, outcome_body, judged, digest, actor, now, probe)
            else:
                attempt = _admit_attempt(call, candidate, tool, gate, actor, now, digest, probe=probe)
                attempt.response = {
                    "admitted": True,
                    "call_id": call.pk,
                    "attempt_id": attempt.attempt_id,
                    "attempt_number": attempt.number,
                    "call_state": call.state,
                    "gate": _gate_json(gate, attempt.gate_row),
                }
                attempt.save(update_fields=["response"])
                response = attempt.response
    except (TransitionConflict, IntegrityError):
        if probe and judged is None:
            breaker_release_probe(tool, now=now)  # never sent: a lost race must not use up the half-open probe
        raced = _stored_attempt(call, body["attempt_id"], fresh=True)
        if raced is not None:
            return _replay(raced, digest)
        raise ServiceError(409, "conflict", "another attempt of this call was admitted at the same moment") from None
    return Admission(201, response)


def _stored_attempt(call: Call, attempt_id: str, *, fresh: bool = False) -> Attempt | None:
    """The attempt this call already has under `attempt_id` (unique per call), asked on every admission. The
    call's admission read (selectors.tasks_calls.call_for_attempt) already says whether there is one, so the row
    is read only when there is; `fresh`: ask the database now (after losing a race to a concurrent request)."""
    if fresh or not hasattr(call, "stored_attempt_pk"):
        return Attempt.objects.filter(call=call, attempt_id=attempt_id).first()
    return Attempt.objects.filter(pk=call.stored_attempt_pk).first() if call.stored_attempt_pk else None


def _replay(stored: Attempt, digest: str) -> Admission:
    if stored.request_hash != digest:
        raise ServiceError(
            422,
            "attempt_id_reused",
            "this attempt_id was already used with a different body",
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
        raise ServiceError(409, "in_flight", "a request with this attempt_id is still being processed")
    return Admission(200, stored.response)


def _new_attempt(call: Call, candidate: Candidate, tool: Tool, digest: str, number: int, **fields) -> Attempt:
    return Attempt(
        call=call,
        attempt_id=candidate.attempt_id,
        number=number,
        tool=tool,
        arguments=candidate.arguments,
        fingerprint=fingerprint(tool.name, candidate.arguments),
        credential_version=candidate.credential_version,
        evidence=list(candidate.evidence),
        request_hash=digest,
        **fields,
    )


def _record_attempt(call, candidate, tool, gate, actor, digest, **flags) -> Attempt:
    """The attempt row, its stored gate answer and the task's round, in the caller's transaction."""
    number = call.attempts_count + 1
    attempt = _new_attempt(call, candidate, tool, digest, number, **flags)
    insert(attempt)
    attempt.gate_row = _store_gate(call, candidate, gate, actor, attempt=attempt)
    _count_round(call, number)
    return attempt


def _admitted(call: Call, candidate: Candidate, gate, actor: Actor, now: datetime, number: int) -> None:
    """READY/RETRYABLE (or an approved replay's state) -> SENT for attempt `number`."""
    transition_call(
        call,
        S.SENT,
        actor=actor,
        reason=f"attempt {number} admitted ({gate.evidence_used or gate.reason})",
        evidence={"attempt_id": candidate.attempt_id, "gate": gate.reason, "evidence": gate.evidence_used},
        changes={"attempts_count": number, "sent_at": now},
    )


def _admit_attempt(call, candidate, tool, gate, actor, now, digest, *, probe) -> Attempt:
    attempt = _record_attempt(call, candidate, tool, gate, actor, digest, admitted_at=now, breaker_probe=probe)
    if gate.evidence_used == APPROVAL_GRANTED:
        _use_approval(call, attempt, now)
    _admitted(call, candidate, gate, actor, now, attempt.number)
    return attempt


def _count_round(call: Call, number: int, *, tokens: int = 0) -> Counters:
    """Count one admitted attempt on the task (a round; a write's retry after its first attempt)."""
    retry = 1 if call.side_effect == "write" and number > 1 else 0
    return count_on_task(call.task_id, rounds=1, write_retries=retry, tokens=tokens)


# --- outcomes ------------------------------------------------------------------------------------------------------


def facts_from(body: dict) -> Facts:
    error = body.get("error")
    return Facts(
        connection_opened=body.get("connection_opened"),
        sent=body.get("sent"),
        http_status=body.get("http_status"),
        error=ErrorFacts(kind=error.get("kind"), code=error.get("code"), message=error.get("message"))
        if error
        else None,
        provider_request_id=body.get("provider_request_id"),
        retry_after_ms=body.get("retry_after_ms"),
        result=body.get("result"),
        tokens_used=body.get("tokens_used"),
        started_at=body.get("started_at"),
        finished_at=body.get("finished_at"),
        echoed_idempotency_key=body.get("echoed_idempotency_key"),
        credential_scopes=tuple(body["credential_scopes"]) if body.get("credential_scopes") is not None else None,
    )


def attempt_report(*, call: Call, attempt: Attempt, body: dict, actor: Actor) -> dict:
    """POST .../attempts/{attempt_id}/outcome."""
    digest = body_hash(body)
    if attempt.outcome_request_hash:
        if attempt.outcome_request_hash != digest:
            raise ServiceError(
                422,
                "outcome_already_reported",
                "this attempt's outcome was already reported with different facts; evidence is never rewritten",
            )
        return attempt.outcome_response
    now = timezone.now()
    outcome = _classify(call, attempt.tool, attempt.arguments, attempt.attempt_id, attempt.number, body, now)
    current = call.state == S.SENT and attempt.number == call.attempts_count
    breaker = _record_breaker(attempt.tool, outcome, body, probe=attempt.breaker_probe, now=now) if current else None
    with transaction.atomic(), appends_at_commit():  # the audit heads locked for the appends and the commit only
        # Locked: a provider's callback or a reconciliation check may settle this call at the same moment; whoever
        # comes second sees what the first wrote (a late outcome is then kept as evidence) instead of conflicting.
        calls = Call.objects.select_for_update(of=("self",)).select_related("tool__provider", "task")
        call = calls.get(pk=call.pk)
        response = report_in_transaction(call, attempt, body, actor, now, (outcome, breaker), single_shot=False)
        Attempt.objects.filter(pk=attempt.pk).update(outcome_request_hash=digest, outcome_response=response)
    return response


def _classify(call: Call, tool: Tool, arguments: dict, attempt_id: str, number: int, body: dict, now) -> Outcome:
    """Classification only reads, so it runs before any transaction."""
    ctx = ClassifyContext(
        call_id=str(call.pk),
        attempt_id=attempt_id,
        idempotency_key=call.idempotency_key,
        attempt_number=number,
        previous_scopes=_previous_scopes(call, number),
        arguments=arguments,
        now=now,
    )
    return classify(facts_from(body), tool_policy(tool), ctx)


def _record_breaker(tool: Tool, outcome: Outcome, body: dict, *, probe: bool, now: datetime):
    """Count the outcome on the tool's shared breaker, in the breaker's own short transaction."""
    failure_class = outcome.failure.failure_class if outcome.failure else None
    counts = breaker_rules.counts_as_failure(outcome.row, failure_class, body.get("http_status"))
    return breaker_record(tool, counts_as_failure=counts, probe=probe, now=now)


def _previous_scopes(call: Call, number: int) -> tuple[str, ...] | None:
    if number <= 1:
        return None  # attempts are numbered from 1: the first has none before it
    facts = (
        Attempt.objects.filter(call=call, number__lt=number, facts__isnull=False)
        .order_by("-number")
        .values_list("facts", flat=True)
        .first()
    )
    scopes = (facts or {}).get("credential_scopes")
    return tuple(scopes) if scopes is not None else None


def _set_facts(attempt: Attempt, body: dict, outcome: Outcome, call: Call, now: datetime) -> None:
    """The reported facts and their classification on `attempt` (not saved); a Diagnostic row for error text."""
    facts = dict(body)
    diagnostic = None
    error = body.get("error") or {}
    if error.get("message") or (outcome.failure and body.get("result") is not None):
        detail = redact(str(error.get("message") or ""))
        diagnostic = Diagnostic.objects.create(
            ref=f"diag_{uuid.uuid4().hex[:16]}",
            tenant_id=call.tenant_id,
            call=call,
            source="attempt",
            summary=f"attempt {attempt.number}: {outcome.error}",
            detail=detail,
            data=redact_data({"result": body.get("result"), "error": error}),
        )
    if error.get("message") is not None:
        facts["error"] = {**error, "message": "[in diagnostic]"}
    failure = asdict(outcome.failure) if outcome.failure else None
    if failure is not None:
        failure["diagnostic_ref"] = diagnostic.ref if diagnostic else ""
        failure["side_effect"] = outcome.side_effect
        failure["row"] = outcome.row
    attempt.facts = redact_data(facts)
    attempt.connection_opened = body.get("connection_opened")
    attempt.sent = body.get("sent")
    attempt.http_status = body.get("http_status")
    attempt.error_kind = error.get("kind") or ""
    attempt.error_code = (error.get("code") or "")[:100]
    attempt.provider_request_id = (body.get("provider_request_id") or "")[:255]
    attempt.retry_after_ms = body.get("retry_after_ms")
    attempt.tokens_used = body.get("tokens_used")
    attempt.started_at = body.get("started_at")
    attempt.finished_at = body.get("finished_at")
    attempt.reported_at = now
    attempt.failure = failure or {"side_effect": outcome.side_effect, "row": outcome.row, "phase": outcome.phase}
    attempt.failure_class = outcome.failure.failure_class if outcome.failure else ""
    attempt.diagnostic = diagnostic


def _store_facts(attempt: Attempt, body: dict, outcome: Outcome, call: Call, now: datetime) -> None:
    _set_facts(attempt, body, outcome, call, now)
    attempt.save(update_fields=_FACT_FIELDS)


# What _store_facts writes: the reported facts and their classification, nothing the admission wrote.
_FACT_FIELDS = (
    "facts",
    "connection_opened",
    "sent",
    "http_status",
    "error_kind",
    "error_code",
    "provider_request_id",
    "retry_after_ms",
    "tokens_used",
    "started_at",
    "finished_at",
    "reported_at",
    "failure",
    "failure_class",
    "diagnostic",
)


def report_in_transaction(
    call: Call, attempt: Attempt, body: dict, actor: Actor, now: datetime, judged, *, single_shot: bool
) -> dict:
    """Store the facts and move the call; `judged` is (outcome, breaker view), computed before the transaction."""
    outcome, breaker = judged
    _store_facts(attempt, body, outcome, call, now)
    late = call.state != S.SENT or attempt.number != call.attempts_count or breaker is None
    if late:
        if body.get("tokens_used"):
            count_on_task(call.task_id, tokens=body["tokens_used"])
        return _late_outcome(call, attempt, outcome, actor, now)
    counters = count_on_task(call.task_id, tokens=body.get("tokens_used") or 0)
    decision = _settle(call, attempt, body, outcome, breaker, counters, actor, now, single_shot=single_shot)
    row = _store_decision(call, attempt, decision) if decision else None
    return _outcome_json(call, attempt, outcome, decision, row, breaker.state)


def _settle(call, attempt, body, outcome, breaker, counters: Counters, actor, now, *, single_shot: bool):
    """Decide on a current attempt's outcome (the task's counters as this transaction left them) and move the
    call there; a committed write's own 2xx is recorded as a receipt. The decision, or None for COMMITTED."""
    policy = tool_policy(call.tool)
    decision = decide(
        outcome,
        call=call_view(call, policy, call.task, None),
        task=task_view_for_decision(call.task, counters),
        tool=policy,
        breaker=breaker,
        now=now,
        rng=random.Random(f"{call.pk}:{attempt.number}"),
    )
    target = decision.call_state if decision else outcome.state
    transition_call(
        call,
        target,
        actor=actor,
        reason=_reason(outcome, decision, single_shot),
        evidence={
            "attempt_id": attempt.attempt_id,
            "row": outcome.row,
            "error": outcome.error,
            "http_status": body.get("http_status"),
        },
        changes=_changes_for(target, outcome, policy, now, decision),
    )
    if target == S.COMMITTED and policy.is_write:
        _runtime_receipt(call, attempt, outcome, now, before=S.SENT)
    return decision


def _single_shot(call, candidate, tool, gate, outcome_body, judged, digest, actor, now, probe) -> dict:
    """Admission and outcome in one transaction (SPEC §8.1), in the fewest statements: the task's counters are
    moved once, the call moved twice, and the attempt inserted last, whole — facts, answer and all — unless the
    answer needs the id of a row that needs the attempt's (a decision card), which then costs one UPDATE more."""
    outcome, breaker = judged
    number = call.attempts_count + 1
    counters = _count_round(call, number, tokens=outcome_body.get("tokens_used") or 0)
    _admitted(call, candidate, gate, actor, now, number)
    attempt = _new_attempt(call, candidate, tool, digest, number, admitted_at=now, breaker_probe=probe)
    _set_facts(attempt, outcome_body, outcome, call, now)
    decision = _settle(call, attempt, outcome_body, outcome, breaker, counters, actor, now, single_shot=True)
    attempt.outcome_request_hash = body_hash(outcome_body)
    approved = gate.evidence_used == APPROVAL_GRANTED
    if decision is None and not approved:
        attempt.response = attempt.outcome_response = _outcome_json(call, attempt, outcome, None, None, breaker.state)
        insert(attempt)
        _store_gate(call, candidate, gate, actor, attempt=attempt)
        return attempt.response
    insert(attempt)
    _store_gate(call, candidate, gate, actor, attempt=attempt)
    if approved:
        _use_approval(call, attempt, now)
    row = _store_decision(call, attempt, decision) if decision else None
    attempt.response = attempt.outcome_response = _outcome_json(call, attempt, outcome, decision, row, breaker.state)
    attempt.save(update_fields=["response", "outcome_request_hash", "outcome_response"])
    return attempt.response


def _changes_for(target, outcome: Outcome, policy, now, decision: Decision | None) -> dict:
    changes: dict[str, Any] = {}
    if outcome.provider_ref:
        changes["provider_ref"] = outcome.provider_ref[:255]
    if target in (S.UNKNOWN, S.ACCEPTED):
        changes["next_check_at"] = now + timedelta(seconds=policy.reconcile_first_check_s)
    if decision and decision.outcome:
        changes["outcome"] = decision.outcome
    return changes


def _reason(outcome: Outcome, decision: Decision | None, single_shot: bool) -> str:
    prefix = "single shot: " if single_shot else ""
    if decision is None:
        return f"{prefix}outcome row {outcome.row}: {outcome.error}"
    return f"{prefix}outcome row {outcome.row}: {outcome.error} -> {decision.route}"


def _store_decision(call: Call, attempt: Attempt, decision: Decision) -> DecisionRow:
    card = decision_json(decision)
    return DecisionRow.objects.create(
        call=call,
        attempt=attempt,
        route=decision.route,
        delay_ms=decision.delay_ms,
        next_actions=list(decision.next),
        forbidden=list(decision.forbidden),
        required_next=card["required_next"],
        public_message=decision.public_message,
        fallback=decision.fallback,
        card=card,
    )


def decision_json(decision: Decision) -> dict:
    card = asdict(decision)
    card["next"] = list(decision.next)
    card["forbidden"] = list(decision.forbidden)
    return card


def _runtime_receipt(call: Call, attempt: Attempt, outcome: Outcome, now: datetime, *, before: str) -> None:
    """A runtime's own 2xx with a valid result and a provider reference is an idempotency record (SPEC §8)."""
    insert(
        Receipt(
            call=call,
            provider_id=call.tool.provider_id,
            source="runtime",
            observed="committed",
            provider_status=str(attempt.http_status or ""),
            provider_ref=outcome.provider_ref[:255],
            local_state_before=before,
            local_state_after=S.COMMITTED,
            applied=True,
            evidence=[f"attempt:{attempt.attempt_id}"],
            checked_at=now,
        )
    )


def _outcome_json(call, attempt, outcome: Outcome, decision, row, breaker_state: str) -> dict:
    failure = attempt.failure if outcome.failure else None
    return {
        "call_id": call.pk,
        "attempt_id": attempt.attempt_id,
        "attempt_number": attempt.number,
        "call_state": call.state,
        "policy_bypassed": attempt.policy_bypassed,
        "failure": _public_failure(failure),
        "decision": (decision_json(decision) | {"id": row.pk if row else None}) if decision else None,
        "breaker_state": breaker_state,
        "provider_ref": call.provider_ref,
    }


def _public_failure(failure: dict | None) -> dict | None:
    if failure is None:
        return None
    keys = (
        "tool",
        "call_id",
        "attempt_id",
        "failure_class",
        "phase",
        "stage",
        "retryable",
        "replay_safe",
        "retry_after_ms",
        "public_message",
        "field_errors",
        "diagnostic_ref",
        "authorization_required",
        "external_state_verified",
    )
    public = {k: failure.get(k) for k in keys}
    public["class"] = public.pop("failure_class")
    return public


def _late_outcome(call: Call, attempt: Attempt, outcome: Outcome, actor: Actor, now: datetime) -> dict:
    """An outcome for an attempt the call has moved past (swept to UNKNOWN, or superseded): evidence is kept; a
    committed write settles an unknown call like any idempotency record."""
    if (
        outcome.state == S.COMMITTED
        and call.side_effect == "write"
        and call.state in (S.UNKNOWN, S.STILL_UNKNOWN, S.ACCEPTED)
    ):
        before = call.state
        transition_call(
            call,
            S.COMMITTED,
            actor=actor,
            reason="late outcome: the runtime's 2xx with a provider reference settles it",
            evidence={"attempt_id": attempt.attempt_id},
            changes={"provider_ref": outcome.provider_ref[:255]},
        )
        _runtime_receipt(call, attempt, outcome, now, before=before)
    return _outcome_json(call, attempt, outcome, None, None, "") | {"late": True}


def _bypassed_single_shot(call, candidate, tool, gate, outcome_body, digest, actor, now) -> Admission:
    """A single shot the gate would have denied: keep the facts, flag the attempt, send a write to a person.

    It did reach the provider, so its outcome counts on the tool's breaker like any other.
    """
    number = call.attempts_count + 1
    outcome = _classify(call, tool, candidate.arguments, candidate.attempt_id, number, outcome_body, now)
    breaker = _record_breaker(tool, outcome, outcome_body, probe=False, now=now)
    with transaction.atomic(), appends_at_commit():  # the audit heads locked for the appends and the commit only
        attempt = _record_attempt(call, candidate, tool, gate, actor, digest, policy_bypassed=True)
        _store_facts(attempt, outcome_body, outcome, call, now)
        Call.objects.filter(pk=call.pk).update(attempts_count=number)
        call.attempts_count = number
        reason = f"policy-bypassing single shot ({gate.reason}): {outcome.error}"
        evidence = {"attempt_id": attempt.attempt_id, "gate": gate.reason, "row": outcome.row}
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
        response = _outcome_json(call, attempt, outcome, None, None, breaker.state)
        response["gate"] = _gate_json(gate, None)
        attempt.response = response
        attempt.outcome_request_hash = body_hash(outcome_body)
        attempt.outcome_response = response
        attempt.save(update_fields=["response", "outcome_request_hash", "outcome_response"])
    return Admission(201, response)

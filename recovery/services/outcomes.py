"""Outcome reports (docs/design/classification.md, docs/design/state-machine.md): what a runtime saw when it sent an
attempt, classified and counted on the tool's breaker before any transaction (docs/breakers.md: bucket rows are
never locked after an audit head), then recorded in one: the facts, the call moved by transition_call, the decision
card and, for a committed write, its runtime receipt.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from recovery.audit.chain import Actor, appends_at_commit
from recovery.engine.canonical import canonical_digest
from recovery.engine.classify import classify, counts_as_failure
from recovery.engine.decide import decide
from recovery.engine.redact import redact, redact_data
from recovery.engine.states import CallState
from recovery.engine.types import BreakerView, ClassifyContext, Decision, ErrorFacts, Facts, Outcome, ToolPolicy
from recovery.jobs.queueing import kick
from recovery.models import Attempt, Call, Diagnostic, Receipt, Tool
from recovery.models import Decision as DecisionRow
from recovery.registry import tool_policy
from recovery.selectors.context import call_view, task_view_for_decision
from recovery.services.answers import decision_json, outcome_json
from recovery.services.breakers import breaker_record
from recovery.services.errors import Refusal
from recovery.statemachine import hot_reads
from recovery.statemachine.hot_path import Counters, count_on_task, insert
from recovery.statemachine.transitions import transition_call

S = CallState
# The job that sweeps the due calls at once when writes turn UNKNOWN (its runs are `reconcile-now-<token>`).
RECONCILE_NOW = "reconcile-now"

_FACT_KEYS = tuple(name for name in Facts.__dataclass_fields__ if name != "error")
_ERROR_KEYS = ("kind", "code", "message")


def facts_of(wire: dict[str, Any]) -> Facts:
    """Outcome facts from their wire form (the API's validated body, recovery_client's facts_from_response /
    facts_from_exception): times as ISO 8601 text or datetimes, the error as an object."""
    error = wire.get("error")
    values = {key: wire.get(key) for key in _FACT_KEYS}
    for key in ("started_at", "finished_at"):
        if isinstance(values[key], str):
            values[key] = datetime.fromisoformat(values[key])
    if values["credential_scopes"] is not None:
        values["credential_scopes"] = tuple(values["credential_scopes"])
    errors = ErrorFacts(**{key: error.get(key) for key in _ERROR_KEYS}) if error else None
    return Facts(**values, error=errors)


def facts_json(facts: Facts) -> dict[str, Any]:
    """The facts as stored and hashed: the fields reported (None is not reported), times as ISO 8601 text."""
    wire: dict[str, Any] = {}
    for key in _FACT_KEYS:
        value = getattr(facts, key)
        if value is None:
            continue
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, tuple):
            value = list(value)
        wire[key] = value
    if facts.error is not None:
        wire["error"] = {key: getattr(facts.error, key) for key in _ERROR_KEYS if getattr(facts.error, key) is not None}
    return wire


@dataclass(frozen=True)
class Judgement:
    """An outcome judged before the transaction that records it: its classification and the tool's breaker as
    counting it left it (None: not counted, the attempt is no longer the call's current one)."""

    outcome: Outcome
    breaker: BreakerView | None


@dataclass(frozen=True)
class Sent:
    """What an attempt sent, as judging its outcome reads it: the tool it called with which arguments, its id and
    number within the call, and whether it was the half-open breaker's probe."""

    tool: Tool
    arguments: dict
    attempt_id: str
    number: int
    probe: bool

    @classmethod
    def of(cls, attempt: Attempt) -> Sent:
        return cls(attempt.tool, attempt.arguments, attempt.attempt_id, attempt.number, attempt.breaker_probe)


def judge(call: Call, facts: Facts, sent: Sent, *, now: datetime, count: bool = True) -> Judgement:
    """Classify the facts of what was `sent` and, when `count`, count them on the tool's shared breaker (in the
    breaker's own short transaction). Outside any transaction."""
    context = ClassifyContext(
        call_id=str(call.pk),
        attempt_id=sent.attempt_id,
        idempotency_key=call.idempotency_key,
        attempt_number=sent.number,
        previous_scopes=_previous_scopes(call, sent.number),
        arguments=sent.arguments,
        now=now,
    )
    outcome = classify(facts, tool_policy(sent.tool), context)
    if not count:
        return Judgement(outcome, None)
    failure_class = outcome.failure.failure_class if outcome.failure else None
    failed = counts_as_failure(outcome.row, failure_class, facts.http_status)
    return Judgement(outcome, breaker_record(sent.tool, counts_as_failure=failed, probe=sent.probe, now=now))


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


def attempt_report(*, call: Call, attempt: Attempt, facts: Facts, actor: Actor) -> dict:
    """POST .../attempts/{attempt_id}/outcome: the answer (stored, and replayed to the same report)."""
    digest = canonical_digest(facts_json(facts))
    if attempt.outcome_request_hash:
        if attempt.outcome_request_hash != digest:
            raise Refusal(
                "outcome_already_reported",
                "this attempt's outcome was already reported with different facts; evidence is never rewritten",
                status=422,
            )
        return attempt.outcome_response
    now = timezone.now()
    current = call.state == S.SENT and attempt.number == call.attempts_count
    judgement = judge(call, facts, Sent.of(attempt), now=now, count=current)
    with transaction.atomic(), appends_at_commit():  # the audit heads locked for the appends and the commit only
        # Locked: a provider's callback or a reconciliation check may settle this call at the same moment; whoever
        # comes second sees what the first wrote (a late outcome is then kept as evidence) instead of conflicting.
        same_tool = call.tool_id == attempt.tool_id and Call.task.is_cached(call)  # its tool and task read with it
        call = hot_reads.locked_call(call.pk, **({"tool": attempt.tool, "task": call.task} if same_tool else {}))
        if call.tool_id == attempt.tool_id:  # the alternates its judgement read: not read again for the decision
            call.tool.alternate_names = attempt.tool.alternate_names
        response = _record(call, attempt, facts, judgement, actor=actor, now=now)
        # The facts, their classification and the stored answer in one UPDATE of the attempt row.
        attempt.outcome_request_hash, attempt.outcome_response = digest, response
        attempt.save(update_fields=(*_FACT_FIELDS, "outcome_request_hash", "outcome_response"))
    return response


def _record(call: Call, attempt: Attempt, facts: Facts, judgement: Judgement, *, actor: Actor, now: datetime) -> dict:
    """Set the facts on `attempt` (the caller saves them with the answer) and move the call, in the caller's
    transaction."""
    set_facts(attempt, facts, judgement.outcome, call=call, now=now)
    breaker = judgement.breaker
    if call.state != S.SENT or attempt.number != call.attempts_count or breaker is None:
        if facts.tokens_used:
            count_on_task(call.task_id, tokens=facts.tokens_used)
        return _late_outcome(call, attempt, judgement.outcome, actor=actor, now=now)
    counters = count_on_task(call.task_id, tokens=facts.tokens_used or 0)
    decision = settle(call, attempt, facts, judgement, counters, actor=actor, now=now, single_shot=False)
    card = store_decision(call, attempt, decision) if decision else None
    return outcome_json(
        call, attempt, judgement.outcome, decision=decision, card_id=card.pk if card else None, breaker=breaker.state
    )


def set_facts(attempt: Attempt, facts: Facts, outcome: Outcome, *, call: Call, now: datetime) -> None:
    """The reported facts and their classification on `attempt` (not saved); a Diagnostic row for error text."""
    stored = facts_json(facts)
    diagnostic = None
    error = facts.error or ErrorFacts()
    if error.message or (outcome.failure and facts.result is not None):
        diagnostic = Diagnostic.objects.create(
            ref=f"diag_{uuid.uuid4().hex[:16]}",
            tenant_id=call.tenant_id,
            call=call,
            source="attempt",
            summary=f"attempt {attempt.number}: {outcome.error}",
            detail=redact(str(error.message or "")),
            data=redact_data({"result": facts.result, "error": stored.get("error", {})}),
        )
    if error.message is not None:
        stored["error"] = {**stored["error"], "message": "[in diagnostic]"}
    failure = asdict(outcome.failure) if outcome.failure else None
    if failure is not None:
        failure["diagnostic_ref"] = diagnostic.ref if diagnostic else ""
        failure["side_effect"] = outcome.side_effect
        failure["row"] = outcome.row
    attempt.facts = redact_data(stored)
    attempt.connection_opened = facts.connection_opened
    attempt.sent = facts.sent
    attempt.http_status = facts.http_status
    attempt.error_kind = error.kind or ""
    attempt.error_code = (outcome.error_code or error.code or "")[:100]
    attempt.provider_request_id = (facts.provider_request_id or "")[:255]
    attempt.retry_after_ms = facts.retry_after_ms
    attempt.tokens_used = facts.tokens_used
    attempt.started_at = facts.started_at
    attempt.finished_at = facts.finished_at
    attempt.reported_at = now
    attempt.failure = failure or {"side_effect": outcome.side_effect, "row": outcome.row, "phase": outcome.phase}
    attempt.failure_class = outcome.failure.failure_class if outcome.failure else ""
    attempt.diagnostic = diagnostic


# What store_facts writes: the reported facts and their classification, nothing the admission wrote.
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


def store_facts(attempt: Attempt, facts: Facts, outcome: Outcome, *, call: Call, now: datetime) -> None:
    set_facts(attempt, facts, outcome, call=call, now=now)
    attempt.save(update_fields=_FACT_FIELDS)


def settle(
    call: Call,
    attempt: Attempt,
    facts: Facts,
    judgement: Judgement,
    counters: Counters,
    *,
    actor: Actor,
    now: datetime,
    single_shot: bool,
) -> Decision | None:
    """Decide on a current attempt's outcome (the task's counters as this transaction left them) and move the
    call there; a committed write's own 2xx is recorded as a receipt. The decision, or None for COMMITTED."""
    outcome, breaker = judgement.outcome, judgement.breaker
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
            "http_status": facts.http_status,
            # what the metrics fold counts (recovery.engine.metrics): the failure class and the decision's route
            "class": outcome.failure.failure_class if outcome.failure else "",
            "route": decision.route if decision else "",
        },
        changes=_changes_for(target, outcome, policy, now=now, decision=decision)
        | (_runtime_receipt_columns(now) if target == S.COMMITTED and policy.is_write else {}),
    )
    if target == S.COMMITTED and policy.is_write:
        _runtime_receipt(call, attempt, outcome, now=now, before=S.SENT)
    if target == S.UNKNOWN:
        check_at_once(call, policy.reconcile.first_check_s)
    return decision


def check_at_once(call: Call, first_check_s: int) -> None:
    """A write that just turned UNKNOWN with a first check due at once (the registry's first_check_s 0): a sweep of
    the due calls is asked for when this transaction commits, not left for the next periodic run. One sweep for the
    whole burst, never a job per call: it checks RECOVERY_CHECKS_IN_FLIGHT calls at a time (docs/reconciliation.md)."""
    if first_check_s == 0:
        kick("recovery.jobs.tasks.reconcile_now", RECONCILE_NOW)


def _changes_for(
    target: S, outcome: Outcome, policy: ToolPolicy, *, now: datetime, decision: Decision | None
) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if outcome.provider_ref:
        changes["provider_ref"] = outcome.provider_ref[:255]
    if target in (S.UNKNOWN, S.ACCEPTED):
        changes["next_check_at"] = now + timedelta(seconds=policy.reconcile.first_check_s)
    if decision and decision.outcome:
        changes["outcome"] = decision.outcome
    return changes


def _reason(outcome: Outcome, decision: Decision | None, single_shot: bool) -> str:
    prefix = "single shot: " if single_shot else ""
    if decision is None:
        return f"{prefix}outcome row {outcome.row}: {outcome.error}"
    return f"{prefix}outcome row {outcome.row}: {outcome.error} -> {decision.route}"


def store_decision(call: Call, attempt: Attempt, decision: Decision) -> DecisionRow:
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


def _runtime_receipt_columns(now: datetime) -> dict:
    """The call's last-receipt columns for the runtime receipt below, set by the same transition, so every page reads
    the newest receipt from the call (recovery.selectors.facts)."""
    return {"last_receipt_at": now, "last_receipt_status": "committed"}


def _runtime_receipt(call: Call, attempt: Attempt, outcome: Outcome, *, now: datetime, before: str) -> None:
    """A runtime's own 2xx with a valid result and a provider reference is an idempotency record
    (docs/design/state-machine.md)."""
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


def _late_outcome(call: Call, attempt: Attempt, outcome: Outcome, *, actor: Actor, now: datetime) -> dict:
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
            changes={"provider_ref": outcome.provider_ref[:255]} | _runtime_receipt_columns(now),
        )
        _runtime_receipt(call, attempt, outcome, now=now, before=before)
    return outcome_json(call, attempt, outcome, decision=None, card_id=None, breaker="", late=True)

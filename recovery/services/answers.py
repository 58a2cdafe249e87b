"""The JSON a runtime gets back (docs/design/gate.md, docs/design/state-machine.md): the gate's answer, an outcome's
answer with its decision card, and the public half of a failure. Stored with the attempt and replayed byte for byte to a
repeated request, so these are the only places that shape them."""

from __future__ import annotations

from dataclasses import asdict

from recovery.engine.types import Check, Decision, Outcome
from recovery.engine.types import GateDecision as Gate
from recovery.models import Attempt, Call, GateDecision
from recovery.services.errors import field_errors_json

# The failure's fields a runtime (and so a model) may read: never the raw error text, which stays in a Diagnostic.
PUBLIC_FAILURE_KEYS = (
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


def checks_json(checks: tuple[Check, ...]) -> list[dict]:
    # What asdict() gives for these flat records, without its recursive deep copy: every admission stores and
    # answers seven of them.
    return [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in checks]


def gate_json(gate: Gate, row: GateDecision | None) -> dict:
    required = gate.required_next
    return {
        "id": row.pk if row else None,
        "allowed": gate.allowed,
        "reason": gate.reason,
        "evidence_used": gate.evidence_used,
        "checks": checks_json(gate.checks),
        "required_next": asdict(required) if required else None,
        "public_message": gate.public_message,
        "field_errors": field_errors_json(gate.field_errors),
    }


def decision_json(decision: Decision) -> dict:
    card = asdict(decision)
    card["next"] = list(decision.next)
    card["forbidden"] = list(decision.forbidden)
    return card


def public_failure(failure: dict | None) -> dict | None:
    if failure is None:
        return None
    public = {key: failure.get(key) for key in PUBLIC_FAILURE_KEYS}
    public["class"] = public.pop("failure_class")
    return public


def outcome_json(
    call: Call,
    attempt: Attempt,
    outcome: Outcome,
    *,
    decision: Decision | None,
    card_id: int | None,
    breaker: str,
    late: bool = False,
) -> dict:
    """The answer to an outcome: the call's state after it, the public failure, the decision card (`card_id`: its
    stored row), the tool's breaker state ("" when the outcome was not counted) and whether it came `late` (after
    the call had moved past the attempt). Its schema is recovery.api.answers.OutcomeOut."""
    failure = attempt.failure if outcome.failure else None
    return {
        "call_id": call.pk,
        "attempt_id": attempt.attempt_id,
        "attempt_number": attempt.number,
        "call_state": call.state,
        "policy_bypassed": attempt.policy_bypassed,
        "failure": public_failure(failure),
        "decision": (decision_json(decision) | {"id": card_id}) if decision else None,
        "breaker_state": breaker,
        "provider_ref": call.provider_ref,
        "late": late,
        "gate": None,  # a single shot's bypassed denial, when there was one (recovery.services.attempts)
    }

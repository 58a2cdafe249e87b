"""Public messages (docs/design/classification.md, "Public messages"): the minimal actionable text a model may see, each
a template filled only from trusted inputs (the class, the registry, field errors derived from its schema); a field
name that is not a plain identifier (an unknown key the model sent) is not echoed either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from recovery.engine.types import (
    AUTHENTICATION,
    AUTHORIZATION,
    CAPABILITY_MISSING,
    DEGRADED_READ_ONLY,
    HUMAN_REVIEW_REQUIRED,
    INVALID_ARGUMENTS,
    INVALID_RESULT,
    OUTCOME_UNKNOWN,
    TRANSIENT,
    UNRECOVERABLE,
    FieldError,
    ToolPolicy,
)
from recovery.engine.validation import article, describe, property_schema

MAX_FIELDS_NAMED = 5  # more field errors than this are counted, not listed: the model fixes these first

_SAFE_FIELD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,79}")
_SAFE_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\- ]{0,79}")
_DO_NOT_REPEAT = "Its status is being checked; do not repeat it."


def effect_noun(tool_name: str) -> str:
    """What a tool acts on, for a sentence: the first segment of its name ("refund.create" -> "refund")."""
    first = tool_name.split(".", 1)[0].replace("_", " ").replace("-", " ").strip()
    return first if first and _SAFE_WORD.fullmatch(first) else "call"


def _the(tool: ToolPolicy) -> str:
    return f"The {effect_noun(tool.name)}"


# --- invalid arguments ---------------------------------------------------------------------------------------------


def _unit_phrase(tool: ToolPolicy, field: str, expected: str) -> str:
    unit = property_schema(tool.args_schema, field).get("x-unit")
    if not isinstance(unit, str) or not unit or not _SAFE_WORD.fullmatch(unit) or unit in expected:
        return ""
    return f" in {unit}"


def field_sentence(tool: ToolPolicy, error: FieldError) -> str:
    """ "amount_cents must be a positive integer in cents." for one field error."""
    if not _SAFE_FIELD.fullmatch(error.field):
        return "The arguments contain a field that is not accepted; remove it."
    if error.expected == "no such field":
        return f"{error.field} is not an accepted field; remove it."
    if error.expected == "present":
        wanted = describe(property_schema(tool.args_schema, error.field))
        if wanted in ("valid value", "no such field"):
            return f"{error.field} is required."
        return f"{error.field} is required: {article(wanted)}{wanted}{_unit_phrase(tool, error.field, wanted)}."
    unit = _unit_phrase(tool, error.field, error.expected)
    return f"{error.field} must be {article(error.expected)}{error.expected}{unit}."


def _invalid_arguments(tool: ToolPolicy, field_errors: Iterable[FieldError]) -> str:
    sentences = list(dict.fromkeys(field_sentence(tool, error) for error in field_errors))
    if not sentences:
        return "The provider rejected the arguments; correct them against the tool's schema before retrying."
    shown = sentences[:MAX_FIELDS_NAMED]
    hidden = len(sentences) - len(shown)
    if hidden:
        shown.append(f"({hidden} more field {'error' if hidden == 1 else 'errors'}.)")
    return " ".join(shown)


# --- per class -----------------------------------------------------------------------------------------------------


# A class's message that depends on the tool alone: (for a write, for a read); {the} is "The refund", {noun} "refund".
_BY_CLASS = {
    OUTCOME_UNKNOWN: (
        f"{{the}} may have been executed. {_DO_NOT_REPEAT}",
        f"The outcome of the {{noun}} call is unknown. {_DO_NOT_REPEAT}",
    ),
    AUTHENTICATION: ("The tool's credentials were rejected; refresh them, then retry.",) * 2,
    CAPABILITY_MISSING: ("This tool is not available here; replan with one of the authorized capabilities.",) * 2,
    INVALID_RESULT: (
        f"{{the}} may have been executed, but its result failed validation. {_DO_NOT_REPEAT}",
        "The result failed validation and was not used.",
    ),
    UNRECOVERABLE: (
        "{the} was not executed and cannot succeed as sent; do not retry it.",
        "The call cannot succeed as sent; do not retry it.",
    ),
}


def public_message(
    failure_class: str,
    *,
    tool: ToolPolicy,
    field_errors: Iterable[FieldError] = (),
    retry_after_ms: int | None = None,
    approvable: bool = False,
) -> str:
    """The public message for a failure of `failure_class` (one of types.FAILURE_CLASSES)."""
    if failure_class == INVALID_ARGUMENTS:
        return _invalid_arguments(tool, field_errors)
    if failure_class == TRANSIENT:
        if retry_after_ms is not None:
            return f"The tool is temporarily unavailable; retry after {max(0, int(retry_after_ms))} ms."
        return "The tool is temporarily unavailable; retry later, within the attempt budget."
    if failure_class == AUTHORIZATION:
        if approvable:
            return f"{_the(tool)} needs approval; wait for a person to approve it before retrying."
        return f"{_the(tool)} is not permitted with these credentials; do not retry it."
    if failure_class not in _BY_CLASS:
        raise ValueError(f"unknown failure class {failure_class!r}")
    write, read = _BY_CLASS[failure_class]
    return (write if tool.is_write else read).format(the=_the(tool), noun=effect_noun(tool.name))


# --- what decide() says besides a failure --------------------------------------------------------------------------


def accepted_message(tool: ToolPolicy) -> str:
    return f"{_the(tool)} was accepted and is in progress. {_DO_NOT_REPEAT}"


def exhausted_message(tool: ToolPolicy, outcome: str) -> str:
    """For an explicit exhaustion outcome (docs/design/budgets.md): retry_exhausted, human_review_required,
    degraded_read_only."""
    if outcome == HUMAN_REVIEW_REQUIRED:
        return f"{_the(tool)} needs human review; a person will decide. Do not repeat it."
    if outcome == DEGRADED_READ_ONLY:
        return degraded_message(tool, tool.fallback)
    if tool.is_write:
        return f"{_the(tool)} was not executed and no attempts are left; do not retry it."
    return "The call failed and no attempts are left; do not retry it."


def degraded_message(tool: ToolPolicy, fallback: str) -> str:
    """The tool's breaker is open: say so and name the fallback (never another write tool, docs/breakers.md)."""
    if fallback and _SAFE_WORD.fullmatch(fallback):
        return f"The tool is unavailable right now; use the fallback {fallback} instead of retrying."
    return "The tool is unavailable right now and has no fallback; stop and report what is done."


_HARD_STOPS = {
    "missing_provider_ref": "may have been executed, but the provider returned no reference for it",
    "idempotency_key_mismatch": "was answered under a different idempotency key than the one sent",
    "idempotency_conflict": "was refused because its idempotency key was already used with other arguments",
    "credential_scope_changed": "was made with a credential whose scopes changed between attempts",
}


def hard_stop_message(tool: ToolPolicy, reason: str) -> str:
    """A write sent to human review before the table (docs/design/classification.md hard stops)."""
    why = _HARD_STOPS.get(reason)
    if why is None:
        return f"{_the(tool)} needs human review; a person will decide. Do not repeat it."
    return f"{_the(tool)} {why}. A person will review it; do not repeat it."

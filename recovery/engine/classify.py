"""Failure classification: the table of docs/design/classification.md, hard stops first, the first matching row wins.
classify() reads only the transport facts, the registry entry and the context, never message or result text; the
precedence the table leaves open is settled as that page's "How an outcome is classified" says (`_table()`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from recovery.engine.messages import hard_stop_message, public_message
from recovery.engine.states import CallState as S
from recovery.engine.types import (
    AFTER_RESPONSE,
    AUTHENTICATION,
    AUTHORIZATION,
    BEFORE_SEND,
    COMMIT_UNKNOWN,
    DISPATCH,
    DURING_SEND,
    INVALID_ARGUMENTS,
    INVALID_RESULT,
    NOT_SENT_KINDS,
    OUTCOME_UNKNOWN,
    POSTCHECK,
    PREFLIGHT,
    TRANSIENT,
    UNRECOVERABLE,
    UNSAFE,
    ClassifyContext,
    Facts,
    Failure,
    FieldError,
    Outcome,
    ToolPolicy,
)
from recovery.engine.validation import provider_ref, validate_args, validate_result
from recovery.engine.wire import with_reply_code

RETRYABLE, UNKNOWN, ACCEPTED, COMMITTED = S.RETRYABLE, S.UNKNOWN, S.ACCEPTED, S.COMMITTED
FAILED_PERMANENT, HUMAN_REVIEW = S.FAILED_PERMANENT, S.HUMAN_REVIEW

# Outcome.side_effect
NOT_SENT, NOT_EXECUTED, EFFECT_UNKNOWN, EXECUTED = "not_sent", "not_executed", "unknown", "executed"
NONE, NONE_CONFIRMED = "none", "none_confirmed"
EFFECTS = (NOT_SENT, NOT_EXECUTED, EFFECT_UNKNOWN, EXECUTED, NONE, NONE_CONFIRMED)

# Hard stops (writes only, before the table)
MISSING_PROVIDER_REF = "missing_provider_ref"
IDEMPOTENCY_KEY_MISMATCH = "idempotency_key_mismatch"
IDEMPOTENCY_CONFLICT = "idempotency_conflict"
CREDENTIAL_SCOPE_CHANGED = "credential_scope_changed"

_SENT_ERROR_LABELS = {"read_timeout": "timeout_after_send", "reset": "connection_reset"}
_RETRYABLE_CLASSES = frozenset({TRANSIENT, INVALID_ARGUMENTS, AUTHENTICATION})


def provably_not_sent(facts: Facts) -> bool:
    """docs/design/classification.md: nothing reached the provider, so nothing can have been executed."""
    kind = facts.error.kind if facts.error else None
    return (
        facts.connection_opened is False
        or kind in NOT_SENT_KINDS
        or (facts.sent is False and not facts.provider_request_id)
    )


def _is_2xx(status: int | None) -> bool:
    return status is not None and 200 <= status <= 299


def _reply_unusable(facts: Facts) -> bool:
    """Row 8's transport half: an error kind after sending (read_timeout, reset, invalid_response, ...), or an
    error with `sent` unknown. Either outweighs a 2xx status: the reply could not be relied on."""
    return facts.error is not None and (facts.error.kind is not None or facts.sent is None)


def _stage(facts: Facts, not_sent: bool) -> str:
    if not_sent:
        return BEFORE_SEND
    return AFTER_RESPONSE if facts.http_status is not None else DURING_SEND


@dataclass(frozen=True)
class _Row:
    """What the matching row says, before the Failure is assembled."""

    row: str  # "1".."11", "4b", "refusal", "hard_stop"
    state: str
    phase: str
    side_effect: str
    error: str
    failure_class: str | None  # None: COMMITTED or ACCEPTED
    field_errors: tuple[FieldError, ...] = ()
    retry_after_ms: int | None = None
    authorization_required: bool = False
    hard_stop: str = ""


def classify(facts: Facts, tool: ToolPolicy, ctx: ClassifyContext) -> Outcome:
    """The docs/design/classification.md row an attempt's outcome falls in, the state it leads to (before budgets) and
    its Failure."""
    if facts.http_status is None and facts.error is None:
        raise ValueError("an outcome needs an http_status or an error")
    facts = with_reply_code(facts, tool.error_code_paths)
    ref = provider_ref(tool, facts)
    not_sent = provably_not_sent(facts)
    now = ctx.now or facts.finished_at
    matched = _hard_stop(facts, tool, ctx, ref, not_sent) if tool.is_write else None
    if matched is None:
        matched = _table(facts, tool, ctx, not_sent, now)
    return Outcome(
        row=matched.row,
        state=matched.state,
        phase=matched.phase,
        stage=_stage(facts, not_sent),
        side_effect=matched.side_effect,
        error=matched.error,
        failure=_failure(matched, facts, tool, ctx, not_sent),
        hard_stop=matched.hard_stop,
        provider_ref=ref,
        error_code=facts.error.code if facts.error else None,
    )


def _hard_stop(facts: Facts, tool: ToolPolicy, ctx: ClassifyContext, ref: str, not_sent: bool) -> _Row | None:
    code = facts.error.code if facts.error else None
    clean_2xx = _is_2xx(facts.http_status) and not _reply_unusable(facts) and not not_sent
    if clean_2xx and facts.http_status != 202 and not ref:
        reason, failure_class = MISSING_PROVIDER_REF, INVALID_RESULT
    elif facts.echoed_idempotency_key and facts.echoed_idempotency_key != ctx.idempotency_key:
        reason, failure_class = IDEMPOTENCY_KEY_MISMATCH, OUTCOME_UNKNOWN
    elif code is not None and code in tool.idempotency_conflict_codes:
        reason, failure_class = IDEMPOTENCY_CONFLICT, OUTCOME_UNKNOWN
    elif (
        facts.credential_scopes is not None
        and ctx.previous_scopes is not None
        and set(facts.credential_scopes) != set(ctx.previous_scopes)
    ):
        reason, failure_class = CREDENTIAL_SCOPE_CHANGED, AUTHORIZATION
    else:
        return None
    # A changed credential is a reason to stop even when nothing was sent; then the effect is known not to exist.
    phase, side_effect = (DISPATCH, NOT_SENT) if not_sent else (COMMIT_UNKNOWN, EFFECT_UNKNOWN)
    field_errors: tuple[FieldError, ...] = ()
    if reason == MISSING_PROVIDER_REF:
        field = f"result.{tool.provider_ref_field}" if tool.provider_ref_field else "provider_request_id"
        suggestion = "A person must confirm the effect with the provider."
        field_errors = (FieldError(field=field, expected="present", received=None, suggestion=suggestion),)
    return _Row(
        "hard_stop",
        HUMAN_REVIEW,
        phase,
        side_effect,
        reason,
        failure_class,
        field_errors=field_errors,
        hard_stop=reason,
    )


def _table(facts: Facts, tool: ToolPolicy, ctx: ClassifyContext, not_sent: bool, now: datetime | None) -> _Row:
    """The table's rows in order: not sent (1, 2), a status that says it was not executed (3 to 7), a reply that proves
    nothing (8), then a 2xx (9 to 11)."""
    if not_sent:
        kind = facts.error.kind if facts.error else None
        if kind == "client_exception":
            return _Row("1", FAILED_PERMANENT, DISPATCH, NOT_SENT, "client_exception_before_send", UNRECOVERABLE)
        return _Row("2", RETRYABLE, DISPATCH, NOT_SENT, "failed_before_connecting", TRANSIENT)
    return _not_executed_row(facts, tool, ctx) or _sent_row(facts, tool, ctx, now)


def _not_executed_row(facts: Facts, tool: ToolPolicy, ctx: ClassifyContext) -> _Row | None:
    """Rows 3 to 7: the provider answered that it did not execute the call (a refusal code before rows 4 and 4b)."""
    status = facts.http_status
    if status in (429, 503):
        label = "rate_limited" if status == 429 else "unavailable"
        return _Row("3", RETRYABLE, DISPATCH, NOT_EXECUTED, label, TRANSIENT, retry_after_ms=facts.retry_after_ms)
    if status is None or not 400 <= status <= 499:
        return None
    code = facts.error.code if facts.error else None
    if code and code in tool.refusal_codes:
        return _Row("refusal", FAILED_PERMANENT, DISPATCH, NOT_EXECUTED, "refused", UNRECOVERABLE)
    if status in (400, 404, 422):
        errors = validate_args(tool.args_schema, ctx.arguments)
        return _Row("4", RETRYABLE, DISPATCH, NOT_EXECUTED, "invalid_arguments", INVALID_ARGUMENTS, field_errors=errors)
    if status == 409:
        if tool.is_write:
            return _Row("4b", UNKNOWN, COMMIT_UNKNOWN, EFFECT_UNKNOWN, "conflict", OUTCOME_UNKNOWN)
        errors = validate_args(tool.args_schema, ctx.arguments)
        return _Row("4b", RETRYABLE, DISPATCH, NOT_EXECUTED, "conflict", INVALID_ARGUMENTS, field_errors=errors)
    if status == 401:
        return _Row("5", RETRYABLE, DISPATCH, NOT_EXECUTED, "unauthenticated", AUTHENTICATION)
    if status == 403:
        approvable = bool(code and code in tool.approvable_codes)
        state = HUMAN_REVIEW if approvable else FAILED_PERMANENT
        return _Row("6", state, DISPATCH, NOT_EXECUTED, "forbidden", AUTHORIZATION, authorization_required=approvable)
    return _Row("7", FAILED_PERMANENT, DISPATCH, NOT_EXECUTED, "rejected", UNRECOVERABLE)


def _sent_row(facts: Facts, tool: ToolPolicy, ctx: ClassifyContext, now: datetime | None) -> _Row:
    """Rows 8 to 11: the call was sent and no status refused it."""
    write = tool.is_write
    status = facts.http_status
    if _reply_unusable(facts) or not _is_2xx(status):
        # 5xx, a transport error after sending, sent unknown with an error, 1xx/3xx: the reply proves nothing
        label = _row8_label(status, facts.error.kind if facts.error else None)
        if write:
            return _Row("8", UNKNOWN, COMMIT_UNKNOWN, EFFECT_UNKNOWN, label, OUTCOME_UNKNOWN)
        return _Row("8", RETRYABLE, DISPATCH, NONE, label, TRANSIENT)
    if status == 202 and write:
        return _Row("9", ACCEPTED, COMMIT_UNKNOWN, EFFECT_UNKNOWN, "accepted", None)
    problems = validate_result(tool, facts.result, arguments=ctx.arguments, now=now)
    if not problems:
        return _Row("10", COMMITTED, POSTCHECK, EXECUTED if write else NONE, "committed", None)
    if write:
        return _Row(
            "11", UNKNOWN, COMMIT_UNKNOWN, EFFECT_UNKNOWN, "invalid_result", INVALID_RESULT, field_errors=problems
        )
    return _Row("11", RETRYABLE, POSTCHECK, NONE_CONFIRMED, "invalid_result", INVALID_RESULT, field_errors=problems)


def _row8_label(status: int | None, kind: str | None) -> str:
    if status is not None and 500 <= status <= 599:
        return "server_error"
    if kind in _SENT_ERROR_LABELS:
        return _SENT_ERROR_LABELS[kind]
    if kind == "invalid_response":
        return "invalid_response"
    if status is not None and not _is_2xx(status):
        return "unexpected_status"
    if kind == "client_exception":
        return "client_exception_after_send"
    return "send_state_unknown"


def _failure(row: _Row, facts: Facts, tool: ToolPolicy, ctx: ClassifyContext, not_sent: bool) -> Failure | None:
    if row.failure_class is None:
        return None
    write = tool.is_write
    retryable = row.failure_class in _RETRYABLE_CLASSES or (row.failure_class == INVALID_RESULT and not write)
    if row.hard_stop:
        retryable = False
        message = hard_stop_message(tool, row.hard_stop)
    else:
        message = public_message(
            row.failure_class,
            tool=tool,
            field_errors=row.field_errors,
            retry_after_ms=row.retry_after_ms,
            approvable=row.authorization_required,
        )
    field_errors = row.field_errors
    if row.failure_class == INVALID_RESULT:
        # docs/design/decisions.md: an invalid result is a rejected observation, not a fact: its values are not handed
        # back to the model (operators see them, redacted, in the Diagnostic).
        field_errors = tuple(
            FieldError(field=e.field, expected=e.expected, received=None, suggestion=e.suggestion) for e in field_errors
        )
    return Failure(
        tool=tool.name,
        call_id=ctx.call_id,
        attempt_id=ctx.attempt_id,
        failure_class=row.failure_class,
        phase=row.phase,
        stage=_stage(facts, not_sent),
        retryable=retryable,
        replay_safe=not_sent or not write or (tool.replay_safe and tool.retry_path != UNSAFE),
        retry_after_ms=row.retry_after_ms,
        public_message=message,
        field_errors=field_errors,
        authorization_required=row.authorization_required,
        external_state_verified=row.row in ("1", "2", "4"),
    )


def preflight_failure(tool: ToolPolicy, *, call_id: str, field_errors: tuple[FieldError, ...]) -> Failure:
    """The failure of a call whose arguments failed our own preflight when it was added (seed 001's first example):
    the same object an attempt's failure is, phase `preflight`, nothing sent. Not retryable as it stands: the
    arguments must be repaired first (the decision's `required_next` is `repair_args`)."""
    return Failure(
        tool=tool.name,
        call_id=call_id,
        attempt_id="",
        failure_class=INVALID_ARGUMENTS,
        phase=PREFLIGHT,
        stage=BEFORE_SEND,
        retryable=False,
        replay_safe=True,
        retry_after_ms=None,
        public_message=public_message(INVALID_ARGUMENTS, tool=tool, field_errors=field_errors),
        field_errors=field_errors,
        external_state_verified=True,
    )


# An outcome that proves the dependency answered: COMMITTED (docs/design/classification.md row 10) or ACCEPTED (row 9).
_SUCCESSES = frozenset({S.COMMITTED, S.ACCEPTED, "9", "10"})


def counts_as_failure(outcome_row: str | None, failure_class: str | None, http_status: int | None) -> bool | None:
    """True: counts as a failure; False: counts as a success; None: not counted at all.

    Only what says something about the dependency's health counts: transient, outcome_unknown and any 5xx; the
    caller's own mistakes (invalid arguments, credentials, a permanent 4xx) never do, so a misbehaving agent cannot
    open a breaker for everyone else. `outcome_row` is the Outcome's state (COMMITTED, ACCEPTED, ...) or its
    docs/design/classification.md row ("9", "10", ...): either names a success.
    """
    if http_status is not None and 500 <= http_status <= 599:
        return True
    if outcome_row in _SUCCESSES:
        return False
    if failure_class in (TRANSIENT, OUTCOME_UNKNOWN):
        return True
    return None

"""Admission: the change-before-retry gate of docs/design/gate.md. Every attempt passes its checks in this order, the
first that fails answering (the breaker last, so a denied attempt never uses up a half-open probe):

    state -> preflight -> dependencies -> budgets -> evidence -> key_retention -> retry_path -> breaker
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from recovery.engine.budgets import exhausted_limit, tighter
from recovery.engine.canonical import canonical_json
from recovery.engine.fingerprint import fingerprint
from recovery.engine.keys import key_expired
from recovery.engine.messages import public_message
from recovery.engine.states import UNSETTLED
from recovery.engine.states import CallState as S
from recovery.engine.types import (
    APPROVAL_GRANTED,
    ARGS_CHANGED,
    AUTHENTICATION,
    AUTHORIZATION,
    CAPABILITY_MISSING,
    CREDENTIAL_REFRESHED,
    FORCED_OPEN,
    HALF_OPEN,
    INVALID_ARGUMENTS,
    INVALID_RESULT,
    OPEN,
    OUTCOME_UNKNOWN,
    REPLAY_MARGIN_S,
    REPLAY_RECONCILE,
    SAFE,
    STATE_VERIFIED,
    TIME_ELAPSED,
    TOOL_CHANGED,
    TRANSIENT,
    UNPROBED,
    UNRECOVERABLE,
    UNSAFE,
    WRITE,
    Budgets,
    CallView,
    Candidate,
    Check,
    FieldError,
    GateContext,
    GateDecision,
    PreviousAttempt,
    RequiredNext,
    ToolPolicy,
)
from recovery.engine.validation import ARGUMENTS_ROOT, validate_args

READY, SENT, RETRYABLE, ACCEPTED = S.READY, S.SENT, S.RETRYABLE, S.ACCEPTED
UNKNOWN, STILL_UNKNOWN, NOT_COMMITTED, COMMITTED = S.UNKNOWN, S.STILL_UNKNOWN, S.NOT_COMMITTED, S.COMMITTED
FAILED_PERMANENT, HUMAN_REVIEW = S.FAILED_PERMANENT, S.HUMAN_REVIEW
# A dependency in one of these may still commit by itself: wait instead of replanning.
_SETTLING = frozenset({UNKNOWN, STILL_UNKNOWN, ACCEPTED, SENT})

# Outcome.side_effect values that prove the previous attempt executed nothing (docs/design/idempotency.md: our
# preflight, a provider validation rejection, a request that never left).
NOTHING_EXECUTED = frozenset({"not_sent", "not_executed"})

_STEPS = ("state", "preflight", "dependencies", "budgets", "evidence", "key_retention", "retry_path", "breaker")

# What the runtime sees: fixed text per reason, never provider text or anything the runtime sent.
MESSAGES = {
    "first_attempt": "Admitted: make the first attempt now.",
    "admitted": "Admitted: make the attempt now, with the same idempotency key.",
    "outcome_unknown": "The previous attempt may have taken effect. Its status is being checked; do not repeat it.",
    "human_review": "This call is waiting for a person's review; it can be attempted again only once approved.",
    "committed": "This call has already taken effect; it is never attempted again.",
    "in_flight": "An attempt of this call is in flight; report its outcome before making another.",
    "in_progress": "The provider is still processing this call; wait for its status instead of repeating it.",
    "not_committed": "The provider confirmed this call did not take effect; wait until it is retryable again.",
    "state_final": "This call is finished and will not be attempted again.",
    "tool_not_allowed": "That tool is not an accepted alternate for this call; plan another step instead.",
    "preflight": "The arguments do not match the tool's schema; repair the listed fields and try again.",
    "blocked_by_dependency": "A step this call depends on has not committed yet.",
    "budget_exhausted:max_attempts": "This call has used all its attempts; do not repeat it.",
    "budget_exhausted:max_rounds": "This task has used all its rounds; stop and report what is done.",
    "budget_exhausted:deadline": "The task's deadline leaves no time for another attempt; stop and report.",
    "budget_exhausted:token_budget": "This task has used its token budget; stop and report what is done.",
    "budget_exhausted:write_retry": "This task has used all its write retries; do not repeat the write.",
    "compensation_in_progress": "A step of this task is being undone; its other writes wait until that is settled.",
    "unknown_budget": "Too many of this task's outcomes are still unknown; writes wait until they are settled.",
    "args_locked": "The previous attempt may have taken effect, so this call's arguments cannot change; "
    "plan a new call instead.",
    "no_new_evidence": "Nothing has changed since the last attempt; a new attempt needs new evidence.",
    "key_expired": "The provider no longer remembers this call's idempotency key; a replay would be a new "
    "operation and needs a person's approval.",
    "breaker_open": "This tool is failing and temporarily blocked; use the fallback instead of retrying.",
    "retry_path_unsafe": "This provider was seen to ignore idempotency keys: a same-key replay could repeat the "
    "effect, so it is not made. A person settles this call.",
    "retry_path_unprobed": "No duplicate probe has proved that this provider deduplicates by key: reconciliation "
    "does not replay it.",
    "replay_key_too_old": "This call's key is older than a replay may rely on: reconciliation does not replay it.",
    "approval_required": "This tool's calls wait for a person's approval: the call is held until a reviewer and an "
    "approver agree, then executed once.",
}


@dataclass(frozen=True, kw_only=True)
class _Step:
    check: Check
    reason: str = ""  # the denial's code; empty when the check passed
    required_next: RequiredNext | None = None
    field_errors: tuple[FieldError, ...] = ()
    evidence_used: str = ""
    uses_probe: bool = False


def _pass(name: str, detail: str, **kw) -> _Step:
    return _Step(check=Check(name=name, passed=True, detail=detail), **kw)


def _deny(
    name: str, reason: str, detail: str, action: str, *, after_ms: int = 0, info: dict | None = None, **kw
) -> _Step:
    required = RequiredNext(action=action, after_ms=max(0, after_ms), detail=info or {})
    return _Step(check=Check(name=name, passed=False, detail=detail), reason=reason, required_next=required, **kw)


def _public_message(step: _Step, context: GateContext) -> str:
    if step.field_errors:  # name the fields and what they must be, from the schema's templates
        tool = context.candidate_tool or context.tool
        return public_message(INVALID_ARGUMENTS, tool=tool, field_errors=step.field_errors)
    return MESSAGES[step.reason]


def admit(call: CallView, candidate: Candidate, context: GateContext) -> GateDecision:
    """Admit or deny one attempt of `call` (docs/design/gate.md). The answer is unsaved: the caller stores it either
    way."""
    checks: list[Check] = []
    evidence_used, uses_probe = "", False
    for name in _STEPS:
        step = _CHECKS[name](call, candidate, context)
        checks.append(step.check)
        if step.reason:
            return GateDecision(
                allowed=False,
                reason=step.reason,
                checks=tuple(checks),
                required_next=step.required_next,
                public_message=_public_message(step, context),
                field_errors=step.field_errors,
            )
        evidence_used = evidence_used or step.evidence_used
        uses_probe = uses_probe or step.uses_probe
    reason = "first_attempt" if call.state == READY else "admitted"
    return GateDecision(
        allowed=True,
        reason=reason,
        evidence_used=evidence_used,
        checks=tuple(checks),
        public_message=MESSAGES[reason],
        uses_probe=uses_probe,
    )


def duplicate_intent(*, side_effect: str, fingerprint: str, existing: Iterable[tuple[str, str, str]]) -> str | None:
    """The id of a call of the same task that already carries this write intent, or None (docs/design/gate.md).

    `existing` holds (call id, fingerprint, state) for the task's other calls. A FAILED_PERMANENT original does not
    block a new call; reads never conflict. The caller answers "same key, same arguments" with the existing call
    before asking this, so a fresh idempotency key cannot launder a blind replay.
    """
    if side_effect != WRITE:
        return None
    for call_id, other, state in existing:
        if other == fingerprint and state != FAILED_PERMANENT:
            return call_id
    return None


# --- the checks, in order ------------------------------------------------------------------------------------------


def _executing_tool(candidate: Candidate, context: GateContext) -> ToolPolicy | None:
    """The registry entry the candidate will run: the call's tool, or an accepted alternate with its policy."""
    if candidate.tool == context.tool.name:
        return context.tool
    alternate = context.candidate_tool
    if candidate.tool in context.tool.alternates and alternate is not None and alternate.name == candidate.tool:
        return alternate
    return None


def _is_write(context: GateContext) -> bool:
    return context.tool.is_write or (context.candidate_tool is not None and context.candidate_tool.is_write)


# States that admit an attempt whatever it claims (new evidence is the evidence check's business), and those that
# deny every attempt: (reason, detail, required_next action).
_STATE_PASSES = {READY: "READY: first attempt, no evidence needed", RETRYABLE: "RETRYABLE: needs new evidence"}
_STATE_DENIALS = {
    COMMITTED: ("committed", "COMMITTED: never admitted again", "stop"),
    SENT: ("in_flight", "SENT: an attempt is in flight", "wait_for_reconcile"),
    ACCEPTED: ("in_progress", "ACCEPTED: the provider is processing it", "wait_for_reconcile"),
    NOT_COMMITTED: ("not_committed", "NOT_COMMITTED: becomes RETRYABLE first", "wait_for_reconcile"),
}


def _check_state(call: CallView, candidate: Candidate, context: GateContext) -> _Step:
    state = call.state
    if state in _STATE_PASSES:
        return _pass("state", _STATE_PASSES[state])
    if state in UNSETTLED:
        if context.approval_available:
            return _pass("state", f"{state}: an approved same-key replay")
        if REPLAY_RECONCILE in candidate.evidence and context.status_unavailable:
            return _pass("state", f"{state}: replay reconciliation, the status query cannot answer")
        return _deny("state", "outcome_unknown", f"{state}: only an approved replay", "wait_for_reconcile")
    if state == HUMAN_REVIEW:
        if context.approval_available:
            return _pass("state", "HUMAN_REVIEW: approval granted")
        return _deny("state", "human_review", "HUMAN_REVIEW: needs an approval", "request_approval")
    if state in _STATE_DENIALS:
        return _deny("state", *_STATE_DENIALS[state])
    # FAILED_PERMANENT may be replaced by a new call (duplicate intent allows it); compensation states may not.
    action = "replan" if state == FAILED_PERMANENT else "stop"
    return _deny("state", "state_final", f"{state}: no further attempt", action)


def _check_preflight(call: CallView, candidate: Candidate, context: GateContext) -> _Step:
    tool = _executing_tool(candidate, context)
    if tool is None:
        info = {"alternates": sorted(context.tool.alternates)}
        return _deny(
            "preflight", "tool_not_allowed", "not the call's tool nor an accepted alternate", "replan", info=info
        )
    try:
        canonical_json(candidate.arguments)
    except ValueError:
        error = FieldError(
            field=ARGUMENTS_ROOT,
            expected="a JSON object",
            received=type(candidate.arguments).__name__,
            suggestion="Send plain JSON values: no NaN or infinities.",
        )
        return _deny("preflight", "preflight", "arguments are not JSON", "repair_args", field_errors=(error,))
    if not isinstance(candidate.arguments, dict):
        error = FieldError(
            field=ARGUMENTS_ROOT,
            expected="a JSON object",
            received=type(candidate.arguments).__name__,
            suggestion="Send the arguments as one JSON object.",
        )
        return _deny("preflight", "preflight", "arguments are not an object", "repair_args", field_errors=(error,))
    errors = tuple(validate_args(tool.args_schema, candidate.arguments))
    if errors:
        detail = f"{len(errors)} field error(s) against {tool.name}'s schema"
        return _deny("preflight", "preflight", detail, "repair_args", field_errors=errors)
    return _pass("preflight", f"arguments match {tool.name}'s schema")


def _check_dependencies(call: CallView, candidate: Candidate, context: GateContext) -> _Step:
    blocking = {call_id: state for call_id, state in context.dependencies.items() if state != COMMITTED}
    if not blocking:
        return _pass("dependencies", f"{len(context.dependencies)} dependencies committed")
    blocked_by = sorted(blocking)
    action = "wait_for_reconcile" if any(s in _SETTLING for s in blocking.values()) else "replan"
    detail = "waiting on " + ", ".join(f"{c} ({blocking[c]})" for c in blocked_by)
    return _deny("dependencies", "blocked_by_dependency", detail, action, info={"blocked_by": blocked_by})


def _check_budgets(call: CallView, candidate: Candidate, context: GateContext) -> _Step:
    task = context.task
    scopes = [context.tool.budgets, task.budgets, Budgets(max_attempts=call.max_attempts)]
    if context.candidate_tool is not None and candidate.tool != context.tool.name:
        scopes.append(context.candidate_tool.budgets)
    budgets = tighter(*scopes)
    is_write = _is_write(context)
    limit = exhausted_limit(
        budgets=budgets,
        attempts_made=call.attempts_made,
        rounds_used=task.rounds_used,
        tokens_used=task.tokens_used,
        is_write=is_write,
        write_retries_used=task.write_retries_used,
        now=context.now,
        call_estimate_ms=context.call_estimate_ms,
    )
    if limit:
        info = {"limit": limit}
        return _deny("budgets", f"budget_exhausted:{limit}", f"{limit} exhausted", "stop", info=info)
    if is_write and task.compensating:
        detail = f"{task.compensating} call(s) of the task are being compensated: its other writes wait"
        return _deny(
            "budgets", "compensation_in_progress", detail, "wait_for_reconcile", info={"limit": "compensation"}
        )
    if is_write:
        blocked = _unknown_budget_exceeded(call, context)
        if blocked:
            return _deny("budgets", "unknown_budget", blocked, "wait_for_reconcile", info={"limit": "unknown_budget"})
    return _pass("budgets", "budget left for one more attempt")


def _unknown_budget_exceeded(call: CallView, context: GateContext) -> str:
    """Why the task's writes are held back by unsettled UNKNOWN outcomes, or "" when they are not.

    The call's own unsettled outcome is not held against it: otherwise an approved same-key replay of an UNKNOWN
    call could never be admitted under a budget of 0, and the approval would be worthless.
    """
    task = context.task
    own = 1 if call.state in UNSETTLED else 0
    task_limit = task.budgets.unknown_budget
    if task_limit is not None and task.unsettled_unknowns - own > task_limit:
        return f"{task.unsettled_unknowns - own} unsettled unknown(s) in the task, tolerates {task_limit}"
    limits = dict(task.unknown_budget_by_tool)
    for tool in (context.tool, context.candidate_tool):
        if tool is not None:
            limits.setdefault(tool.name, tool.budgets.unknown_budget)
    for name, count in sorted(task.unsettled_by_tool.items()):
        tool_limit = limits.get(name)
        unsettled = count - (own if name == context.tool.name else 0)
        if tool_limit is not None and unsettled > tool_limit:
            return f"{unsettled} unsettled unknown(s) of {name}, tolerates {tool_limit}"
    return ""


def _effect_may_exist(previous: PreviousAttempt, is_write: bool) -> bool:
    """Whether a write's previous attempt may have taken effect (a transient failure of a write was never sent)."""
    if not is_write:
        return False
    return previous.failure_class != TRANSIENT and previous.side_effect not in NOTHING_EXECUTED


def _check_evidence(call: CallView, candidate: Candidate, context: GateContext) -> _Step:
    if call.state == READY:
        return _first_attempt(candidate, context)
    previous = context.previous
    is_write = _is_write(context)
    # docs/design/idempotency.md: once an effect may exist the key is bound to its arguments (and tool); a change is a
    # new intent.
    changed = previous is not None and fingerprint(candidate.tool, candidate.arguments) != previous.fingerprint
    if changed and _effect_may_exist(previous, is_write):
        return _deny("evidence", "args_locked", "arguments or tool changed after a possible effect", "replan")
    acceptable = _acceptable(call, previous, context, is_write)
    for kind in dict.fromkeys(candidate.evidence):
        if kind in acceptable and _holds(kind, candidate, previous, context):
            return _pass("evidence", f"{kind} holds", evidence_used=kind)
    claimed = ", ".join(k for k in candidate.evidence if k in acceptable) or "none acceptable"
    action, after_ms = _next_without_evidence(call, previous, context, is_write)
    info = {"evidence": list(acceptable)}
    return _deny("evidence", "no_new_evidence", f"claimed: {claimed}", action, after_ms=after_ms, info=info)


def _first_attempt(candidate: Candidate, context: GateContext) -> _Step:
    """A first attempt needs no evidence, unless the registry holds the tool's calls for an approval
    (docs/mcp-gateway.md, "Approval holds"): then only an approved hold admits it, once; the call stays READY."""
    if not context.tool.approval_required:
        return _pass("evidence", "first attempt: no evidence needed")
    if APPROVAL_GRANTED in candidate.evidence and context.approval_available:
        return _pass("evidence", "approval_granted holds: the held call was approved", evidence_used=APPROVAL_GRANTED)
    detail = "the registry requires an approval before this tool's first attempt"
    return _deny("evidence", "approval_required", detail, "request_approval", info={"evidence": [APPROVAL_GRANTED]})


def _acceptable(
    call: CallView, previous: PreviousAttempt | None, context: GateContext, is_write: bool
) -> tuple[str, ...]:
    """The evidence kinds that can admit this attempt at all, most useful first."""
    if call.state in UNSETTLED:
        return (APPROVAL_GRANTED, REPLAY_RECONCILE) if context.status_unavailable else (APPROVAL_GRANTED,)
    if call.state == HUMAN_REVIEW or previous is None:
        return (APPROVAL_GRANTED,)
    if previous.failure_class == OUTCOME_UNKNOWN or _effect_may_exist(previous, is_write):
        return (STATE_VERIFIED, APPROVAL_GRANTED)
    by_class = {
        TRANSIENT: (TIME_ELAPSED, TOOL_CHANGED, ARGS_CHANGED, CREDENTIAL_REFRESHED),
        INVALID_ARGUMENTS: (ARGS_CHANGED, TOOL_CHANGED),
        AUTHENTICATION: (CREDENTIAL_REFRESHED,),
        AUTHORIZATION: (APPROVAL_GRANTED, CREDENTIAL_REFRESHED),
        CAPABILITY_MISSING: (TOOL_CHANGED,),
        INVALID_RESULT: (TIME_ELAPSED, ARGS_CHANGED, TOOL_CHANGED),
    }
    kinds = by_class.get(previous.failure_class, ())
    rest = (ARGS_CHANGED, CREDENTIAL_REFRESHED, TOOL_CHANGED, STATE_VERIFIED, APPROVAL_GRANTED)
    ordered = tuple(dict.fromkeys(kinds + rest))
    if not context.tool.alternates:
        ordered = tuple(k for k in ordered if k != TOOL_CHANGED)
    return ordered


def _holds(kind: str, candidate: Candidate, previous: PreviousAttempt | None, context: GateContext) -> bool:
    if kind == APPROVAL_GRANTED:
        return context.approval_available
    if kind == REPLAY_RECONCILE:
        return context.status_unavailable
    if previous is None:
        return False
    if kind == TIME_ELAPSED:
        return _time_elapsed(previous, context)
    if kind == ARGS_CHANGED:
        changed = fingerprint(previous.tool, candidate.arguments) != previous.fingerprint
        return changed and previous.side_effect in NOTHING_EXECUTED
    if kind == CREDENTIAL_REFRESHED:
        new, old = candidate.credential_version, previous.credential_version
        return new is not None and old is not None and new > old
    if kind == TOOL_CHANGED:
        switched = candidate.tool != previous.tool and candidate.tool in context.tool.alternates
        return switched and previous.side_effect in NOTHING_EXECUTED
    if kind == STATE_VERIFIED:
        at, finished = context.latest_receipt_at, previous.finished_at
        fresh = at is not None and finished is not None and at > finished
        return context.latest_receipt == "not_committed" and fresh
    return False


def _waits_on_time(previous: PreviousAttempt, context: GateContext) -> bool:
    """Whether time alone can justify a new attempt: a transient failure, or a read's invalid (e.g. stale) result.

    This is the no-progress guard: after any other failure the same fingerprint never passes on time_elapsed.
    """
    if previous.failure_class == TRANSIENT:
        return True
    return previous.failure_class == INVALID_RESULT and not _is_write(context)


def _time_elapsed(previous: PreviousAttempt, context: GateContext) -> bool:
    if not _waits_on_time(previous, context) or previous.finished_at is None:
        return False
    return context.now >= previous.finished_at + timedelta(milliseconds=previous.wait_ms)


def _next_without_evidence(
    call: CallView, previous: PreviousAttempt | None, context: GateContext, is_write: bool
) -> tuple[str, int]:
    """What would help after a denial for lack of evidence, and how long until it may: (action, after_ms)."""
    if call.state == HUMAN_REVIEW:
        return "request_approval", 0
    if call.state in UNSETTLED or previous is None:
        return "wait_for_reconcile", 0
    if previous.failure_class == OUTCOME_UNKNOWN or _effect_may_exist(previous, is_write):
        return "wait_for_reconcile", 0
    if _waits_on_time(previous, context) and previous.finished_at is not None:
        due = previous.finished_at + timedelta(milliseconds=previous.wait_ms)
        return "retry_after", max(0, int((due - context.now) / timedelta(milliseconds=1)))
    actions = {
        INVALID_ARGUMENTS: "repair_args",
        AUTHENTICATION: "refresh_credentials",
        AUTHORIZATION: "request_approval",
        CAPABILITY_MISSING: "replan",
        UNRECOVERABLE: "stop",
    }
    return actions.get(previous.failure_class, "replan"), 0


def _check_key_retention(call: CallView, candidate: Candidate, context: GateContext) -> _Step:
    if not _is_write(context) or call.first_sent_at is None:
        return _pass("key_retention", "no idempotency key replayed")
    age_s = (context.now - call.first_sent_at).total_seconds()
    retention = context.tool.key_retention_s
    if key_expired(call.first_sent_at, retention, context.now):
        info = {"key_age_s": int(age_s), "key_retention_s": retention}
        detail = f"key first sent {int(age_s)} s ago, provider keeps it {retention} s"
        return _deny("key_retention", "key_expired", detail, "request_approval", info=info)
    return _pass("key_retention", f"key kept by the provider for {int(retention - age_s)} s more")


def _is_replay(call: CallView, context: GateContext) -> bool:
    """Whether this attempt replays a write's key after a request that may have taken effect (docs/replay.md): an
    unsettled or reviewed call, or a retry after anything but a provably unsent or rejected-before-storing one."""
    if not _is_write(context) or call.first_sent_at is None:
        return False
    if call.state in UNSETTLED or call.state == HUMAN_REVIEW:
        return True
    previous = context.previous
    return previous is not None and (previous.failure_class == OUTCOME_UNKNOWN or _effect_may_exist(previous, True))


def _check_retry_path(call: CallView, candidate: Candidate, context: GateContext) -> _Step:
    tool = context.tool
    reconciling = REPLAY_RECONCILE in candidate.evidence and call.state in UNSETTLED
    if not reconciling and not _is_replay(call, context):
        return _pass("retry_path", "not a replay of a request that may have taken effect")
    info = {"retry_path": tool.retry_path}
    if tool.retry_path == UNSAFE:
        detail = f"{tool.name}: a duplicate probe found its retry path unsafe; no same-key replay"
        then = "wait_for_reconcile" if call.state in UNSETTLED else "stop"
        return _deny("retry_path", "retry_path_unsafe", detail, then, info=info)
    if not reconciling:
        return _pass("retry_path", f"retry path {tool.retry_path}: a replay a person or the runtime vouches for")
    if tool.retry_path != SAFE or not tool.replay_safe:
        why = "no duplicate probe has proved it" if tool.retry_path == UNPROBED else "the tool is not replay-safe"
        code = "retry_path_unprobed" if tool.retry_path == UNPROBED else "retry_path_unsafe"
        detail = f"{tool.name}: replay reconciliation refused, {why}"
        return _deny("retry_path", code, detail, "wait_for_reconcile", info=info)
    age_s = int((context.now - call.first_sent_at).total_seconds())
    covered = tool.retry_path_key_age_s or 0
    limit = min(tool.key_retention_s - REPLAY_MARGIN_S, max(covered, 0))
    if age_s >= limit:
        detail = (
            f"key {age_s} s old: replay reconciliation only below {limit} s (retention {tool.key_retention_s} s "
            f"minus {REPLAY_MARGIN_S} s, and the {covered} s the probe covered)"
        )
        info.update(key_age_s=age_s, limit_s=limit)
        return _deny("retry_path", "replay_key_too_old", detail, "wait_for_reconcile", info=info)
    return _pass("retry_path", f"retry path safe: a probe covered keys up to {covered} s, this one is {age_s} s old")


def _check_breaker(call: CallView, candidate: Candidate, context: GateContext) -> _Step:
    breaker = context.breaker
    info = {"fallback": context.tool.fallback, "breaker": breaker.state}
    if breaker.state == FORCED_OPEN:
        # The same reason code as an open breaker (a runtime degrades either way); the detail says it is an
        # operator's doing, so nobody waits for a cooldown that never comes.
        who = f": {breaker.forced_by}" if breaker.forced_by else ""
        why = f", {breaker.forced_reason}" if breaker.forced_reason else ""
        detail = f"breaker forced_open by an operator{who}{why}; only an operator's reset closes it"
        return _deny("breaker", "breaker_open", detail, "degrade", info=info | {"forced_open": True})
    if breaker.state == OPEN:
        return _deny("breaker", "breaker_open", "breaker open", "degrade", after_ms=breaker.retry_in_ms, info=info)
    if breaker.state == HALF_OPEN:
        if breaker.probe_available:
            return _pass("breaker", "half_open: admitted as the probe", uses_probe=True)
        detail = "half_open: the probe is taken"
        return _deny("breaker", "breaker_open", detail, "degrade", after_ms=breaker.retry_in_ms, info=info)
    return _pass("breaker", f"breaker {breaker.state}")


_CHECKS = {
    "state": _check_state,
    "preflight": _check_preflight,
    "dependencies": _check_dependencies,
    "budgets": _check_budgets,
    "evidence": _check_evidence,
    "key_retention": _check_key_retention,
    "retry_path": _check_retry_path,
    "breaker": _check_breaker,
}

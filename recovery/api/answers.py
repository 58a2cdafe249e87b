"""What the machine API answers (docs/api.md), as closed output schemas; each answer is checked against its schema.
A new field goes here with a one-line description, reaching the document, the client's types (recovery_client) and
their test together. The shapes are made once in recovery/services/answers.py and recovery/selectors/tasks_calls.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from recovery.engine.classify import EFFECTS
from recovery.engine.compensation_states import EntryState
from recovery.engine.metrics import FIGURES, HOLD_FIGURES
from recovery.engine.reconcile import Observation
from recovery.engine.states import CallState
from recovery.engine.types import (
    ERROR_KINDS,
    EVIDENCE_KINDS,
    FAILURE_CLASSES,
    PHASES,
    REQUIRED_NEXT_ACTIONS,
    ROUTES,
    STAGES,
)
from recovery.models import BreakerState, ReceiptSource, Risk, SideEffect, TaskOutcome, TaskStatus
from recovery.selectors.metrics import WINDOWS

# --- the vocabularies, closed ---------------------------------------------------------------------------------------

CallStateName = Literal[tuple(s.value for s in CallState)]  # type: ignore[valid-type]
StepStateName = Literal[(*(s.value for s in CallState), "PENDING")]  # type: ignore[valid-type]
FailureClass = Literal[FAILURE_CLASSES]  # type: ignore[valid-type]
Route = Literal[ROUTES]  # type: ignore[valid-type]
NextAction = Literal[REQUIRED_NEXT_ACTIONS]  # type: ignore[valid-type]
Evidence = Literal[EVIDENCE_KINDS]  # type: ignore[valid-type]
ErrorKind = Literal[ERROR_KINDS]  # type: ignore[valid-type]
SideEffectName = Literal[tuple(SideEffect.values)]  # type: ignore[valid-type]
RiskName = Literal[tuple(Risk.values)]  # type: ignore[valid-type]
TaskStatusName = Literal[tuple(TaskStatus.values)]  # type: ignore[valid-type]
TaskOutcomeName = Literal[tuple(TaskOutcome.values)]  # type: ignore[valid-type]
ReceiptSourceName = Literal[tuple(ReceiptSource.values)]  # type: ignore[valid-type]
EntryStateName = Literal[tuple(e.value for e in EntryState)]  # type: ignore[valid-type]
ObservationName = Literal[tuple(o.value for o in Observation)]  # type: ignore[valid-type]
BreakerStateName = Literal[tuple(BreakerState.values)]  # type: ignore[valid-type]
Phase = Literal[PHASES]  # type: ignore[valid-type]
Stage = Literal[STAGES]  # type: ignore[valid-type]
Effect = Literal[EFFECTS]  # type: ignore[valid-type]
FigureKey = Literal[tuple(figure.key for figure in FIGURES + HOLD_FIGURES)]  # type: ignore[valid-type]
FigureKind = Literal[tuple(dict.fromkeys(figure.kind for figure in FIGURES))]  # type: ignore[valid-type]
WindowName = Literal[tuple(WINDOWS)]  # type: ignore[valid-type]

JsonObject = dict[str, Any]


class Answer(BaseModel):
    # An answer's fields are exactly these: one the server makes but the schema lacks is an error, not a silent drop.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _(description: str, **kwargs: Any) -> Any:
    """A required field with its one-line description."""
    return Field(..., description=description, **kwargs)


# --- errors ---------------------------------------------------------------------------------------------------------


class FieldErrorOut(Answer):
    field: str = _("The field, as a dotted path into the request (`budget.deadline`, `outcome.http_status`).")
    expected: str = _("What the field must be.")
    received: Any = Field(
        None,
        description="The value refused, echoed: a scalar or a short list of them, redacted, texts cut at 200 "
        "characters; null for an object or where nothing was received.",
    )
    suggestion: str = _("How to fix it.")


class ErrorBody(Answer):
    code: str = _("A stable, machine-readable code: `invalid_request`, `not_found`, `not_admitted`, ...")
    message: str = _("One sentence for a person.")
    field_errors: list[FieldErrorOut] = Field(default_factory=list, description="One entry per offending field.")
    detail: JsonObject = Field(default_factory=dict, description="Code-specific facts (ids, states, request_id).")


class ErrorOut(Answer):
    """The one error envelope of every 4xx and 5xx answer."""

    error: ErrorBody = _("What went wrong; nothing was stored unless `code` says otherwise.")


# --- the gate (docs/design/gate.md) -----------------------------------------------------------------------------------


class RequiredNextOut(Answer):
    """What a runtime does next, as data rather than prose."""

    action: NextAction = _("The next thing to do: retry_after, repair_args, wait_for_reconcile, stop, ...")
    after_ms: int = _("Wait at least this long before doing it (milliseconds).")
    poll: str = Field("", description="Where to poll for the call's state, when waiting is the action.")
    detail: JsonObject = Field(
        default_factory=dict, description="The action's facts: field_errors to repair, evidence needed, fallback."
    )


class CheckOut(Answer):
    name: str = _("The check: state, preflight, dependencies, budgets, evidence, key_retention, breaker, ...")
    passed: bool = _("Whether this check let the attempt through.")
    detail: str = _("What the check saw.")


class GateOut(Answer):
    """The change-before-retry gate's answer (stored, whether allowed or denied)."""

    id: int | None = _("The stored gate decision's id (null for an answer replayed from an earlier request).")
    allowed: bool = _("Whether the attempt may be sent.")
    reason: str = _("`first_attempt`, `admitted`, or the denial's code (`no_new_evidence`, `budget_exhausted`, ...).")
    evidence_used: str = _("The evidence that justified a new attempt (empty on a first attempt or a denial).")
    checks: list[CheckOut] = _("Every check the gate ran, in order.")
    required_next: RequiredNextOut | None = _("What to do instead, when denied.")
    public_message: str = _("One sentence a model may read.")
    field_errors: list[FieldErrorOut] = _("The fields that made the gate refuse, if any.")


# --- the failure and the decision card (docs/design/classification.md, docs/design/decisions.md) ----------------------


class FailureOut(Answer):
    """The public half of a failure: what a runtime (and a model) may read. Raw error text stays in a diagnostic."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "tool": "refund.create",
                "call_id": "42",
                "attempt_id": "a1",
                "class": "outcome_unknown",
                "phase": "commit_unknown",
                "stage": "during_send",
                "retryable": False,
                "replay_safe": False,
                "retry_after_ms": None,
                "public_message": "The refund may have been made: it is being checked with the provider.",
                "field_errors": [],
                "diagnostic_ref": "diag-7f3a",
                "authorization_required": False,
                "external_state_verified": False,
            }
        }
    )

    tool: str = _("The tool the attempt called.")
    call_id: str = _("The call's id, as text.")
    attempt_id: str = _("The attempt's id, chosen by the runtime.")
    failure_class: FailureClass = Field(
        ...,
        alias="class",
        description="The failure's class (docs/design/classification.md): transient, outcome_unknown, ...",
    )
    phase: Phase = _("Where it failed: preflight, dispatch, commit_unknown or postcheck.")
    stage: Stage = _("The side-effect stage: before_send, during_send or after_response.")
    retryable: bool = _("Whether a new attempt may help (the gate still decides).")
    replay_safe: bool = _("Whether the tool may be re-sent with the same key without a second effect.")
    retry_after_ms: int | None = _("The provider's Retry-After, in milliseconds, if it sent one.")
    public_message: str = _("One sentence a model may read.")
    field_errors: list[FieldErrorOut] = _("The arguments to repair, for invalid_arguments.")
    diagnostic_ref: str = _("The stored diagnostic's reference (for an operator; the raw text is not in the API).")
    authorization_required: bool = _("Whether a person must authorize before anything else is tried.")
    external_state_verified: bool = _("Whether the provider's state was checked before this answer.")


class BudgetViewOut(Answer):
    attempt: int = _("This attempt's number.")
    max_attempts: int | None = _("The call's attempt limit (the tighter of tool and task; null: none).")
    task_rounds: int = _("Rounds the task has used.")
    max_rounds: int | None = _("The task's round limit (null: none).")
    deadline_in_s: float | None = _("Seconds until the task's deadline (negative: past; null: no deadline).")
    tokens_used: int = _("Tokens the task has used.")
    token_budget: int | None = _("The task's token budget (null: none).")


class DecisionOut(Answer):
    """The recovery decision card (docs/design/decisions.md): one per failed or accepted attempt."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "id": 17,
                "route": "reconcile",
                "call_state": "UNKNOWN",
                "outcome": "",
                "error": "timeout_after_send",
                "phase": "commit_unknown",
                "stage": "during_send",
                "side_effect": "unknown",
                "delay_ms": 0,
                "next": ["wait_for_reconcile"],
                "forbidden": ["replay_with_new_key", "retry_before_status_check"],
                "public_message": "The refund may have been made: it is being checked with the provider.",
                "required_next": {"action": "wait_for_reconcile", "after_ms": 0, "poll": "", "detail": {}},
                "budget": {
                    "attempt": 1,
                    "max_attempts": 3,
                    "task_rounds": 1,
                    "max_rounds": 8,
                    "deadline_in_s": 3540.0,
                    "tokens_used": 0,
                    "token_budget": None,
                },
                "fallback": "",
                "breaker_state": "closed",
            }
        }
    )

    id: int | None = Field(None, description="The stored card's id.")
    route: Route = _(
        "The route (docs/design/decisions.md): repair, retry, reauth, replan, reconcile, reject, escalate, degrade, "
        "stop."
    )
    call_state: CallStateName = _("The state the call moved to, budgets applied.")
    outcome: str = _("An explicit end, if any: retry_exhausted, human_review_required, degraded_read_only, or empty.")
    error: str = _("A short label of what happened: timeout_after_send, rate_limited, ...")
    phase: str = _("Where it failed: preflight, dispatch, commit_unknown, postcheck (empty when accepted).")
    stage: str = _("The side-effect stage: before_send, during_send, after_response.")
    side_effect: Effect = _("What is known of the effect: not_sent, not_executed, unknown, executed, none, ...")
    delay_ms: int = _("Wait at least this long before the next attempt (milliseconds).")
    next: list[str] = _("What is allowed next.")
    forbidden: list[str] = _("What is not allowed next (e.g. a new key for the same intent).")
    public_message: str = _("One sentence a model may read.")
    required_next: RequiredNextOut = _("What to do next, as data.")
    budget: BudgetViewOut = _("The budgets as they stood after this attempt.")
    fallback: str = Field("", description="The task's fallback, when the route is degrade.")
    breaker_state: BreakerStateName = Field("closed", description="The tool's breaker after this attempt.")


# --- admission and outcomes (docs/design/gate.md, docs/design/state-machine.md) ---------------------------------------


class OutcomeOut(Answer):
    """The answer to an outcome: the call's state after it and, for a failure, the decision card."""

    call_id: int = _("The call.")
    attempt_id: str = _("The attempt the outcome was for.")
    attempt_number: int = _("Its number among the call's attempts.")
    call_state: CallStateName = _("The call's state after the outcome.")
    policy_bypassed: bool = _("Whether the attempt ran outside the gate (an operator's bypass).")
    failure: FailureOut | None = _("The public failure (null when the attempt succeeded).")
    decision: DecisionOut | None = _("The decision card (null when the attempt committed).")
    breaker_state: BreakerStateName | Literal[""] = _(
        "The tool's breaker state (empty when the outcome was not counted)."
    )
    provider_ref: str = _("The provider's reference for the effect, if known.")
    late: bool = Field(
        False,
        description="Whether it came after the call had moved past the attempt (kept as evidence; a committed write "
        "still settles an unknown call).",
    )
    gate: GateOut | None = Field(
        None, description="A single shot the gate would have denied: the denial it bypassed (the call went to review)."
    )


class NotAdmittedDetail(Answer):
    admitted: Literal[False] = _("Always false here.")
    call_id: int = _("The call.")
    call_state: CallStateName = _("The call's state, unchanged.")
    gate: GateOut = _("The stored denial, with required_next.")


class NotAdmittedBody(ErrorBody):
    code: Literal["not_admitted"] = _("Always `not_admitted`.")
    detail: NotAdmittedDetail = _("The denied admission.")  # type: ignore[assignment]


class NotAdmittedOut(Answer):
    """A denied admission (409): an answer, and stored like one. Do what `gate.required_next` says."""

    error: NotAdmittedBody = _("The denial; its detail is the admission answer.")


# --- tasks (docs/design/tasks.md) -------------------------------------------------------------------------------------


class TaskBudgetOut(Answer):
    max_rounds: int | None = _("The round limit (null: none).")
    rounds_used: int = _("Rounds used so far.")
    deadline: str | None = _("The deadline, ISO 8601 (null: none).")
    token_budget: int | None = _("The token budget (null: none).")
    tokens_used: int = _("Tokens used so far.")
    write_retries_used: int = _("Write retries used so far.")
    limits: JsonObject = _("The budget as the task was opened with it.")


class StepOut(Answer):
    index: int = _("The step's index (from 1).")
    name: str = _("The step's name.")
    depends_on: list[int] = _("The indexes of the steps it depends on.")
    state: StepStateName = _("COMMITTED if one of its calls committed, else its latest call's state (PENDING: none).")
    blocked_by_steps: list[int] = _("The dependencies not COMMITTED yet.")
    calls: list[int] = _("The ids of its calls.")
    effect: str = _("What became of its effect: created, created then cancelled, not executed, unknown, ...")


class CallBriefOut(Answer):
    call_id: int = _("The call.")
    step: int = _("Its step's index.")
    tool: str = _("Its tool.")
    state: CallStateName = _("Its state.")
    idempotency_key: str = _("Its idempotency key.")
    provider_ref: str = _("The provider's reference, if known (empty otherwise).")
    outcome: str = _("An explicit end, if any (empty otherwise).")


class TaskOut(Answer):
    """A task and its summary: what is confirmed, unknown, not executed, blocked, and the next action."""

    id: int = _("The task's id.")
    tenant: str = _("Its tenant.")
    external_id: str = _("The runtime's id for it (unique per tenant).")
    agent: str = _("The agent running it.")
    goal: str = _("What it is for.")
    status: TaskStatusName = _("open, submitted or abandoned.")
    outcome: TaskOutcomeName | None = _("How it ended (null while open).")
    no_submission: bool = _("Whether it passed its deadline without a submission.")
    budget: TaskBudgetOut = _("Its budgets and what is used of them.")
    steps: list[StepOut] = _("Its steps, by index.")
    blocked_steps: list[int] = _("The steps waiting for a dependency.")
    done: list[CallBriefOut] = _("Calls COMMITTED.")
    accepted_in_progress: list[CallBriefOut] = _("Calls ACCEPTED by the provider, being checked.")
    unknown: list[CallBriefOut] = _("Calls whose effect is unknown (UNKNOWN, STILL_UNKNOWN): being reconciled.")
    needs_review: list[CallBriefOut] = _("Calls in HUMAN_REVIEW.")
    not_executed: list[CallBriefOut] = _("Calls that did not happen (FAILED_PERMANENT, NOT_COMMITTED).")
    in_flight: list[CallBriefOut] = _("Calls SENT, awaiting an outcome.")
    pending: list[CallBriefOut] = _("Calls READY or RETRYABLE.")
    compensated: list[CallBriefOut] = _("Calls being or having been compensated.")
    next_action: str = _("What the runtime should do next: continue, wait_for_reconcile, submit, ...")
    submission: JsonObject | None = _("The submitted summary and deliverable (null until submitted).")
    saga: Literal["running", "stopped", "done"] | None = _("Its saga abort, if any: running, stopped or done.")


# --- calls (docs/design/state-machine.md, docs/reconciliation.md) -----------------------------------------------------


class PreflightOut(Answer):
    passed: bool = _("Whether the arguments passed the tool's schema.")
    field_errors: list[FieldErrorOut] = _("The arguments to repair.")


class CallAddedOut(Answer):
    """A registered call (201), or the same call found again by its idempotency key (200)."""

    call_id: int = _("The call's id.")
    created: bool = _("Whether this request created it.")
    state: CallStateName = _("Its state.")
    preflight: PreflightOut = _("The arguments checked against the tool's schema, before any attempt.")
    failure: FailureOut | None = _("The failure an attempt would carry, when preflight did not pass.")
    required_next: RequiredNextOut | None = _("What to do, when preflight did not pass (repair_args).")
    blocked_by: list[int] = _("The dependencies' calls not COMMITTED yet.")
    blocked_by_steps: list[int] = _("The dependency steps waited for.")
    poll: str = _("Where to read the call.")


class AttemptRecordOut(Answer):
    attempt_id: str = _("The attempt's id.")
    number: int = _("Its number (from 1).")
    tool: str = _("The tool it called.")
    policy_bypassed: bool = _("Whether it ran outside the gate.")
    admitted_at: str | None = _("When it was admitted, ISO 8601.")
    reported_at: str | None = _("When its outcome was reported, ISO 8601 (null: not yet).")
    http_status: int | None = _("The provider's HTTP status, if a reply arrived.")
    error_kind: ErrorKind | None = _("The transport error, if no reply arrived.")
    failure_class: FailureClass | None = _("The failure's class, if it failed.")
    decision: DecisionOut | None = _("Its decision card, if any.")


class GateRecordOut(Answer):
    id: int = _("The stored gate decision.")
    allowed: bool = _("Whether it admitted.")
    reason: str = _("first_attempt, admitted, or the denial's code.")
    evidence_used: str = _("The evidence that justified it.")
    dry_run: bool = _("Whether it only answered (POST .../gate) without admitting.")
    required_next: RequiredNextOut | None = _("What it asked for, when denied.")
    created_at: str = _("When, ISO 8601.")


class ReceiptOut(Answer):
    id: int = _("The receipt.")
    source: ReceiptSourceName = _("poll, callback, runtime, operator or idempotent_replay (replay reconciliation).")
    observed: ObservationName = _("What the check observed: committed, not_found, pending, ...")
    provider_status: str = _("The provider's own status text.")
    provider_ref: str | None = _("The provider's reference, if it gave one.")
    applied: bool = _("Whether it moved the call.")
    checked_at: str = _("When, ISO 8601.")
    local_state_before: str = _("The call's state before it.")
    local_state_after: str = _("The call's state after it.")


class CompensationOut(Answer):
    """One entry of the call's compensation ledger (docs/compensation.md): the undo of its effect, as its own side
    effect."""

    compensation_id: str = _("The entry's id: comp-<call id>-<number>.")
    number: int = _("Its number in the call's ledger (from 1).")
    tool: str = _("The compensation tool (order.cancel, access.revoke, ...).")
    idempotency_key: str = _("Its own key, derived from the call's key and the number; never regenerated.")
    state: EntryStateName = _("pending, sent, unknown, not_committed, committed, failed or review.")
    target: str = _("What it undoes: the forward tool and its provider reference.")
    expected_effect: str = _("What undoing it means: one cancellation, one revocation, ...")
    attempts_made: int = _("Sends made.")
    max_attempts: int | None = _("Its tool's attempt limit (null: none).")
    checks_made: int = _("Status checks made by its own key.")
    provider_ref: str | None = _("The provider's reference for the undo, if known.")
    outcome: str | None = _("Why it ended, when it failed or went to review (refused, retry_exhausted, ...).")
    state_changed_at: str = _("When it entered its state, ISO 8601.")


class CallOut(Answer):
    """A call with its attempts, decision cards, gate answers and reconcile receipts."""

    id: int = _("The call's id.")
    task_id: int = _("Its task.")
    step: int = _("Its step's index.")
    tool: str = _("Its tool.")
    side_effect: SideEffectName = _("read or write.")
    state: CallStateName = _("Its state.")
    version: int = _("Its version: every state change adds one.")
    state_changed_at: str = _("When it entered its state, ISO 8601.")
    outcome: str | None = _("An explicit end, if any.")
    idempotency_key: str = _("Its idempotency key (stable for the intent).")
    arguments: JsonObject = _("Its arguments.")
    provider_ref: str | None = _("The provider's reference for the effect, if known.")
    observed: bool = _(
        "Reported after the fact by OpenTelemetry traces (docs/otlp-ingest.md), not admitted before it was sent."
    )
    attempts_made: int = _("Attempts admitted so far.")
    max_attempts: int | None = _("Its attempt limit (null: none).")
    checks_made: int = _("Status checks made with the provider.")
    next_check_at: str | None = _("When the next status check is due, ISO 8601 (null: none due).")
    attempts: list[AttemptRecordOut] = _("Its attempts, in order.")
    latest_decision: DecisionOut | None = _("The latest attempt's decision card.")
    gate_decisions: list[GateRecordOut] = _("Every gate answer about it, in order.")
    receipts: list[ReceiptOut] = _("Every reconcile receipt, in order.")
    compensations: list[CompensationOut] = _("Its compensation ledger: every entry, in order (empty: none).")


class ReconcileAcceptedOut(Answer):
    """A status check was queued (202): poll the call."""

    call_id: int = _("The call.")
    call_state: CallStateName = _("Its state now (UNKNOWN, STILL_UNKNOWN or ACCEPTED).")
    checks_made: int = _("Status checks made so far.")
    poll: str = _("Where to read the call's state.")


# --- capabilities ---------------------------------------------------------------------------------------------------


class CapabilityOut(Answer):
    name: str = _("The tool's name.")
    side_effect: SideEffectName = _("read or write.")
    risk: RiskName = _("low or high.")
    description: str = _("What it does.")
    args_schema: JsonObject = _("The JSON Schema its arguments must match.")
    replay_safe: bool = _("Whether the provider deduplicates a resend with the same key.")


class CapabilitiesOut(Answer):
    """The tools a tenant may call."""

    tenant: str = _("The tenant.")
    tools: list[CapabilityOut] = _("Its tools.")


# --- sagas (docs/compensation.md) -------------------------------------------------------------------------------------


class NextCompensationOut(Answer):
    """The saga's open entry: what to send next (runtime mode), or what is being sent, checked or reviewed."""

    compensation_id: str = _("The entry: comp-<call id>-<number>.")
    call_id: int = _("The call it undoes.")
    step: int = _("The call's step.")
    tool: str = _("The compensation tool to call.")
    arguments: JsonObject = _("Its arguments, filled from the call.")
    idempotency_key: str = _("The entry's own key: send it as the Idempotency-Key, always the same.")
    state: EntryStateName = _("pending or not_committed: send it; sent, unknown or review: wait.")
    attempts_made: int = _("Sends made.")
    max_attempts: int | None = _("Its tool's attempt limit (null: none).")


class SagaOut(Answer):
    """Where an aborted saga stands."""

    task_id: int = _("The task.")
    saga: Literal["", "running", "stopped", "done"] = _("running, stopped (a person decides), done; empty: none.")
    executor: Literal["", "console", "runtime"] = _("Who sends each undo: the console's worker or the runtime.")
    outcome: TaskOutcomeName | None = _("The task's outcome: compensated once every committed step was undone.")
    waiting_for: list[int] = _("Calls still settling (reconciled first: undone only if they committed).")
    next: NextCompensationOut | None = _("The open entry, if any.")
    stopped_at: int | None = _("The call the chain stopped at (an undo failed, undid part, or waits for a person).")
    poll: str = _("Where to read this again.")


class CompensationAttemptOut(Answer):
    """An attempt of a compensation the runtime sends: admitted (send it now), or its outcome read."""

    compensation_id: str = _("The entry.")
    attempt_id: str = _("The runtime's attempt id.")
    attempt_number: int = _("Its number among the entry's sends.")
    state: EntryStateName = _("The entry's state after it: sent when admitted; then committed, unknown, ...")
    call_id: int = _("The call it undoes.")
    call_state: CallStateName = _("The call's state: COMPENSATING until the entry ends.")
    tool: str = _("The compensation tool.")
    arguments: JsonObject = _("Its arguments.")
    idempotency_key: str = _("The entry's own key.")
    http_status: int | None = _("The reply's status, once reported.")
    row: str = _(
        "The classification table's row (docs/design/classification.md) that read the reply (refusal: a listed refusal "
        "code), once reported."
    )
    label: str = _("What the reply meant: committed, refused, timeout_after_send, ...")


# --- metrics (docs/metrics.md) ----------------------------------------------------------------------------------------


class MetricLabelOut(Answer):
    label: str = _("The label: an outcome, a failure class, a route, a queue ...")
    value: float = _("Its count in the window (for time to resolution: the queue's 95th percentile, seconds).")


class MetricPointOut(Answer):
    start: str = _("Where the point's step begins, ISO 8601 (UTC).")
    value: float | None = _("The figure over that step (null: nothing to divide, or no sample).")


class MetricFigureOut(Answer):
    """One figure of docs/metrics.md over the window."""

    key: FigureKey = _("The figure, a stable name: unknown_outcome_rate, reconcile_success_rate, ...")
    title: str = _("Its title as the console shows it.")
    kind: FigureKind = _("count (a sum by label), rate (a share 0..1), ratio (a mean), quantiles or duration.")
    doc: str = _("What it counts and how, in a few sentences.")
    unit: str = _("The unit of `value` (`s` for seconds; empty: a count or a share).")
    value: float | None = _("The window's figure: a count, a share, a mean, seconds, or the p95 (quantiles).")
    numerator: int | None = _("Rates and ratios: what was divided (null for other kinds).")
    denominator: int | None = _("Rates and ratios: what it was divided by (null for other kinds).")
    median: float | None = _("Quantiles: the median, seconds (null for other kinds or no sample).")
    count: int | None = _("Quantiles: the items resolved; duration: the breaker openings (null otherwise).")
    by_label: list[MetricLabelOut] = _("The figure by label, largest first (empty when it has none).")
    series: list[MetricPointOut] = _("The figure at each step of the window, oldest first.")


class MetricsOut(Answer):
    """The metrics of docs/metrics.md over a window, for the token's tenants (or the one asked for)."""

    window: WindowName = _("The window: 24h (hourly steps), 7d (6-hour steps) or 30d (daily steps).")
    start: str = _("Where the window's first step begins, ISO 8601 (UTC).")
    end: str = _("Where it ends: now, ISO 8601 (UTC).")
    folded_at: str | None = _("The figures count every event up to this time, ISO 8601 (null: never folded).")
    lag_s: float | None = _("Seconds between `folded_at` and `end` (null: never folded).")
    step_s: int = _("Seconds per point of each figure's series.")
    queues: dict[str, int] = _("Items in each queue now: unknown, human_review, compensation.")
    figures: list[MetricFigureOut] = _("Every figure, in the console's order.")

"""The engine's vocabulary (docs/design/vocabulary.md to docs/breakers.md) as frozen, keyword-only value objects: the
engine never sees a Django model, so callers build these from rows and store the values it answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from recovery.engine.reconcile import ReconcilePolicy

# --- names (docs/design/classification.md, docs/design/decisions.md) --------------------------------------------------

READ, WRITE = "read", "write"

# Failure classes
INVALID_ARGUMENTS = "invalid_arguments"
TRANSIENT = "transient"
AUTHENTICATION = "authentication"
AUTHORIZATION = "authorization"
CAPABILITY_MISSING = "capability_missing"
OUTCOME_UNKNOWN = "outcome_unknown"
INVALID_RESULT = "invalid_result"
UNRECOVERABLE = "unrecoverable"
FAILURE_CLASSES = (
    INVALID_ARGUMENTS,
    TRANSIENT,
    AUTHENTICATION,
    AUTHORIZATION,
    CAPABILITY_MISSING,
    OUTCOME_UNKNOWN,
    INVALID_RESULT,
    UNRECOVERABLE,
)

# Phases and side-effect stages
PREFLIGHT, DISPATCH, COMMIT_UNKNOWN, POSTCHECK = "preflight", "dispatch", "commit_unknown", "postcheck"
BEFORE_SEND, DURING_SEND, AFTER_RESPONSE = "before_send", "during_send", "after_response"
PHASES = (PREFLIGHT, DISPATCH, COMMIT_UNKNOWN, POSTCHECK)
STAGES = (BEFORE_SEND, DURING_SEND, AFTER_RESPONSE)

# Transport error kinds a runtime may report (absent when a response arrived)
ERROR_KINDS = (
    "connection_refused",
    "dns",
    "tls",
    "connect_timeout",
    "read_timeout",
    "reset",
    "invalid_response",
    "client_exception",
)
NOT_SENT_KINDS = frozenset({"connection_refused", "dns", "tls", "connect_timeout"})

# Routes (docs/design/decisions.md)
ROUTES = ("repair", "retry", "reauth", "replan", "reconcile", "reject", "escalate", "degrade", "stop")

# required_next.action: what a runtime does next, without parsing prose
REQUIRED_NEXT_ACTIONS = (
    "retry_after",
    "repair_args",
    "refresh_credentials",
    "request_approval",
    "replan",
    "wait_for_reconcile",
    "degrade",
    "stop",
)

# Evidence kinds for a new attempt (docs/design/gate.md)
TIME_ELAPSED = "time_elapsed"
ARGS_CHANGED = "args_changed"
CREDENTIAL_REFRESHED = "credential_refreshed"
TOOL_CHANGED = "tool_changed"
STATE_VERIFIED = "state_verified"
APPROVAL_GRANTED = "approval_granted"
EVIDENCE_KINDS = (TIME_ELAPSED, ARGS_CHANGED, CREDENTIAL_REFRESHED, TOOL_CHANGED, STATE_VERIFIED, APPROVAL_GRANTED)
# Trusted code only (never accepted from a runtime): reconciliation found the status query unable to answer and
# asks to settle the call by one same-key replay (docs/replay.md).
REPLAY_RECONCILE = "replay_reconcile"
UNPROBED, SAFE, UNSAFE = "unprobed", "safe", "unsafe"  # retry paths
# How much younger than the provider's retention a key must be for reconciliation to replay it.
REPLAY_MARGIN_S = 300

# Explicit exhaustion outcomes (docs/design/budgets.md)
RETRY_EXHAUSTED = "retry_exhausted"
HUMAN_REVIEW_REQUIRED = "human_review_required"
DEGRADED_READ_ONLY = "degraded_read_only"

# Breaker states (docs/breakers.md)
CLOSED, OPEN, HALF_OPEN, FORCED_OPEN = "closed", "open", "half_open", "forced_open"


# --- the registry, as the engine sees it ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BackoffPolicy:
    base_ms: int = 500
    cap_ms: int = 30_000
    jitter: str = "proportional"  # "proportional" (±20 %) or "full" (uniform 0..delay)


@dataclass(frozen=True, kw_only=True)
class BreakerPolicy:
    window_s: int = 60
    bucket_s: int = 10  # outcome counts are kept per bucket; the window is a whole number of buckets
    min_calls: int = 10
    failure_rate: float = 0.5
    cooldown_s: int = 30
    half_open_probes: int = 1
    probe_lease_s: int = 60  # a crashed prober's reservation expires after this

    def bucket_of(self, now_epoch_s: float) -> int:
        """The start (epoch seconds) of the bucket `now` falls in: the key its outcome is counted under."""
        return int(now_epoch_s // self.bucket_s) * self.bucket_s


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """Per-call and per-task limits. None means "no limit from this scope"; see budgets.tighter()."""

    max_attempts: int | None = None
    max_rounds: int | None = None
    deadline: datetime | None = None
    token_budget: int | None = None
    write_retry: int | None = None
    unknown_budget: int | None = None
    max_business_effects: int | None = None


@dataclass(frozen=True, kw_only=True)
class Invariant:
    """A check on a 2xx result: `result` (a dotted path) equals an argument, is one of some values, or >= min."""

    result: str
    equals_arg: str | None = None
    one_of: tuple[Any, ...] | None = None
    minimum: float | None = None


@dataclass(frozen=True, kw_only=True)
class ToolPolicy:
    name: str
    side_effect: str  # READ or WRITE
    risk: str = "low"  # "low" or "high" (payments, deletes, admin writes)
    replay_safe: bool = False
    # From the latest duplicate probe (docs/replay.md): UNPROBED, SAFE or UNSAFE. Unsafe refuses every same-key replay
    # whose first request may have taken effect; only SAFE lets reconciliation replay (docs/replay.md).
    retry_path: str = "unprobed"
    retry_path_key_age_s: int | None = None  # the key age the safe probe covered
    provider_ref_field: str = ""  # result field holding the provider's reference, besides provider_request_id
    args_schema: dict = field(default_factory=dict)
    result_schema: dict = field(default_factory=dict)
    required_result_fields: tuple[str, ...] = ()
    max_result_age_s: int | None = None
    result_time_field: str = ""  # result field (ISO 8601) that max_result_age_s applies to
    invariants: tuple[Invariant, ...] = ()
    approvable_codes: frozenset[str] = frozenset()
    # Provider error codes that mean "refused, nothing executed" (a 409 not_cancellable): FAILED_PERMANENT, never
    # UNKNOWN, never retried (docs/compensation.md), checked before the table's rows 4 and 4b.
    refusal_codes: frozenset[str] = frozenset()
    idempotency_conflict_codes: frozenset[str] = frozenset()  # the provider's
    error_code_paths: tuple[str, ...] = ()  # the provider's: where a reply's error code is (docs/providers.md)
    alternates: frozenset[str] = frozenset()
    outcome_timeout_s: int = 30
    key_retention_s: int = 86_400
    budgets: Budgets = field(default_factory=Budgets)
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    fallback: str = ""
    reconcile: ReconcilePolicy = field(default_factory=ReconcilePolicy)  # its status checks' schedule
    exhausted_to_review: bool = False  # a RETRYABLE with no budget left goes to HUMAN_REVIEW instead of failing
    approval_required: bool = False  # its first attempt waits for an approved hold (docs/mcp-gateway.md)

    @property
    def is_write(self) -> bool:
        return self.side_effect == WRITE


# --- what happened -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ErrorFacts:
    kind: str | None = None  # one of ERROR_KINDS; None when a response arrived
    code: str | None = None  # the provider's machine code
    message: str | None = None  # free text: stored redacted in a Diagnostic, never shown to a model


@dataclass(frozen=True, kw_only=True)
class Facts:
    """An attempt's outcome as a runtime reports it (docs/design/classification.md). Classification reads these, never
    message text."""

    connection_opened: bool | None = None
    sent: bool | None = None  # None: unknown
    http_status: int | None = None
    error: ErrorFacts | None = None
    provider_request_id: str | None = None
    retry_after_ms: int | None = None
    result: Any = None
    tokens_used: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    echoed_idempotency_key: str | None = None  # the key the provider says it executed, when it says
    credential_scopes: tuple[str, ...] | None = None  # scopes of the credential used, when the runtime knows them


@dataclass(frozen=True, kw_only=True)
class ClassifyContext:
    """What classification needs besides the facts: the call's key and the previous attempt's credential."""

    call_id: str = ""
    attempt_id: str = ""
    idempotency_key: str = ""
    attempt_number: int = 1
    previous_scopes: tuple[str, ...] | None = None
    arguments: dict = field(default_factory=dict)  # for result invariants that compare with an argument
    now: datetime | None = None  # for result freshness; defaults to finished_at


@dataclass(frozen=True, kw_only=True)
class FieldError:
    field: str
    expected: str
    received: Any
    suggestion: str


@dataclass(frozen=True, kw_only=True)
class Failure:
    """The structured failure of docs/design/classification.md, stored on the attempt and returned by the API."""

    tool: str
    call_id: str
    attempt_id: str
    failure_class: str
    phase: str
    stage: str
    retryable: bool
    replay_safe: bool
    retry_after_ms: int | None
    public_message: str
    field_errors: tuple[FieldError, ...] = ()
    diagnostic_ref: str = ""
    authorization_required: bool = False
    external_state_verified: bool = False


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """classify()'s answer: the row of the docs/design/classification.md table that matched, the state it leads to, and
    the failure if any.

    `state` is the table's state before budgets are applied: decide() turns a RETRYABLE with no budget left into
    FAILED_PERMANENT (or HUMAN_REVIEW). `failure` is None for COMMITTED and ACCEPTED.
    """

    row: str  # "1".."11", "4b", "refusal" (a listed refusal code) or "hard_stop"
    state: str
    phase: str
    stage: str
    side_effect: str  # "not_sent", "not_executed", "unknown", "executed", "none_confirmed"
    error: str  # a short label for the card: "timeout_after_send", "rate_limited", ...
    failure: Failure | None = None
    hard_stop: str = ""  # why a write went to HUMAN_REVIEW before the table: missing_provider_ref, ...
    provider_ref: str = ""
    error_code: str | None = None  # the provider's code as classified: read by the registry's paths, else reported


# --- the decision card ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RequiredNext:
    action: str  # one of REQUIRED_NEXT_ACTIONS
    after_ms: int = 0
    poll: str = ""  # where to poll, filled by the API
    detail: dict = field(default_factory=dict)  # e.g. {"fallback": ...}, {"blocked_by": [...]}, {"evidence": [...]}


@dataclass(frozen=True, kw_only=True)
class BudgetView:
    attempt: int
    max_attempts: int | None
    task_rounds: int
    max_rounds: int | None
    deadline_in_s: float | None
    tokens_used: int = 0
    token_budget: int | None = None


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The recovery decision card of docs/design/decisions.md, one per failed (or accepted) attempt."""

    route: str  # one of ROUTES
    call_state: str  # the state the call moves to, budgets applied
    outcome: str  # "", RETRY_EXHAUSTED, HUMAN_REVIEW_REQUIRED, DEGRADED_READ_ONLY
    error: str
    phase: str
    stage: str
    side_effect: str
    delay_ms: int
    next: tuple[str, ...]
    forbidden: tuple[str, ...]
    public_message: str
    required_next: RequiredNext
    budget: BudgetView
    fallback: str = ""
    breaker_state: str = CLOSED


@dataclass(frozen=True, kw_only=True)
class CallView:
    """The call being decided on, as decide() and admit() need it."""

    call_id: str
    tool: str
    state: str
    idempotency_key: str
    fingerprint: str
    attempts_made: int  # attempts admitted so far
    max_attempts: int | None = None  # resolved (tighter of tool and task)
    first_sent_at: datetime | None = None  # for the provider's key retention


@dataclass(frozen=True, kw_only=True)
class TaskView:
    rounds_used: int = 0
    tokens_used: int = 0
    write_retries_used: int = 0
    unsettled_unknowns: int = 0  # calls of the task in UNKNOWN / STILL_UNKNOWN
    unsettled_by_tool: dict[str, int] = field(default_factory=dict)
    # The registry's unknown_budget of each tool in unsettled_by_tool: a tool's 0 means one unsettled UNKNOWN of
    # that tool holds back every write of the task (a permission grant or a payment in doubt).
    unknown_budget_by_tool: dict[str, int | None] = field(default_factory=dict)
    compensating: int = 0  # calls of the task being compensated (docs/compensation.md): the task's other writes wait
    budgets: Budgets = field(default_factory=Budgets)


@dataclass(frozen=True, kw_only=True)
class BreakerView:
    state: str = CLOSED  # effective state now (open past its cooldown reads half_open)
    probe_available: bool = True  # half_open: may one more probe be reserved?
    retry_in_ms: int = 0  # open: time until the cooldown ends
    # forced_open: who forced it open and why, as the operation recorded it ("" when unknown, e.g. set by hand)
    forced_by: str = ""
    forced_reason: str = ""


# --- admission -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PreviousAttempt:
    number: int
    tool: str
    fingerprint: str
    credential_version: int | None
    failure_class: str | None  # None: the attempt had no failure (or no outcome yet)
    phase: str | None
    side_effect: str | None  # Outcome.side_effect of its classification
    finished_at: datetime | None  # when the failure was reported
    wait_ms: int = 0  # the decision's delay (backoff or Retry-After) that must elapse before a retry


@dataclass(frozen=True, kw_only=True)
class Candidate:
    attempt_id: str
    tool: str
    arguments: dict
    credential_version: int | None = None
    evidence: tuple[str, ...] = ()  # the kinds the runtime claims


@dataclass(frozen=True, kw_only=True)
class GateContext:
    now: datetime
    tool: ToolPolicy  # the call's registered tool
    candidate_tool: ToolPolicy | None = None  # when the candidate names an alternate
    previous: PreviousAttempt | None = None
    dependencies: dict[str, str] = field(default_factory=dict)  # call id -> state, for the step's depends_on
    latest_receipt: str | None = None  # observation of the newest receipt
    latest_receipt_at: datetime | None = None
    approval_available: bool = False  # an approved, unused action request names this call
    task: TaskView = field(default_factory=TaskView)
    breaker: BreakerView = field(default_factory=BreakerView)
    call_estimate_ms: int = 1_000  # what one call takes, to tell whether the deadline still fits one
    # Set by reconciliation alone: the status query cannot answer now (docs/replay.md), so REPLAY_RECONCILE may hold.
    status_unavailable: bool = False


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str  # state, preflight, dependencies, budgets, evidence, key_retention, retry_path, breaker
    passed: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class GateDecision:
    """An admission answer (docs/design/gate.md), unsaved: the caller stores it whether allowed or denied."""

    allowed: bool
    reason: str  # "admitted", "first_attempt", or the denial's code
    evidence_used: str = ""
    checks: tuple[Check, ...] = ()
    required_next: RequiredNext | None = None
    public_message: str = ""
    field_errors: tuple[FieldError, ...] = ()
    uses_probe: bool = False  # admitted as the half-open breaker's probe: the caller must reserve it

"""The API's answers as the Python client returns them (recovery_client/__init__.py): plain dataclasses and TypedDicts,
no Django, checked field by field against the served OpenAPI document by tests/test_api_document.py."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T", bound="DataclassInstance")

__all__ = [
    "Admission",
    "AttemptRecord",
    "BudgetView",
    "CallBrief",
    "CallDetail",
    "CallRef",
    "Capability",
    "Check",
    "CompensationAttempt",
    "CompensationRecord",
    "DecisionCard",
    "EarlierVerdict",
    "Failure",
    "FieldErrorInfo",
    "Gate",
    "GateRecord",
    "NextCompensation",
    "NotAdmittedDetail",
    "OutcomeAnswer",
    "Preflight",
    "ReceiptRecord",
    "ReconcileAccepted",
    "ReportTerms",
    "RequiredNext",
    "Saga",
    "StepSummary",
    "Task",
    "TaskBudget",
    "Wire",
]

# --- what the API answers ---------------------------------------------------------------------------------------------
# The answers' shapes, as the served document (/api/v1/openapi.json, built from recovery/api/answers.py) describes
# them: tests/test_api_document.py checks every field of these types against the document, so a field the server
# adds, renames or drops fails that test until the client knows it. Nested objects are TypedDicts (plain dicts at
# run time); the top-level answers below are dataclasses that keep the whole body in `raw`.


class FieldErrorInfo(TypedDict):
    field: str
    expected: str
    received: Any
    suggestion: str


class RequiredNext(TypedDict):
    action: str  # retry_after, repair_args, refresh_credentials, request_approval, replan, wait_for_reconcile, ...
    after_ms: int
    poll: str
    detail: dict[str, Any]


class Check(TypedDict):
    name: str
    passed: bool
    detail: str


class Gate(TypedDict):
    id: int | None
    allowed: bool
    reason: str
    evidence_used: str
    checks: list[Check]
    required_next: RequiredNext | None
    public_message: str
    field_errors: list[FieldErrorInfo]


# "class" is a keyword, hence the functional form.
Failure = TypedDict(
    "Failure",
    {
        "tool": str,
        "call_id": str,
        "attempt_id": str,
        "class": str,
        "phase": str,
        "stage": str,
        "retryable": bool,
        "replay_safe": bool,
        "retry_after_ms": "int | None",
        "public_message": str,
        "field_errors": "list[FieldErrorInfo]",
        "diagnostic_ref": str,
        "authorization_required": bool,
        "external_state_verified": bool,
    },
)


class BudgetView(TypedDict):
    attempt: int
    max_attempts: int | None
    task_rounds: int
    max_rounds: int | None
    deadline_in_s: float | None
    tokens_used: int
    token_budget: int | None


class DecisionCard(TypedDict):
    id: int | None
    route: str  # repair, retry, reauth, replan, reconcile, reject, escalate, degrade, stop
    call_state: str
    outcome: str
    error: str
    phase: str
    stage: str
    side_effect: str
    delay_ms: int
    next: list[str]
    forbidden: list[str]
    public_message: str
    required_next: RequiredNext
    budget: BudgetView
    fallback: str
    breaker_state: str


class Preflight(TypedDict):
    passed: bool
    field_errors: list[FieldErrorInfo]


class TaskBudget(TypedDict):
    max_rounds: int | None
    rounds_used: int
    deadline: str | None
    token_budget: int | None
    tokens_used: int
    write_retries_used: int
    limits: dict[str, Any]


class StepSummary(TypedDict):
    index: int
    name: str
    depends_on: list[int]
    state: str
    blocked_by_steps: list[int]
    calls: list[int]
    effect: str  # created, created then cancelled, not executed, unknown: being settled, ...


class CallBrief(TypedDict):
    call_id: int
    step: int
    tool: str
    state: str
    idempotency_key: str
    provider_ref: str
    outcome: str


class AttemptRecord(TypedDict):
    attempt_id: str
    number: int
    tool: str
    policy_bypassed: bool
    admitted_at: str | None
    reported_at: str | None
    http_status: int | None
    error_kind: str | None
    failure_class: str | None
    decision: DecisionCard | None


class GateRecord(TypedDict):
    id: int
    allowed: bool
    reason: str
    evidence_used: str
    dry_run: bool
    required_next: RequiredNext | None
    created_at: str


class ReceiptRecord(TypedDict):
    id: int
    source: str
    observed: str
    provider_status: str
    provider_ref: str | None
    applied: bool
    checked_at: str
    local_state_before: str
    local_state_after: str


class CompensationRecord(TypedDict):
    """One entry of the call's compensation ledger."""

    compensation_id: str
    number: int
    tool: str
    idempotency_key: str
    state: str  # pending, sent, unknown, not_committed, committed, failed, review
    target: str
    expected_effect: str
    attempts_made: int
    max_attempts: int | None
    checks_made: int
    provider_ref: str | None
    outcome: str | None
    state_changed_at: str


class CallDetail(TypedDict):
    """GET /calls/{id}: the call with its attempts, decision cards, gate answers and receipts."""

    id: int
    task_id: int
    step: int
    tool: str
    side_effect: str
    state: str
    version: int
    state_changed_at: str
    outcome: str | None
    idempotency_key: str
    arguments: dict[str, Any]
    provider_ref: str | None
    observed: bool
    attempts_made: int
    max_attempts: int | None
    checks_made: int
    next_check_at: str | None
    attempts: list[AttemptRecord]
    latest_decision: DecisionCard | None
    gate_decisions: list[GateRecord]
    receipts: list[ReceiptRecord]
    compensations: list[CompensationRecord]


class ReconcileAccepted(TypedDict):
    call_id: int
    call_state: str
    checks_made: int
    poll: str


class Capability(TypedDict):
    name: str
    side_effect: str
    risk: str
    description: str
    args_schema: dict[str, Any]
    replay_safe: bool


@dataclass(frozen=True)
class Task:
    """A task and its summary (docs/design/tasks.md)."""

    id: int
    tenant: str
    external_id: str
    agent: str
    goal: str
    status: str  # open, submitted, abandoned
    outcome: str | None
    no_submission: bool
    budget: TaskBudget
    steps: list[StepSummary]
    blocked_steps: list[int]
    done: list[CallBrief]
    accepted_in_progress: list[CallBrief]
    unknown: list[CallBrief]
    needs_review: list[CallBrief]
    not_executed: list[CallBrief]
    in_flight: list[CallBrief]
    pending: list[CallBrief]
    compensated: list[CallBrief]
    next_action: str
    submission: dict[str, Any] | None
    saga: str | None  # running, stopped, done (None: never aborted)
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class CallRef:
    """A registered call (or the same call found again by its key)."""

    call_id: int
    created: bool
    state: str
    preflight: Preflight
    failure: Failure | None
    required_next: RequiredNext | None
    blocked_by: list[int]  # ids of the dependencies' calls not COMMITTED yet
    blocked_by_steps: list[int]  # indexes of the dependency steps waited for
    poll: str
    admission: Admission | None  # API 1.2, asked with add_call(admit=...): the first attempt, admitted
    not_admitted: NotAdmittedDetail | None  # API 1.2: its stored denial instead (None: admitted or not asked)
    raw: dict[str, Any] = field(repr=False)


class NotAdmittedDetail(TypedDict):
    """A denied admission, as a 409 `not_admitted`'s detail or add_call's `not_admitted` (API 1.2) carries it."""

    admitted: bool
    call_id: int
    call_state: str
    gate: Gate


class ReportTerms(TypedDict):
    """When the runtime may answer its caller before reporting a 2xx (API 1.2, docs/api.md): only with `may_defer`,
    for a reply that passes these checks, reporting within `within_s`."""

    may_defer: bool
    within_s: float
    required_result_fields: list[str]  # dotted paths a deferrable result must carry
    provider_ref_field: str  # the result field with the provider's reference (when no request id header does)
    key_echo_header: str  # a reply header that, when present, must echo the call's idempotency key


class Wire(TypedDict):
    """How to send an admitted attempt as the registry describes its tool (API 1.1, docs/providers.md)."""

    key_header: str  # the header that carries the call's idempotency key ("": not a header)
    key_field: str  # the body field that carries it instead ("": not a field; both "": no key at all)
    key_markers: list[str]  # body paths that also carry the key, the marker a listing lookup matches (API 1.1)
    request_id_header: str  # the reply header with the provider's request id


class EarlierVerdict(TypedDict):
    """A report of the task that may have been deferred and that the console did not judge COMMITTED (API 1.2)."""

    call_id: int
    attempt_id: str
    call_state: str
    decision: DecisionCard | None


@dataclass(frozen=True)
class Admission:
    """An admitted attempt: send the provider request now, then report its outcome."""

    admitted: bool
    call_id: int
    attempt_id: str
    attempt_number: int
    call_state: str
    gate: Gate
    wire: Wire | None  # None from a console answering API 1.0: the key in Idempotency-Key, X-Request-Id
    report: ReportTerms | None  # None from a console before API 1.2, or when the report may not wait
    raw: dict[str, Any] = field(repr=False)
    # The task's reports since its last admission that may have been deferred and whose verdict is not COMMITTED,
    # each with its decision card (empty from a console that does not say).
    earlier: list[EarlierVerdict] = field(default_factory=list)


@dataclass(frozen=True)
class OutcomeAnswer:
    """The answer to an outcome: the call's state, the public failure and the decision card."""

    call_id: int
    attempt_id: str
    attempt_number: int
    call_state: str
    policy_bypassed: bool
    failure: Failure | None
    decision: DecisionCard | None
    breaker_state: str
    provider_ref: str
    late: bool
    gate: Gate | None
    raw: dict[str, Any] = field(repr=False)

    @property
    def required_next(self) -> RequiredNext | dict[str, Any]:
        decision = self.decision
        return (decision.get("required_next") if decision else None) or {}


class NextCompensation(TypedDict):
    """A saga's open entry: send it when its state is pending or not_committed (runtime mode)."""

    compensation_id: str
    call_id: int
    step: int
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    state: str
    attempts_made: int
    max_attempts: int | None


class Saga(TypedDict):
    """Where an aborted saga stands (POST /tasks/{id}/compensate, GET /tasks/{id}/compensation)."""

    task_id: int
    saga: str  # running, stopped, done ("" for none)
    executor: str  # console or runtime
    outcome: str | None
    waiting_for: list[int]
    next: NextCompensation | None
    stopped_at: int | None
    poll: str


class CompensationAttempt(TypedDict):
    """An attempt of a compensation the runtime sends: admitted, or its outcome read."""

    compensation_id: str
    attempt_id: str
    attempt_number: int
    state: str
    call_id: int
    call_state: str
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    http_status: int | None
    row: str
    label: str


def _answer(cls: type[_T], body: dict[str, Any]) -> _T:
    """One of the dataclasses above from an answer's body (a field the body lacks is None, or its default)."""
    given = {f.name: body.get(f.name) for f in fields(cls) if f.name != "raw"}
    given |= {
        f.name: f.default_factory() for f in fields(cls) if f.name not in body and f.default_factory is not MISSING
    }
    return cls(**given, raw=body)  # type: ignore[call-arg]

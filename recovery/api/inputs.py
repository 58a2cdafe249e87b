"""What the machine API accepts (docs/api.md): the request bodies and parameters, strict.
Strict types, unknown fields refused, every text storable, bounds at the columns' ranges; a failure is a 422 with
field errors and stores nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from django.http import HttpRequest
from ninja import Schema
from ninja.parser import Parser
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic import Strict as StrictType

from recovery.engine.storable import NotUtf8, check_storable, loads
from recovery.engine.types import ERROR_KINDS, EVIDENCE_KINDS
from recovery.selectors.context import ACTION_ATTEMPT_PREFIX
from recovery.selectors.metrics import WINDOWS
from recovery.statemachine.watch import MAX_WAIT_MS

# --- bodies -------------------------------------------------------------------------------------------------------

# A body nesting deeper than this is refused whole (400) before any schema reads it. The free-form fields'
# own limit (MAX_JSON_DEPTH, a 422 naming the field) is lower, so a field a little too deep is named; this bound
# is only there so that no depth, however absurd, reaches a recursive walk.
MAX_BODY_DEPTH = 128
UTF8_NAMES = {"utf-8", "utf8"}


class BoundedJsonParser(Parser):
    """Request bodies are UTF-8 JSON nesting at most MAX_BODY_DEPTH levels: deeper is a 400, never a RecursionError;
    another encoding — a byte order mark, UTF-16 or UTF-32, a Content-Type charset other than UTF-8 — is a 400
    naming it (NotUtf8), never a body read as if it were UTF-8."""

    def parse_body(self, request: HttpRequest):
        charset = request.content_params.get("charset") if request.content_params else None
        if charset is not None and charset.strip().lower() not in UTF8_NAMES:
            raise NotUtf8(f"declared as charset={charset[:40]}")
        return loads(request.body, max_depth=MAX_BODY_DEPTH)


# --- inputs -------------------------------------------------------------------------------------------------------


# Integer columns are 32-bit on PostgreSQL (PositiveIntegerField): a larger number is a 422, not a database error.
MAX_INT = 2_147_483_647


def _text(value: str) -> str:
    check_storable(value)
    return value


# A query or path parameter: the body schemas below check theirs in Strict.
Text = Annotated[str, AfterValidator(_text)]


# GET /calls/{id}'s long poll (recovery.statemachine.watch): the version seen, and how long to wait for another one.
CallVersion = Annotated[int, Field(ge=0, le=MAX_INT)]
WaitMs = Annotated[int, Field(ge=0, le=MAX_WAIT_MS)]
# GET /metrics' window (recovery.selectors.metrics).
MetricsWindow = Literal[tuple(WINDOWS)]  # type: ignore[valid-type]


def _not_an_operator_replay(value: str) -> str:
    """An operator's approved replay names its attempt after its action request ("action-<id>"), and that name is
    what its approval admits: an agent's attempt may not take it, or guessing it would spend the approval."""
    if value.lower().startswith(ACTION_ATTEMPT_PREFIX):
        raise ValueError(
            f"an attempt id not starting with {ACTION_ATTEMPT_PREFIX!r} (reserved for replays operators approved)"
        )
    return value


AttemptId = Annotated[
    str, Field(min_length=1, max_length=100, pattern=r"^[\x21-\x7e]+$"), AfterValidator(_not_an_operator_replay)
]


class Strict(Schema):
    # Strict types: a boolean is not an integer, a string is not a number ("5" is refused where 5 is expected);
    # unknown fields are refused too. Times are the one exception: JSON has no time type (IsoTime below).
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        if not isinstance(value, BaseModel):  # a nested schema checks its own fields
            check_storable(value)
        return value


def _iso_text(value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise ValueError("must be an ISO 8601 text with a UTC offset, e.g. 2026-08-20T18:50:00Z")
    return value


# A time in a body: ISO 8601 text only (a number of seconds is refused, as any non-text), parsed out of strict mode.
IsoTime = Annotated[datetime, StrictType(False), BeforeValidator(_iso_text)]


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        raise ValueError("must include a UTC offset, e.g. 2026-08-20T18:50:00Z")
    if value is not None:
        try:
            value.astimezone(UTC)
        except OverflowError:
            raise ValueError("must fall between 0001-01-01 and 9999-12-31 in UTC") from None
    return value


class BudgetIn(Strict):
    max_rounds: int | None = Field(None, ge=1, le=100_000)
    deadline: IsoTime | None = None
    token_budget: int | None = Field(None, ge=0, le=MAX_INT)
    write_retry: int | None = Field(None, ge=0, le=1000)
    unknown_budget: int | None = Field(None, ge=0, le=1000)
    max_business_effects: int | None = Field(None, ge=1, le=1000)
    max_attempts: int | None = Field(None, ge=1, le=1000)
    unknown_policy: Literal["reconcile_then_human"] | None = None
    fallback: str | None = Field(None, max_length=100)

    _deadline = field_validator("deadline")(_aware)


class TaskIn(Strict):
    tenant: str = Field(min_length=1, max_length=64)
    external_id: str = Field(min_length=1, max_length=200)
    agent: str = Field(min_length=1, max_length=200)
    goal: str = Field(min_length=1, max_length=5000)
    budget: BudgetIn | None = None


class CompleteIn(Strict):
    summary: str = Field(min_length=1, max_length=20_000)
    deliverable: dict[str, Any] | None = None


class AbandonIn(Strict):
    reason: str = Field("", max_length=2000)


class CompensationIn(Strict):
    """A step's own compensation (docs/compensation.md), instead of its tool's registry default: the write that undoes
    it and its arguments as a template ({argument}, {result.<field>}, {provider_ref})."""

    tool: str = Field(min_length=1, max_length=100)
    args: dict[str, Any] = Field(default_factory=dict)


class AdmitIn(Strict):
    """The first attempt to admit with the call's registration (API 1.2): one round trip before the send."""

    attempt_id: AttemptId
    evidence: list[Literal[EVIDENCE_KINDS]] = Field(default_factory=list, max_length=6)  # type: ignore[valid-type]


class CallIn(Strict):
    step: int = Field(ge=1, le=10_000)
    depends_on: list[int] = Field(default_factory=list, max_length=100)
    tool: str = Field(min_length=1, max_length=100)
    arguments: dict[str, Any]
    idempotency_key: str = Field(min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$")
    compensation: CompensationIn | None = None
    admit: AdmitIn | None = None

    @field_validator("depends_on")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(index < 1 for index in value):
            raise ValueError("step indexes start at 1")
        return value


class ErrorIn(Strict):
    kind: Literal[ERROR_KINDS] | None = None  # type: ignore[valid-type]
    code: str | None = Field(None, max_length=100)
    message: str | None = Field(None, max_length=20_000)


class OutcomeIn(Strict):
    connection_opened: bool | None = None
    sent: bool | None = None
    http_status: int | None = Field(None, ge=100, le=599)
    error: ErrorIn | None = None
    provider_request_id: str | None = Field(None, max_length=255)
    retry_after_ms: int | None = Field(None, ge=0, le=86_400_000)
    result: Any = None
    tokens_used: int | None = Field(None, ge=0, le=100_000_000)
    started_at: IsoTime | None = None
    finished_at: IsoTime | None = None
    echoed_idempotency_key: str | None = Field(None, max_length=255)
    credential_scopes: list[str] | None = Field(None, max_length=100)

    _times = field_validator("started_at", "finished_at")(_aware)

    @model_validator(mode="after")
    def _something_happened(self):
        error = self.error.model_dump(exclude_none=True) if self.error is not None else {}
        if self.http_status is None and not error:  # an empty error says nothing happened either
            raise ValueError("an outcome needs an http_status (a reply arrived) or an error (it did not)")
        return self


class CandidateIn(Strict):
    attempt_id: AttemptId
    tool: str | None = Field(None, max_length=100)
    arguments: dict[str, Any] | None = None
    credential_version: int | None = Field(None, ge=0, le=MAX_INT)
    evidence: list[Literal[EVIDENCE_KINDS]] = Field(default_factory=list, max_length=6)  # type: ignore[valid-type]
    outcome: OutcomeIn | None = None


class SagaAbortIn(Strict):
    executor: Literal["console", "runtime"] = "console"
    reason: str = Field("", max_length=2000)


class CompensationAttemptIn(Strict):
    attempt_id: AttemptId

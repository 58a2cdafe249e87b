"""The machine API for agent runtimes (docs/api.md), versioned under /api/v1/, documented at /api/v1/openapi.json.
Tokens are scoped to tenants (another tenant's objects answer 404); a metrics token gets 403 `wrong_token_scope` on
every endpoint but GET /api/v1/metrics (services.tokens.token_require_scope).
"""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest
from django.shortcuts import get_object_or_404
from django.urls import register_converter
from django.utils import timezone
from ninja import Status
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.security import HttpBearer

from recovery.api.admission_answers import AdmittedOut
from recovery.api.answering import written
from recovery.api.answers import (
    CallOut,
    CapabilitiesOut,
    CompensationAttemptOut,
    ErrorOut,
    GateOut,
    MetricsOut,
    NotAdmittedOut,
    OutcomeOut,
    ReconcileAcceptedOut,
    SagaOut,
    TaskOut,
)
from recovery.api.call_admission import CallAdmittedOut, admit_added, one_transaction
from recovery.api.errors import envelope, exception_response, unreadable_body
from recovery.api.inputs import (
    AbandonIn,
    AttemptId,
    BoundedJsonParser,
    CallIn,
    CallVersion,
    CandidateIn,
    CompensationAttemptIn,
    CompleteIn,
    MetricsWindow,
    OutcomeIn,
    SagaAbortIn,
    TaskIn,
    Text,
    WaitMs,
)
from recovery.api.metrics import SCOPES, metrics_answer, metrics_scope
from recovery.api.otlp import router as otlp_router
from recovery.api.provider_answers import CallbackOut, CompensationCallbackOut
from recovery.api.versions import VersionedNinjaAPI, refuse_markerless_client
from recovery.audit.chain import Actor
from recovery.engine.redact import echo_received
from recovery.engine.states import RECONCILABLE
from recovery.jobs import queueing
from recovery.jobs import tasks as jobs
from recovery.models import Call, Task, Tenant, TokenScope
from recovery.registry import with_alternates
from recovery.selectors.context import AdmissionRead
from recovery.selectors.metrics import DEFAULT_WINDOW, metrics_report
from recovery.selectors.tasks_calls import (
    allowed_tools,
    call_detail,
    call_in_tenants,
    task_summary,
)
from recovery.services import callbacks, calls, sagas, tasks
from recovery.services.attempts import AttemptRequest, attempt_admit, gate_ask
from recovery.services.compensation_runtime import compensation_admit, compensation_report, entry_of
from recovery.services.errors import Refusal, field_errors_json
from recovery.services.outcomes import attempt_report, facts_of
from recovery.services.tokens import token_authenticate, token_require_scope
from recovery.statemachine import hot_path, hot_reads, watch

# --- the API -------------------------------------------------------------------------------------------------------


class ServerId:
    """A server id in a URL: canonical decimal only — no sign, no leading zero, no "_" or "." or spaces — within a
    64-bit key. Anything else matches no route and answers 404, where int() would have read /tasks/1_3 or
    /tasks/+13 as task 13."""

    regex = "[1-9][0-9]{0,17}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(ServerId, "id")


class TokenAuth(HttpBearer):
    def __init__(self, scopes: tuple[str, ...] = (TokenScope.RUNTIME,)):
        super().__init__()
        self.scopes = scopes

    def authenticate(self, request: HttpRequest, token: str):
        # The task the path names (POST /tasks/{id}/calls...) is read with the token, in one statement: _task().
        task_id = request.resolver_match.kwargs.get("task_id") if request.resolver_match else None
        api_token = token_authenticate(token, task_id=task_id)
        if api_token is not None:
            token_require_scope(api_token, self.scopes)  # a column of the row just read: no statement
            request.api_token = api_token
            request.tenant_ids = api_token.tenant_ids
        return api_token


api = VersionedNinjaAPI(  # its version: recovery/api/versions.py
    title="Recovery Console API",
    description="Register tool calls, ask for admission before every attempt, report outcomes, get decision cards.",
    auth=TokenAuth(),
    urls_namespace="api-v1",
    docs_url="/docs",
    parser=BoundedJsonParser(),
)
api.add_router("/otlp", otlp_router)  # POST /otlp/v1/traces: OpenTelemetry trace ingest (recovery/api/otlp.py)


def _error(request, status: int, code: str, message: str, field_errors=(), detail=None):
    body = envelope(code, message, field_errors=field_errors, detail=detail)
    return api.create_response(request, body, status=status)


@api.exception_handler(Refusal)
def _refusal(request, exc: Refusal):
    return _error(request, exc.status, exc.code, exc.message, field_errors_json(exc.field_errors), exc.detail)


def _field(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body", "payload", "query", "path")]
    return ".".join(parts) or "body"


@api.exception_handler(NinjaValidationError)
def _validation_error(request, exc: NinjaValidationError):
    errors = [
        {
            "field": _field(e.get("loc", ())),
            "expected": e.get("msg", "a valid value").removeprefix("Value error, "),
            "received": echo_received(e.get("input"), _field(e.get("loc", ()))),
            "suggestion": "Remove this field." if e.get("type") == "extra_forbidden" else "Fix this field and resend.",
        }
        for e in exc.errors
    ]
    return _error(request, 422, "invalid_request", "the request does not match the API schema", errors)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return _error(request, 401, "unauthenticated", "send a valid, unrevoked API token: Authorization: Bearer <token>")


@api.exception_handler(Http404)
def _not_found(request, exc):
    return _error(request, 404, "not_found", "no such object for this token's tenants")


@api.exception_handler(RequestDataTooBig)
def _too_big(request, exc):
    return _error(request, 413, "body_too_large", "the request body is over the size limit")


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, ValueError | UnicodeDecodeError):  # the body did not parse
        return _refusal(request, unreadable_body(cause))
    return _error(request, exc.status_code, "bad_request", str(exc))


@api.exception_handler(Exception)
def _unhandled(request, exc: Exception):
    """Anything else: 500 internal_error with the request id, or 503 database_unavailable (recovery/api_errors)."""
    return exception_response(request, exc)


# Every route may answer these, each with the one error envelope (426: api/versions.py, 500/503: api/errors.py).
ERRORS = {code: ErrorOut for code in (400, 401, 403, 404, 409, 413, 422, 426, 500, 503)}
# Answers are written with their wire names (the failure's `class`).
TYPED = {"by_alias": True}
# An attempt's answer: admitted (send it now), or — with an outcome in the request — the outcome's answer.
AttemptAnswer = AdmittedOut | OutcomeOut


def _actor(request) -> Actor:
    return Actor.for_token(request.api_token)


def _tenant(request, name: str) -> Tenant:
    tenant = Tenant.objects.filter(name=name, pk__in=request.tenant_ids).first()
    if tenant is None:
        raise Refusal(
            "tenant_not_allowed",
            "this token is not scoped to that tenant",
            status=403,
            field_errors=[
                {
                    "field": "tenant",
                    "expected": "a tenant this token is scoped to",
                    "received": name,
                    "suggestion": "Use a token issued for this tenant.",
                }
            ],
        )
    return tenant


def _task(request, task_id: int) -> Task:
    read = request.api_token.tasks_read  # read with the token where the path names it (TokenAuth)
    task = read[task_id] if task_id in read else hot_reads.task_in_tenants(task_id, request.tenant_ids)
    if task is None:
        raise Http404("No Task matches the given query.")  # get_object_or_404's words, as before
    return task


def _call(request, call_id: int) -> Call:
    """The call with what its endpoints read."""
    call = call_in_tenants(call_id, request.tenant_ids)
    if call is None:
        raise Http404("no call with this id")
    return call


def _attempt_request(payload: CandidateIn) -> AttemptRequest:
    outcome = payload.outcome
    return AttemptRequest(
        attempt_id=payload.attempt_id,
        tool=payload.tool,
        arguments=payload.arguments,
        credential_version=payload.credential_version,
        evidence=tuple(payload.evidence),
        outcome=facts_of(outcome.model_dump(exclude_unset=True)) if outcome is not None else None,
    )


def _call_to_admit(request, call_id: int, attempt_id: str) -> tuple[Call, AdmissionRead]:
    """The call with what admitting `attempt_id` reads, in one statement (hot_path.call_for_attempt)."""
    found = hot_path.call_for_attempt(call_id, request.tenant_ids, attempt_id=attempt_id)
    if found is None:
        raise Http404("no call with this id")
    return found


@api.post("/tasks", response={200: TaskOut, 201: TaskOut, **ERRORS}, tags=["tasks"], **TYPED)
def create_task(request, payload: TaskIn):
    tenant = _tenant(request, payload.tenant)
    budget = payload.budget.model_dump() if payload.budget else {}
    task, created = tasks.task_create(
        tenant=tenant,
        external_id=payload.external_id,
        agent=payload.agent,
        goal=payload.goal,
        budget=budget,
        actor=_actor(request),
    )
    return Status(201 if created else 200, task_summary(task))


@api.get("/tasks", response={200: TaskOut, **ERRORS}, tags=["tasks"], **TYPED)
def find_task(request, tenant: Text, external_id: Text):
    owner = _tenant(request, tenant)
    task = get_object_or_404(Task.objects.select_related("tenant"), tenant=owner, external_id=external_id)
    return Status(200, task_summary(task))


@api.get("/tasks/{id:task_id}", response={200: TaskOut, **ERRORS}, tags=["tasks"], **TYPED)
def get_task(request, task_id: int):
    return Status(200, task_summary(_task(request, task_id)))


@api.post("/tasks/{id:task_id}/complete", response={200: TaskOut, **ERRORS}, tags=["tasks"], **TYPED)
def complete_task(request, task_id: int, payload: CompleteIn):
    task = tasks.task_complete(
        task=_task(request, task_id), summary=payload.summary, deliverable=payload.deliverable, actor=_actor(request)
    )
    return Status(200, task_summary(task))


@api.post("/tasks/{id:task_id}/abandon", response={200: TaskOut, **ERRORS}, tags=["tasks"], **TYPED)
def abandon_task(request, task_id: int, payload: AbandonIn):
    task = tasks.task_abandon(task=_task(request, task_id), reason=payload.reason, actor=_actor(request))
    return Status(200, task_summary(task))


@api.post(
    "/tasks/{id:task_id}/calls",
    response={200: CallAdmittedOut, 201: CallAdmittedOut, **ERRORS},
    tags=["calls"],
    **TYPED,
)
def add_call(request, task_id: int, payload: CallIn):
    task, actor = _task(request, task_id), _actor(request)
    with one_transaction(payload.admit is not None):  # API 1.2: registration and admission commit together
        added = calls.call_add(
            task=task,
            step_index=payload.step,
            depends_on=payload.depends_on,
            tool_name=payload.tool,
            arguments=payload.arguments,
            idempotency_key=payload.idempotency_key,
            actor=actor,
            compensation=payload.compensation.model_dump() if payload.compensation else None,
            admitting=payload.admit is not None,
        )
        admitted = admit_added(request, added, payload.admit, actor) if payload.admit is not None else None
    failure, required_next = calls.preflight_answer(added.call, added.preflight)
    body = {
        "call_id": added.call.pk,
        "created": added.created,
        "state": added.call.state,
        "preflight": {"passed": not added.preflight, "field_errors": field_errors_json(added.preflight)},
        "failure": failure,
        "required_next": required_next,
        "blocked_by": added.blocked_by,
        "blocked_by_steps": added.blocked_by_steps,
        "poll": f"/api/v1/calls/{added.call.pk}",
        "admission": None,
        "not_admitted": None,
    }
    if admitted is not None:
        body.update(admitted)
        answered = admitted["admission"] or admitted["not_admitted"]
        body["state"] = answered["call_state"] if answered else body["state"]
    return written(api, request, 201 if added.created else 200, body, CallAdmittedOut)


@api.get("/calls/{id:call_id}", response={200: CallOut, **ERRORS}, tags=["calls"], **TYPED)
def get_call(request, call_id: int, version: CallVersion | None = None, wait_ms: WaitMs = 0):
    """The call. With `version` (the one last seen) and `wait_ms` (up to 20000), a long poll: the answer comes as
    soon as the call has another version, or after `wait_ms` as it is (its `version` then still the one sent)."""
    if wait_ms and version is None:
        raise Refusal(
            "invalid_request",
            "a long poll waits for a change from a version: send the version you last saw with wait_ms",
            status=422,
            field_errors=[
                {
                    "field": "version",
                    "expected": "the call's version last seen (an integer, 0 or more) when wait_ms is sent",
                    "received": None,
                    "suggestion": "Add version=<the version of your last answer>, or leave wait_ms out.",
                }
            ],
        )
    call = _call(request, call_id)
    if wait_ms and call.version == version:
        watch.wait_for_change(call.pk, version, wait_ms / 1000)
        call = _call(request, call_id)
    return Status(200, call_detail(call))


@api.post(
    "/calls/{id:call_id}/reconcile", response={202: ReconcileAcceptedOut, **ERRORS}, tags=["reconciliation"], **TYPED
)
def reconcile_call(request, call_id: int):
    """Ask for an immediate status check of an UNKNOWN, STILL_UNKNOWN or ACCEPTED call: 202, and where to poll."""
    call = _call(request, call_id)
    if call.state not in RECONCILABLE:
        raise Refusal(
            "not_reconcilable",
            f"the call is {call.state}: only UNKNOWN, STILL_UNKNOWN and ACCEPTED calls are checked with the provider",
            status=409,
            detail={"call_state": call.state},
        )
    queueing.enqueue(jobs.reconcile_call, call.pk, job_id=f"reconcile-call-{call.pk}")
    return Status(
        202,
        {
            "call_id": call.pk,
            "call_state": call.state,
            "checks_made": call.checks_made,
            "poll": f"/api/v1/calls/{call.pk}",
        },
    )


# Provider-facing, not part of the runtime API: signed by the provider, never by a bearer token. Kept out of the
# document the runtime fuzzer reads; tests/test_callbacks.py sends it arbitrary signed and unsigned bodies.
@api.post(
    "/providers/{name}/callbacks",
    auth=None,
    response={200: CallbackOut, 202: CompensationCallbackOut, **ERRORS},
    tags=["reconciliation"],
    include_in_schema=False,
    **TYPED,
)
def provider_callback(request, name: str):
    """A provider's signed callback (docs/reconciliation.md): `Recovery-Signature: t=<unix>,v1=<HMAC of "t.body">`."""
    result = callbacks.callback_receive(
        provider_name=name, raw=request.body, signature=request.headers.get("Recovery-Signature", "")
    )
    if isinstance(result, callbacks.CompensationCallback):
        entry = result.entry
        return Status(
            202,
            {
                "compensation_entry_id": entry.pk,
                "call_id": entry.call_id,
                "entry_state": entry.state,
                "check_brought_forward": result.check_brought_forward,
            },
        )
    receipt = result.receipt
    return Status(
        200,
        {
            "receipt_id": receipt.pk,
            "duplicate": result.duplicate,
            "call_id": receipt.call_id,
            "observed": receipt.observed,
            "applied": receipt.applied and not result.duplicate,
            "call_state": receipt.local_state_after,
        },
    )


@api.post("/calls/{id:call_id}/abandon", response={200: CallOut, **ERRORS}, tags=["calls"], **TYPED)
def abandon_call(request, call_id: int, payload: AbandonIn):
    call = calls.call_abandon(call=_call(request, call_id), actor=_actor(request), reason=payload.reason)
    return Status(200, call_detail(call))


@api.post("/calls/{id:call_id}/gate", response={200: GateOut, **ERRORS}, tags=["attempts"], **TYPED)
def ask_gate(request, call_id: int, payload: CandidateIn):
    if payload.outcome is not None:
        raise Refusal(
            "invalid_request",
            "the gate only answers; report outcomes to .../attempts",
            status=422,
            field_errors=[
                {"field": "outcome", "expected": "absent", "received": None, "suggestion": "Remove the outcome."}
            ],
        )
    call, read = _call_to_admit(request, call_id, payload.attempt_id)
    return Status(200, gate_ask(call=call, read=read, request=_attempt_request(payload), actor=_actor(request)))


@api.post(
    "/calls/{id:call_id}/attempts",
    response={200: AttemptAnswer, 201: AttemptAnswer, **ERRORS, 409: NotAdmittedOut | ErrorOut},
    tags=["attempts"],
    **TYPED,
)
def create_attempt(request, call_id: int, payload: CandidateIn):
    call, read = _call_to_admit(request, call_id, payload.attempt_id)
    refuse_markerless_client(request, call.tool)
    admission = attempt_admit(call=call, read=read, request=_attempt_request(payload), actor=_actor(request))
    if admission.status == 409:
        gate = admission.response["gate"]
        return _error(
            request,
            409,
            "not_admitted",
            gate["public_message"] or gate["reason"],
            field_errors=gate["field_errors"],
            detail=admission.response,
        )
    return written(api, request, admission.status, admission.response, AttemptAnswer)


@api.post(
    "/calls/{id:call_id}/attempts/{attempt_id}/outcome",
    response={200: OutcomeOut, **ERRORS},
    tags=["attempts"],
    **TYPED,
)
def report_outcome(request, call_id: int, attempt_id: AttemptId, payload: OutcomeIn):
    attempt = hot_reads.attempt_for_report(call_id, attempt_id, request.tenant_ids)  # with its call: one statement
    if attempt is None:
        raise Http404("no such attempt of a call of this token's tenants")
    with_alternates(attempt.tool)
    facts = facts_of(payload.model_dump(exclude_unset=True))
    answer = attempt_report(call=attempt.call, attempt=attempt, facts=facts, actor=_actor(request))
    return written(api, request, 200, answer, OutcomeOut)


@api.get("/capabilities", response={200: CapabilitiesOut, **ERRORS}, tags=["tasks"], **TYPED)
def capabilities(request, tenant: Text):
    owner = _tenant(request, tenant)
    return Status(
        200,
        {
            "tenant": owner.name,
            "tools": [
                {
                    "name": t.name,
                    "side_effect": t.side_effect,
                    "risk": t.risk,
                    "description": t.description,
                    "args_schema": t.args_schema,
                    "replay_safe": t.replay_safe,
                }
                for t in allowed_tools(owner)
            ],
        },
    )


# --- sagas (docs/compensation.md) -------------------------------------------------------------------------------------


def _saga(task: Task) -> dict:
    view = sagas.saga_view(task)
    entry = view.next_entry
    following = None
    if entry is not None:
        following = {
            "compensation_id": entry.compensation_id,
            "call_id": entry.call_id,
            "step": entry.call.step.index,
            "tool": entry.tool.name,
            "arguments": entry.arguments,
            "idempotency_key": entry.idempotency_key,
            "state": entry.state,
            "attempts_made": entry.attempts_count,
            "max_attempts": entry.max_attempts,
        }
    return {
        "task_id": task.pk,
        "saga": view.state,
        "executor": view.executor,
        "outcome": task.outcome or None,
        "waiting_for": list(view.waiting_for),
        "next": following,
        "stopped_at": view.stopped_at,
        "poll": f"/api/v1/tasks/{task.pk}/compensation",
    }


@api.post("/tasks/{id:task_id}/compensate", response={202: SagaOut, **ERRORS}, tags=["sagas"], **TYPED)
def compensate_task(request, task_id: int, payload: SagaAbortIn):
    """Abort the task as a saga: no new calls, READY and RETRYABLE calls abandoned, unknown steps settled first,
    committed steps undone one at a time in reverse dependency order — by the console's worker or by the runtime."""
    task = sagas.saga_abort(
        task=_task(request, task_id), executor=payload.executor, reason=payload.reason, actor=_actor(request)
    )
    return Status(202, _saga(task))


@api.get("/tasks/{id:task_id}/compensation", response={200: SagaOut, **ERRORS}, tags=["sagas"], **TYPED)
def task_compensation(request, task_id: int):
    """Where the task's saga stands, and the next compensation to send when the runtime executes them."""
    return Status(200, _saga(_task(request, task_id)))


def _entry(request, compensation_id: str):
    entry = entry_of(compensation_id, request.tenant_ids)
    if entry is None:
        raise Http404("no compensation with this id")
    return entry


@api.post(
    "/compensations/{compensation_id}/attempts",
    response={200: CompensationAttemptOut, 201: CompensationAttemptOut, **ERRORS},
    tags=["sagas"],
    **TYPED,
)
def admit_compensation(request, compensation_id: Text, payload: CompensationAttemptIn):
    """Admit the runtime's attempt of a compensation it executes (201; a repeat answers 200 with the same)."""
    status, body = compensation_admit(
        _entry(request, compensation_id), attempt_id=payload.attempt_id, actor=_actor(request)
    )
    return Status(status, body)


@api.post(
    "/compensations/{compensation_id}/attempts/{attempt_id}/outcome",
    response={200: CompensationAttemptOut, **ERRORS},
    tags=["sagas"],
    **TYPED,
)
def report_compensation(request, compensation_id: Text, attempt_id: AttemptId, payload: OutcomeIn):
    """What happened to the runtime's send of a compensation: read by the same table as any write."""
    wire = payload.model_dump(mode="json", exclude_unset=True)  # as the worker's own send reads it: JSON
    entry = _entry(request, compensation_id)
    return Status(200, compensation_report(entry, attempt_id=attempt_id, wire=wire, actor=_actor(request)))


# --- metrics (docs/metrics.md) ----------------------------------------------------------------------------------------


@api.get("/metrics", auth=TokenAuth(scopes=SCOPES), response={200: MetricsOut, **ERRORS}, tags=["metrics"], **TYPED)
def metrics(request, window: MetricsWindow = DEFAULT_WINDOW, tool: Text | None = None, tenant: Text | None = None):
    """The figures of docs/metrics.md over a window (24h, 7d or 30d), summed over the token's tenants (or for the one
    named by `tenant`), for every tool or the one named by `tool`; runtime and metrics tokens alike. Counts come from
    the rollups the metrics fold keeps (`folded_at`, `lag_s` say how recent); `queues` are the sizes now."""
    tenant_ids, tool_id = metrics_scope(request.api_token, tenant=tenant, tool=tool)
    report = metrics_report(now=timezone.now(), window=window, tool_id=tool_id, tenant_ids=tenant_ids)
    return Status(200, metrics_answer(report))

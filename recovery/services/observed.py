"""Observed calls (docs/otlp-ingest.md): OpenTelemetry `execute_tool` spans recorded as calls and their attempts.
Each span goes through the admission service itself, so what the gate would have answered is stored with it; one span
is one transaction, stored once per (tenant, trace id, span id), and its state changes go through transition_call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.utils import timezone

from recovery.api.otlp_decode import KEY_PATTERN, Batch, RejectedSpan, ToolSpan
from recovery.audit.chain import Actor, appends_at_commit
from recovery.engine.fingerprint import fingerprint
from recovery.engine.states import CallState
from recovery.engine.types import TIME_ELAPSED
from recovery.models import (
    Attempt,
    Call,
    ObservedSpan,
    ObservedTally,
    ObservedTool,
    SideEffect,
    SpanOutcome,
    Step,
    Task,
    TaskStatus,
    Tenant,
    Tool,
)
from recovery.providers.requests import TemplateError, filled_key
from recovery.registry import tool_policy
from recovery.selectors.tasks_calls import allowed_tools
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.calls import call_insert
from recovery.services.errors import Refusal, field_errors_json
from recovery.services.outcomes import facts_of
from recovery.services.tasks import task_create
from recovery.statemachine.hot_path import call_for_attempt
from recovery.statemachine.transitions import TransitionConflict

S = CallState
RESENT = "resent"  # a span stored before (an exporter's resend): nothing changes
TRIES = 3  # a span that lost a race (the same call moved by another request) is recorded again, up to this often
SHOWN_REJECTIONS = 10  # rejections named one by one in the answer's message


@dataclass(kw_only=True)
class IngestReport:
    """What became of a request's spans, for the OTLP answer (`partial_success`) and for tests."""

    outcomes: Counter = field(default_factory=Counter)  # SpanOutcome values and RESENT
    unknown_tools: list[str] = field(default_factory=list)
    rejected: list[RejectedSpan] = field(default_factory=list)
    ignored: int = 0

    def message(self) -> str:
        """The answer's error_message: the rejections, then what was not recorded as a plain observed call."""
        parts = []
        if self.rejected:
            shown = "; ".join(
                f"span {r.trace_id}/{r.span_id} {r.field}: {r.problem}" for r in self.rejected[:SHOWN_REJECTIONS]
            )
            more = len(self.rejected) - SHOWN_REJECTIONS
            parts.append(f"{_n(len(self.rejected), 'span')} rejected: {shown}" + (f"; {more} more" if more > 0 else ""))
        if self.ignored:
            parts.append(f"{_n(self.ignored, 'span')} without gen_ai.operation.name execute_tool counted and ignored")
        if self.unknown_tools:
            names = ", ".join(sorted(set(self.unknown_tools)))
            parts.append(
                f"{_n(len(self.unknown_tools), 'span')} of tools not registered for the tenant recorded: {names}"
            )
        if duplicates := self.outcomes[SpanOutcome.POSSIBLE_DUPLICATE]:
            parts.append(f"{_n(duplicates, 'repeated write')} sent to human review as possible duplicates")
        if resent := self.outcomes[RESENT]:
            parts.append(f"{_n(resent, 'span')} already stored (a resent batch): kept once")
        return " | ".join(parts)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def spans_ingest(*, batch: Batch, tenants: list[Tenant], actor: Actor) -> IngestReport:
    """Record a request's tool spans (in start-time order), count its other spans per tenant; `tenants`: the
    token's. A span refused here is rejected alone; the others are stored."""
    by_name = {tenant.name: tenant for tenant in tenants}
    only = tenants[0] if len(tenants) == 1 else None
    report = IngestReport(rejected=list(batch.rejected), ignored=sum(batch.ignored.values()))
    tools: dict[int, dict[str, Tool]] = {}
    for span in batch.tool_spans:
        tenant = by_name.get(span.tenant) if span.tenant is not None else only
        if tenant is None:
            report.rejected.append(_tenant_refusal(span, len(tenants)))
            continue
        if tenant.pk not in tools:
            tools[tenant.pk] = {tool.name: tool for tool in allowed_tools(tenant)}
        try:
            outcome = _record_retrying(span, tenant, tools[tenant.pk].get(span.tool), actor)
        except Refusal as exc:
            fields = field_errors_json(exc.field_errors)
            name = fields[0]["field"] if fields else "span"
            report.rejected.append(
                RejectedSpan(trace_id=span.trace_id, span_id=span.span_id, field=name, problem=exc.message)
            )
            continue
        report.outcomes[outcome] += 1
        if outcome == SpanOutcome.UNKNOWN_TOOL:
            report.unknown_tools.append(span.tool)
    _count_ignored(batch.ignored, by_name, only)
    return report


def _tenant_refusal(span: ToolSpan, held: int) -> RejectedSpan:
    if span.tenant is not None:
        problem = f"this token is not scoped to tenant {span.tenant!r}"
    else:
        problem = f"required: this token is scoped to {held} tenants, name the span's (resource attribute)"
    return RejectedSpan(trace_id=span.trace_id, span_id=span.span_id, field="recovery.tenant", problem=problem)


def _record_retrying(span: ToolSpan, tenant: Tenant, tool: Tool | None, actor: Actor) -> str:
    for attempt in range(TRIES):
        try:
            return _record(span, tenant, tool, actor)
        except (TransitionConflict, IntegrityError) as exc:
            lost = exc
        except Refusal as exc:
            if exc.status != 409 or attempt == TRIES - 1:
                raise
            lost = exc
    raise Refusal("conflict", f"the span lost {TRIES} races with concurrent writes: send it again ({lost})", status=409)


def _record(span: ToolSpan, tenant: Tenant, tool: Tool | None, actor: Actor) -> str:
    """One span, in one transaction: its task, its row, its call and attempt (or only its row), the tally.

    The span's row is inserted first: a concurrent request with the same span waits on its unique key, then fails
    (IntegrityError: all it did is rolled back) and, tried again, finds the span stored. So no other request ever
    reports this span's attempt, and admission never answers it from a stored one after rolling back a race."""
    if ObservedSpan.objects.filter(tenant=tenant, trace_id=span.trace_id, span_id=span.span_id).exists():
        return RESENT
    span = _with_template_key(span, tool)
    now = timezone.now()
    with transaction.atomic(), appends_at_commit():
        task = _task(span, tenant, actor)
        row = _claim(span, tenant, task, now)
        row.outcome = _report(span, row, task, tool, actor) if tool is not None else SpanOutcome.UNKNOWN_TOOL
        row.save(update_fields=["call", "attempt", "outcome"])
        _tally(span, tenant, tool, now)
    return row.outcome


def _with_template_key(span: ToolSpan, tool: Tool | None) -> ToolSpan:
    """The span with the key its tool's registry template gives it, scoped to the trace (`<trace id>:<filled>`, as a
    recovered tool scopes its keys to its task), when it names no key of its own and its arguments fill the template
    into a valid key; else the span as it is (its derived key: recovery.api.otlp_decode.ToolSpan.derived_key)."""
    if tool is None or not tool.key_template or span.idempotency_key is not None or span.arguments is None:
        return span
    try:
        key = f"{span.trace_id}:{filled_key(tool.key_template, span.arguments)}"
    except TemplateError:
        return span  # an argument the template names is missing
    return replace(span, template_key=key) if KEY_PATTERN.match(key) else span


def _task(span: ToolSpan, tenant: Tenant, actor: Actor) -> Task:
    """The trace's task: found by (tenant, trace id), or created for it (task_create answers the existing one)."""
    goal = f"the tool calls of OpenTelemetry trace {span.trace_id}, as the runtime reported them"
    try:
        task, _ = task_create(
            tenant=tenant, external_id=span.trace_id, agent=span.agent, goal=goal, budget={}, actor=actor
        )
    except Refusal as exc:
        if exc.code != "task_exists":
            raise
        task = Task.objects.get(pk=exc.detail["existing_task"])  # made by the API, or for another agent
    return task


def _claim(span: ToolSpan, tenant: Tenant, task: Task, now: datetime) -> ObservedSpan:
    row = ObservedSpan(
        tenant=tenant,
        trace_id=span.trace_id,
        span_id=span.span_id,
        task=task,
        agent=span.agent,
        tool_name=span.tool,
        tool_call_id=span.tool_call_id,
        idempotency_key=span.key,
        has_arguments=span.arguments is not None,
        outcome=SpanOutcome.RECORDED,
        started_at=span.started_at,
        received_at=now,
    )
    row.save(force_insert=True)
    return row


@dataclass(frozen=True)
class _Intent:
    """A call that already carries a span's intent, as much of it as deciding needs."""

    pk: int
    observed: bool
    attempts_count: int


def _report(span: ToolSpan, row: ObservedSpan, task: Task, tool: Tool, actor: Actor) -> str:
    """The span's call (an existing one whose intent it repeats, or a new observed one) and its attempt."""
    existing = _same_intent(span, row.tenant, tool)
    if existing is not None and not existing.observed and existing.attempts_count:
        row.call_id = existing.pk  # the trace of an attempt admission already recorded
        return SpanOutcome.PROTECTED
    if existing is None and task.status != TaskStatus.OPEN:
        raise Refusal("task_closed", f"the trace's task {task.pk} is {task.status}: no new calls", status=409)
    row.call_id = existing.pk if existing else _observed_call(span, task, tool, actor).pk
    call, read = call_for_attempt(row.call_id, [row.tenant_id], attempt_id=span.attempt_id)
    request = AttemptRequest(
        attempt_id=span.attempt_id,
        arguments=span.arguments,
        evidence=(TIME_ELAPSED,) if call.attempts_count else (),  # an observed retry: judged on its backoff
        outcome=facts_of(span.facts),
        arguments_known=span.arguments is not None,
    )
    attempt_admit(call=call, read=read, request=request, actor=actor)
    row.attempt, bypassed = _attempt_of(call, span.attempt_id)
    repeated = existing is not None and bypassed and call.side_effect == SideEffect.WRITE
    return SpanOutcome.POSSIBLE_DUPLICATE if repeated else SpanOutcome.RECORDED


_INTENT = ("pk", "observed", "attempts_count")


def _same_intent(span: ToolSpan, tenant: Tenant, tool: Tool) -> _Intent | None:
    """The call that already carries this span's intent: the same key, or — for a write whose arguments the span
    names — an observed call with the same fingerprint that has not failed for good (the oldest)."""
    by_key = Call.objects.filter(tenant=tenant, tool=tool, idempotency_key=span.key).values_list(*_INTENT)[:1]
    if by_key or span.arguments is None or tool.side_effect != SideEffect.WRITE:
        return _Intent(*by_key[0]) if by_key else None
    print_ = fingerprint(tool.name, span.arguments)
    same = Call.objects.filter(tenant=tenant, tool=tool, fingerprint=print_, observed=True)
    found = same.exclude(state=S.FAILED_PERMANENT).order_by("pk").values_list(*_INTENT)[:1]
    return _Intent(*found[0]) if found else None


def _observed_call(span: ToolSpan, task: Task, tool: Tool, actor: Actor) -> Call:
    """A new observed call in a step of its own, READY until its attempt moves it (recovery.statemachine.transitions). A
    concurrent span of the same trace taking the same step, or a call with the same key, is a conflict: the span is
    recorded again (and then finds that call)."""
    policy = tool_policy(tool)
    arguments = span.arguments if span.arguments is not None else {}
    index = (Step.objects.filter(task=task).aggregate(last=Max("index"))["last"] or 0) + 1
    print_ = fingerprint(tool.name, arguments)
    try:
        with transaction.atomic():
            step = Step.objects.create(task=task, index=index, name=span.tool[:200])
            call = call_insert(
                task=task,
                step=step,
                tool=tool,
                idempotency_key=span.key,
                arguments=arguments,
                fingerprint=print_,
                max_attempts=policy.budgets.max_attempts,
                actor=actor,
                reason=f"{tool.name} step {index}, observed in trace {span.trace_id}",
                evidence={
                    "observed": {
                        "trace_id": span.trace_id,
                        "span_id": span.span_id,
                        "arguments": span.arguments is not None,
                    }
                },
                observed=True,
            )
            if call is None:  # the key taken meanwhile: the step goes with the savepoint
                raise IntegrityError(f"call key {span.key!r}")
    except IntegrityError:
        raise Refusal("conflict", "another request recorded this step or key at the same moment", status=409) from None
    return call


def _attempt_of(call: Call, attempt_id: str) -> tuple[Attempt, bool]:
    rows = Attempt.objects.filter(call_id=call.pk, attempt_id=attempt_id)
    pk, bypassed = rows.values_list("pk", "policy_bypassed").get()
    return Attempt(pk=pk, call_id=call.pk, attempt_id=attempt_id, policy_bypassed=bypassed), bypassed


def _tally(span: ToolSpan, tenant: Tenant, tool: Tool | None, now: datetime) -> None:
    """One more span of this runtime's tool, last in the span's transaction (its row is locked only to the commit)."""
    rows = ObservedTool.objects.filter(tenant=tenant, agent=span.agent, tool_name=span.tool)
    if rows.update(spans=F("spans") + 1, last_seen_at=now, tool=tool):
        return
    try:
        with transaction.atomic():
            ObservedTool.objects.create(
                tenant=tenant, agent=span.agent, tool_name=span.tool, tool=tool, spans=1, last_seen_at=now
            )
    except IntegrityError:  # a concurrent first span of the same tool made the row
        rows.update(spans=F("spans") + 1, last_seen_at=now, tool=tool)


def _count_ignored(ignored: Counter, by_name: dict[str, Tenant], only: Tenant | None) -> None:
    """Add the spans without GenAI attributes to their tenants' counters (a tenant the token holds, or its only one)."""
    now = timezone.now()
    per_tenant: Counter = Counter()
    for name, count in ignored.items():
        tenant = by_name.get(name) if name is not None else only
        if tenant is not None:
            per_tenant[tenant.pk] += count
    for tenant_id, count in per_tenant.items():
        rows = ObservedTally.objects.filter(tenant_id=tenant_id)
        if rows.update(spans_ignored=F("spans_ignored") + count, updated_at=now):
            continue
        try:
            with transaction.atomic():
                ObservedTally.objects.create(tenant_id=tenant_id, spans_ignored=count, updated_at=now)
        except IntegrityError:
            rows.update(spans_ignored=F("spans_ignored") + count, updated_at=now)

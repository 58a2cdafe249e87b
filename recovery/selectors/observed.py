"""What the console shows of observed calls (docs/otlp-ingest.md): a call's or a task's spans, what admission would
have answered, and which tools each runtime calls under admission's protection. A fixed number of statements each.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Exists, OuterRef

from recovery.models import Call, GateDecision, ObservedSpan, ObservedTally, ObservedTool, SpanOutcome

TASK_SPANS = 200  # a task page lists its trace's first spans, this many
RUNTIME_TOOLS = 200  # the breakers page's runtimes section: the tools seen most recently, this many

OBSERVED = "observed (from traces)"  # how the console marks an observed call, wherever it shows one


@dataclass(frozen=True, kw_only=True)
class AdmissionAnswer:
    """What admission answered, or would have answered, to an attempt: stored with it as a GateDecision."""

    allowed: bool
    reason: str

    @property
    def text(self) -> str:
        if self.allowed:
            return f"admission would have allowed it ({self.reason})"
        return f"admission would have refused it ({self.reason}): policy bypassed"


def admission_of(gate: GateDecision) -> AdmissionAnswer:
    return AdmissionAnswer(allowed=gate.allowed, reason=gate.reason)


def admission_answers(call_ids: Iterable[int]) -> dict[int, AdmissionAnswer]:
    """Per call, the answer stored with its latest attempt (one statement; none for no ids)."""
    ids = sorted(set(call_ids))
    if not ids:
        return {}
    rows = (
        GateDecision.objects.filter(call_id__in=ids, attempt__isnull=False, dry_run=False)
        .order_by("call_id", "pk")
        .values_list("call_id", "allowed", "reason")
    )
    return {call_id: AdmissionAnswer(allowed=allowed, reason=reason) for call_id, allowed, reason in rows}


def call_spans(call: Call) -> list[ObservedSpan]:
    """The spans an observed call was recorded from, oldest first (no statement for a call that is not observed)."""
    if not call.observed:
        return []
    return list(ObservedSpan.objects.filter(call_id=call.pk).order_by("started_at", "pk"))


@dataclass(frozen=True, kw_only=True)
class TaskObservation:
    observed_calls: dict[int, AdmissionAnswer | None]  # the task's observed calls, with their latest answer
    spans: list[ObservedSpan]  # the task's trace, span by span (TASK_SPANS at most)
    more_spans: bool

    @property
    def unknown_tools(self) -> list[str]:
        return sorted({s.tool_name for s in self.spans if s.outcome == SpanOutcome.UNKNOWN_TOOL})


def task_observation(task_id: int) -> TaskObservation:
    """The task's observed calls and the spans of its trace (three statements)."""
    observed = list(Call.objects.filter(task_id=task_id, observed=True).values_list("pk", flat=True))
    answers = admission_answers(observed)
    spans = list(
        ObservedSpan.objects.filter(task_id=task_id)
        .select_related("call")
        .order_by("started_at", "pk")[: TASK_SPANS + 1]
    )
    return TaskObservation(
        observed_calls={pk: answers.get(pk) for pk in observed},
        spans=spans[:TASK_SPANS],
        more_spans=len(spans) > TASK_SPANS,
    )


# --- runtimes -------------------------------------------------------------------------------------------------------

PROTECTED, OBSERVED_ONLY, NOT_REGISTERED = "protected", "observed only", "not in the registry"


@dataclass(frozen=True, kw_only=True)
class RuntimeTool:
    name: str
    tool_id: int | None
    spans: int
    last_seen_at: datetime
    standing: str  # PROTECTED, OBSERVED_ONLY or NOT_REGISTERED


@dataclass(kw_only=True)
class Runtime:
    tenant: str
    agent: str
    tools: list[RuntimeTool] = field(default_factory=list)
    ignored: int = 0  # the tenant's spans without GenAI attributes (a per-tenant count)

    def of(self, standing: str) -> list[RuntimeTool]:
        return [tool for tool in self.tools if tool.standing == standing]


def runtimes() -> list[Runtime]:
    """Each runtime seen in traces, by tenant and agent, with the tools it was seen calling: protected when it has
    also called the tool under admission (a call of it that is not observed, in a task of that agent), observed only
    when not, or not in the registry. The RUNTIME_TOOLS most recently seen tools."""
    protected = Call.objects.filter(
        tenant_id=OuterRef("tenant_id"),
        tool_id=OuterRef("tool_id"),
        task__agent=OuterRef("agent"),
        observed=False,
        attempts_count__gt=0,
    )
    rows = (
        ObservedTool.objects.select_related("tenant")
        .annotate(protected=Exists(protected))
        .order_by("-last_seen_at", "pk")[:RUNTIME_TOOLS]
    )
    ignored = dict(ObservedTally.objects.values_list("tenant_id", "spans_ignored"))
    found: dict[tuple[str, str], Runtime] = {}
    for row in rows:
        runtime = found.setdefault(
            (row.tenant.name, row.agent),
            Runtime(tenant=row.tenant.name, agent=row.agent, ignored=ignored.get(row.tenant_id, 0)),
        )
        standing = NOT_REGISTERED if row.tool_id is None else PROTECTED if row.protected else OBSERVED_ONLY
        runtime.tools.append(
            RuntimeTool(
                name=row.tool_name,
                tool_id=row.tool_id,
                spans=row.spans,
                last_seen_at=row.last_seen_at,
                standing=standing,
            )
        )
    for runtime in found.values():
        runtime.tools.sort(key=lambda tool: tool.name)
    return sorted(found.values(), key=lambda runtime: (runtime.tenant, runtime.agent))

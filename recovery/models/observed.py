"""OpenTelemetry trace ingest (docs/otlp-ingest.md): spans recorded as observed calls (recovery.services.observed), the
per-runtime tool counts and the tally of ignored spans."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from recovery.models.calls import Attempt, Call
from recovery.models.registry import Tenant, Tool
from recovery.models.tasks import Task


class SpanOutcome(models.TextChoices):
    RECORDED = "recorded"  # an observed call's attempt, reported after the fact
    POSSIBLE_DUPLICATE = "possible_duplicate"  # another execution of an observed write's intent: human review
    PROTECTED = "protected"  # the span of a call admission already knows (its key): linked, nothing added
    UNKNOWN_TOOL = "unknown_tool"  # no registry entry among the tenant's tools: recorded with its name, no call


class ObservedSpan(models.Model):
    """One `execute_tool` span as received, stored once per (tenant, trace id, span id) however often an exporter
    resends it, with what it became: the call and attempt it reported, or only its tool's name."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    trace_id = models.CharField(max_length=32)  # lowercase hex, as OTLP/JSON writes it
    span_id = models.CharField(max_length=16)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="observed_spans")  # the trace's task
    call = models.ForeignKey(Call, null=True, blank=True, on_delete=models.PROTECT, related_name="observed_spans")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    agent = models.CharField(max_length=200)  # gen_ai.agent.name, else the resource's service.name
    tool_name = models.CharField(max_length=200)  # gen_ai.tool.name, registered or not
    tool_call_id = models.CharField(max_length=200, blank=True)  # gen_ai.tool.call.id
    idempotency_key = models.CharField(max_length=255, blank=True)  # the span's own (attribute or derived)
    has_arguments = models.BooleanField(default=False)  # gen_ai.tool.call.arguments was in the span
    outcome = models.CharField(max_length=24, choices=SpanOutcome.choices)
    started_at = models.DateTimeField(null=True, blank=True)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "trace_id", "span_id"], name="observed_span_unique"),
        ]
        indexes = [models.Index(fields=["task", "started_at"], name="observed_span_task_idx")]

    def __str__(self) -> str:
        return f"span {self.trace_id}/{self.span_id} ({self.tool_name}: {self.outcome})"


class ObservedTool(models.Model):
    """Per tenant, runtime (agent) and tool name: how many `execute_tool` spans arrived, and when the last did. Kept
    by the ingest in each span's transaction, so the per-runtime view reads a row per tool, not the spans."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    agent = models.CharField(max_length=200)
    tool_name = models.CharField(max_length=200)
    tool = models.ForeignKey(Tool, null=True, blank=True, on_delete=models.PROTECT, related_name="+")  # None: unknown
    spans = models.PositiveBigIntegerField(default=0)
    last_seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "agent", "tool_name"], name="observed_tool_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.agent}: {self.tool_name} ({self.spans} spans)"


class ObservedTally(models.Model):
    """Per tenant, the spans that arrived without the GenAI `execute_tool` attributes: counted, otherwise ignored."""

    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, related_name="+")
    spans_ignored = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.spans_ignored} spans ignored"

"""Metrics (docs/metrics.md): rollups and totals folded from the audit sequence (recovery.services.metrics), the
per-call marks and the fold's watermark."""

from __future__ import annotations

from django.db import models

from recovery.models.calls import Call


class MetricRollup(models.Model):
    """A count of one series (recovery.engine.metrics) in one period (an hour or a day), for one tenant and one tool.

    tenant_id 0 is every tenant's sum (what a page without a tenant filter reads, so its cost does not grow with the
    number of tenants); tool_id 0 is "about no tool" (tasks) and -1 (ALL_TOOLS) every tool's sum, those about no tool
    included (what a page without a tool filter reads, so its cost does not grow with the number of tools either).
    Plain integers, not foreign keys: a sum has no row to point at, and rollups outlive any retention of the rows they
    were counted from. Never pruned.
    """

    period = models.PositiveIntegerField()  # 3600 or 86400 seconds
    start = models.BigIntegerField()  # epoch seconds, a multiple of `period` (UTC)
    tenant_id = models.PositiveIntegerField(default=0)
    tool_id = models.IntegerField(default=0)
    series = models.CharField(max_length=32)
    label = models.CharField(max_length=100, blank=True)
    value = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["period", "tenant_id", "start", "tool_id", "series", "label"], name="metric_rollup_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.series}[{self.label}] @ {self.start}/{self.period}: {self.value}"


class MetricTotal(models.Model):
    """A series' count since the beginning, for one tenant (0: all) and one tool (0: none): what `/metrics` exports as
    Prometheus counters — monotonic, the same from every web process, read without summing history."""

    tenant_id = models.PositiveIntegerField(default=0)
    tool_id = models.PositiveIntegerField(default=0)
    series = models.CharField(max_length=32)
    label = models.CharField(max_length=100, blank=True)
    value = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "tool_id", "series", "label"], name="metric_total_key")
        ]

    def __str__(self) -> str:
        return f"{self.series}[{self.label}] tenant {self.tenant_id} tool {self.tool_id}: {self.value}"


class MetricCallMark(models.Model):
    """What the fold remembers about one call (recovery.engine.metrics.CallMark): its cohort hour and the first
    sightings it already counted, so that each call counts once in each rate."""

    call = models.OneToOneField(Call, primary_key=True, on_delete=models.PROTECT, related_name="+")
    cohort = models.BigIntegerField(null=True)
    attempts = models.PositiveIntegerField(default=0)
    unknown = models.BooleanField(default=False)
    settled = models.BooleanField(default=False)
    human = models.BooleanField(default=False)
    duplicate = models.BooleanField(default=False)
    committed = models.BooleanField(default=False)
    queue = models.CharField(max_length=16, blank=True)
    queue_since = models.DateTimeField(null=True)
    claimed = models.BooleanField(default=False)  # first claim in its queue counted (time to first claim)

    def __str__(self) -> str:
        return f"metrics of call {self.call_id}"


class MetricFold(models.Model):
    """The fold's watermark: every audit event up to `seq` is in the rollups. One row (key "audit"), locked by the
    fold while it runs, so two schedulers' folds never count an event twice."""

    key = models.CharField(max_length=16, unique=True)
    seq = models.BigIntegerField(default=0)
    open_breakers = models.JSONField(default=dict, blank=True)  # tool id -> epoch seconds it opened, while open
    events = models.BigIntegerField(default=0)  # events folded, in all
    folded_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"metrics folded to #{self.seq}"

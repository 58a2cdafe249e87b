"""Duplicate probes (docs/replay.md): a committed call replayed with its original key on a test tenant, and what the
provider's ledger said about it."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from recovery.models.calls import Call
from recovery.models.registry import Tool


class ProbeDecision(models.TextChoices):
    SAFE = "retry_path_safe"
    UNSAFE = "retry_path_unsafe"
    INCONCLUSIVE = "inconclusive"  # the provider's ledger could not be read: the retry path is left as it was


class DuplicateProbe(models.Model):
    """A duplicate probe (docs/replay.md): a COMMITTED call replayed with its original key on a test tenant, and what
    the provider's own ledger said about the key afterwards. A receipt of its own: never an attempt, it moves no call.
    """

    call = models.ForeignKey(Call, on_delete=models.PROTECT, related_name="duplicate_probes")
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="duplicate_probes")
    action = models.ForeignKey("ActionRequest", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    idempotency_key = models.CharField(max_length=255)
    key_age_s = models.PositiveIntegerField()  # how old the key was when probed: what a safe probe covers
    provider_base_url = models.URLField(max_length=500)
    first = models.CharField(max_length=32)  # the call's state: COMMITTED
    second = models.CharField(max_length=32)  # idempotent_replay, new_effect, new_business_id, key_unknown, ...
    http_status = models.PositiveIntegerField(null=True, blank=True)
    first_business_id = models.CharField(max_length=255, blank=True)
    second_business_id = models.CharField(max_length=255, blank=True)
    expected_effects = models.PositiveIntegerField(default=1)
    observed_effects = models.PositiveIntegerField(null=True, blank=True)
    downstream_audit = models.CharField(max_length=32)  # one_effect, second_effect, key_missing, unreadable
    decision = models.CharField(max_length=24, choices=ProbeDecision.choices)
    detail = models.TextField()
    request = models.JSONField(default=dict, blank=True)  # the replay and the ledger query, secrets masked
    response = models.JSONField(default=dict, blank=True)  # both answers, redacted
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["tool", "created_at"], name="probe_tool_idx"),
            models.Index(fields=["call", "created_at"], name="probe_call_idx"),
        ]

    def __str__(self) -> str:
        return f"probe {self.pk} of {self.idempotency_key}: {self.decision}"

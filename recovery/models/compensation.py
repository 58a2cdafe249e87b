"""The compensation ledger (docs/compensation.md): the entries that undo a call's committed effects, their attempts and
their receipts."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from recovery.engine.compensation_states import OPEN as OPEN_ENTRY_STATES
from recovery.engine.compensation_states import EntryState
from recovery.engine.reconcile import Observation
from recovery.models.base import _choices
from recovery.models.calls import Call, ReceiptSource
from recovery.models.registry import Tool


class CompensationEntry(models.Model):
    """One entry of a call's compensation ledger (docs/compensation.md): the undo of a committed effect, as its own side
    effect.

    It has its own key (derived from the original key and the entry number, never regenerated), its own tool and
    arguments (the registry's template filled from the original call), its own states
    (recovery.engine.compensation_states, written by `recovery.statemachine.transitions.transition_entry` alone and
    guarded by a trigger), attempts and receipts. At most one entry of a call is open at a time (a partial unique
    index), and the original call stays COMPENSATING while it is.
    """

    call = models.ForeignKey(Call, on_delete=models.PROTECT, related_name="compensations")
    number = models.PositiveIntegerField()  # 1..n within the call
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="compensation_entries")
    idempotency_key = models.CharField(max_length=255)
    arguments = models.JSONField(default=dict)
    target = models.CharField(max_length=300)  # what it undoes: "order O-123 (order.create, provider ref O-123)"
    target_version = models.PositiveIntegerField()  # the original call's version when the entry was made
    expected_effect = models.CharField(max_length=300)  # "cancels order O-123: one cancellation"
    expected_effects = models.PositiveIntegerField(default=1)
    state = models.CharField(max_length=16, choices=_choices(EntryState), default=EntryState.PENDING.value)
    version = models.PositiveIntegerField(default=0)
    state_changed_at = models.DateTimeField(default=timezone.now)
    attempts_count = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(null=True, blank=True)  # its own tool's; None: no limit
    provider_ref = models.CharField(max_length=255, blank=True)
    provider_status = models.CharField(max_length=64, blank=True)
    effects_observed = models.PositiveIntegerField(null=True, blank=True)
    undone_amount = models.PositiveBigIntegerField(null=True, blank=True)  # what the provider says it undid
    outcome = models.CharField(max_length=64, blank=True)  # why it ended: refused (not_cancellable), ...
    send_at = models.DateTimeField(null=True, blank=True)  # not_committed: when it may be sent again
    checks_made = models.PositiveIntegerField(default=0)
    next_check_at = models.DateTimeField(null=True, blank=True)
    last_receipt_at = models.DateTimeField(null=True, blank=True)
    executor = models.CharField(max_length=16, default="console")  # who sends it: console (a worker) or runtime
    lease_owner = models.CharField(max_length=100, blank=True)  # a worker sending or checking it
    lease_until = models.DateTimeField(null=True, blank=True)
    requested_by = models.ForeignKey(
        "ActionRequest", null=True, blank=True, on_delete=models.PROTECT, related_name="compensation_entries"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["call", "number"]
        constraints = [
            models.UniqueConstraint(fields=["call", "number"], name="compensation_unique_number"),
            models.UniqueConstraint(fields=["tool", "idempotency_key"], name="compensation_unique_key"),
            # At most one open entry per call: two starts at once make one entry.
            models.UniqueConstraint(
                fields=["call"],
                condition=Q(state__in=sorted(state.value for state in OPEN_ENTRY_STATES)),
                name="compensation_one_open_per_call",
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_check_at"],
                name="compensation_due_check_idx",
                condition=Q(state=EntryState.UNKNOWN.value),
            ),
            models.Index(fields=["state", "state_changed_at"], name="compensation_state_idx"),
        ]

    def __str__(self) -> str:
        return f"compensation {self.number} of call {self.call_id}: {self.state}"

    @property
    def compensation_id(self) -> str:
        return f"comp-{self.call_id}-{self.number}"

    @property
    def side_effect(self) -> str:
        return "write"  # an undo is an effect (what the providers' request templates read)

    def has_attempts_left(self) -> bool:
        return self.max_attempts is None or self.attempts_count < self.max_attempts


class CompensationAttempt(models.Model):
    """One send of a compensation's request and what came back (the outcome facts of docs/design/classification.md,
    redacted)."""

    entry = models.ForeignKey(CompensationEntry, on_delete=models.PROTECT, related_name="attempts")
    number = models.PositiveIntegerField()
    attempt_id = models.CharField(max_length=100, blank=True)  # the runtime's, when the runtime sent it
    request = models.JSONField(default=dict)  # method, url, headers (masked), body
    facts = models.JSONField(default=dict, blank=True)
    http_status = models.PositiveIntegerField(null=True, blank=True)
    error_kind = models.CharField(max_length=32, blank=True)
    error_code = models.CharField(max_length=100, blank=True)
    provider_ref = models.CharField(max_length=255, blank=True)
    # The row of docs/design/classification.md (or "refusal") that read the reply.
    row = models.CharField(max_length=16, blank=True)
    label = models.CharField(max_length=64, blank=True)  # timeout_after_send, refused, ...
    state_after = models.CharField(max_length=16, blank=True)
    sent_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["entry", "number"]
        constraints = [models.UniqueConstraint(fields=["entry", "number"], name="compensation_attempt_unique")]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.entry}"


class CompensationReceipt(models.Model):
    """What one check of a compensation observed (a status query by its key, or an operator's evidence)."""

    entry = models.ForeignKey(CompensationEntry, on_delete=models.PROTECT, related_name="receipts")
    source = models.CharField(max_length=24, choices=ReceiptSource.choices)
    observed = models.CharField(max_length=16, choices=_choices(Observation))
    provider_status = models.CharField(max_length=64, blank=True)
    provider_ref = models.CharField(max_length=255, blank=True)
    effects_observed = models.PositiveIntegerField(null=True, blank=True)
    request = models.JSONField(default=dict, blank=True)
    response = models.JSONField(default=dict, blank=True)
    http_status = models.PositiveIntegerField(null=True, blank=True)
    state_before = models.CharField(max_length=16)
    state_after = models.CharField(max_length=16)
    applied = models.BooleanField(default=False)
    evidence = models.JSONField(default=dict, blank=True)
    checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["entry", "checked_at", "id"]
        indexes = [models.Index(fields=["entry", "checked_at"], name="compensation_receipt_idx")]

    def __str__(self) -> str:
        return f"receipt of {self.entry}: {self.observed}"

"""Circuit breakers (docs/breakers.md, docs/reconciliation.md): a tool's breaker, its outcome buckets and the operators'
force opens and resets, and the breaker of a provider's status endpoint."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from recovery.models.approvals import FourEyesRequest, four_eyes
from recovery.models.registry import Provider, Tool


class BreakerState(models.TextChoices):
    CLOSED = "closed"  # calls flow; outcomes are counted
    OPEN = "open"  # failing fast until the cooldown ends
    HALF_OPEN = "half_open"  # the cooldown ended: a few probes may go through
    FORCED_OPEN = "forced_open"  # an operator opened it; only an operator closes it


class Breaker(models.Model):
    """One circuit breaker per tool, shared by every process (docs/breakers.md).

    State changes are conditional UPDATEs in short transactions; no row lock is ever held across a provider call.
    Outcome counts live in BreakerBucket rows (one per tool and time bucket), upserted without touching this row.
    """

    tool = models.OneToOneField(Tool, on_delete=models.PROTECT, related_name="breaker_row")
    state = models.CharField(max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED)
    opened_at = models.DateTimeField(null=True, blank=True)
    probes_reserved = models.PositiveIntegerField(default=0)
    probe_lease_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.tool_id}: {self.state}"


class BreakerBucket(models.Model):
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="breaker_buckets")
    bucket_start = models.BigIntegerField()  # epoch seconds, a multiple of the policy's bucket_s
    successes = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tool", "bucket_start"], name="breaker_bucket_unique")]

    def __str__(self) -> str:
        return f"{self.tool_id}@{self.bucket_start}: {self.successes}/{self.failures}"


class BreakerOperationKind(models.TextChoices):
    FORCE_OPEN = "force_open"  # protective: one reviewer's confirmation opens it until a reset
    RESET = "reset"  # lets traffic through again: a reviewer requests it, a different approver decides


class BreakerOperationStatus(models.TextChoices):
    REQUESTED = "requested"  # a reset a reviewer asked for with a reason; waits for a second person
    APPLIED = "applied"  # the breaker moved: a force open on its confirmation, a reset on its approval
    REJECTED = "rejected"  # the second person said no (with a reason)
    STALE = "stale"  # the breaker moved since the request: nothing applied, request it again
    EXPIRED = "expired"  # nobody decided before expires_at


class BreakerOperation(FourEyesRequest):
    """An operator's force open or reset of a tool's breaker (docs/breakers.md, docs/actions.md), with the dry run's
    figures as the person saw them. A reset binds to the breaker's row as it was at the request (its state and
    updated_at): if the breaker moved since, the approval applies nothing (stale). Four eyes are a database
    constraint."""

    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="breaker_operations")
    operation = models.CharField(max_length=16, choices=BreakerOperationKind.choices)
    status = models.CharField(max_length=16, choices=BreakerOperationStatus.choices)
    # Created requested (a reset) or applied (a force open): the requester is always there. A reset's approver or
    # rejecter is `decided_by`; a force open has none (one confirmation).
    reason = models.TextField()  # the requester's (for a force open, the one who confirmed it)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    requested_at = models.DateTimeField(default=timezone.now)
    breaker_state = models.CharField(max_length=16, choices=BreakerState.choices)  # stored at the request
    breaker_updated_at = models.DateTimeField(null=True, blank=True)  # the row's at the request; None: no row
    preview = models.JSONField(default=dict, blank=True)  # the dry run's figures (recovery.services.breaker_operations)
    applied_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # a reset request's

    class Meta:
        constraints = [
            four_eyes("breaker_operation_four_eyes"),
            models.CheckConstraint(
                condition=~Q(operation="reset", status__in=["applied", "rejected"]) | Q(decided_by__isnull=False),
                name="breaker_reset_has_decider",
            ),
            # One pending reset per breaker: a second request would only race the first.
            models.UniqueConstraint(fields=["tool"], condition=Q(status="requested"), name="breaker_one_pending_reset"),
        ]
        indexes = [
            models.Index(fields=["tool", "status", "id"], name="breaker_op_tool_idx"),
            models.Index(fields=["status", "expires_at"], name="breaker_op_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.operation} of {self.tool_id}'s breaker: {self.status}"


class StatusBreaker(models.Model):
    """The breaker of one provider's status endpoint (docs/reconciliation.md), separate from its tools' breakers.

    Reconciliation checks consult it before each status query and skip (an `unreachable` receipt) while it is open;
    counts are a fixed window (window_started_at, calls, failures) updated in one short locked transaction per
    check, never across the HTTP request.
    """

    provider = models.OneToOneField(Provider, on_delete=models.PROTECT, related_name="status_breaker_row")
    state = models.CharField(max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED)
    opened_at = models.DateTimeField(null=True, blank=True)
    probe_until = models.DateTimeField(null=True, blank=True)  # half_open: the one probe's lease
    window_started_at = models.DateTimeField(default=timezone.now)
    calls = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"status of {self.provider_id}: {self.state}"

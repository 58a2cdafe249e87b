"""Operator actions under review (docs/console.md, docs/actions.md): an action on one call, and a bulk action on a
frozen selection of calls, item by item."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from recovery.models.approvals import FourEyesRequest, four_eyes
from recovery.models.calls import Attempt, Call


class ActionStatus(models.TextChoices):
    PREVIEWED = "previewed"  # a dry run was shown: nothing requested, nothing sent
    REQUESTED = "requested"  # a reviewer asked for it with a reason; waits for a second person (writes)
    APPROVED = "approved"  # a different person approved it: a worker executes it once
    REJECTED = "rejected"  # the second person said no (with a reason)
    STALE = "stale"  # the call moved (its version) or the plan changed since the preview: preview again
    EXPIRED = "expired"  # nobody decided before expires_at
    WITHDRAWN = "withdrawn"  # the requester took it back before anyone decided
    EXECUTING = "executing"  # one worker claimed it (conditional UPDATE) and holds the lease
    EXECUTED = "executed"  # done; `result` says what happened
    FAILED = "failed"  # the execution could not run (e.g. the gate refused); `result` says why
    INTERRUPTED = "interrupted"  # a worker died mid-execution: the call is reconciled, never re-run


class ActionRequest(FourEyesRequest):
    """One operator action on one call (docs/actions.md): dry run, request, approval, execution — each step an audit
    event.

    The plan (the exact provider request(s), the policy checks, the forbidden actions, the expected effects) is
    stored with its hash and the call's version at preview; approving re-checks both, so an approval can never
    apply to a call that moved since the reviewer looked. Four eyes are a database constraint: the person who
    decides is never the person who requested.
    """

    call = models.ForeignKey(Call, on_delete=models.PROTECT, related_name="action_requests")
    action = models.CharField(max_length=32)  # a name from recovery.engine.actions.ACTIONS
    status = models.CharField(max_length=16, choices=ActionStatus.choices, default=ActionStatus.PREVIEWED)
    plan = models.JSONField(default=dict)
    plan_hash = models.CharField(max_length=64)
    call_version = models.PositiveIntegerField()  # the call's version the plan was made for
    evidence = models.JSONField(default=dict, blank=True)  # mark committed / not committed: ref, receipt, link
    previewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    previewed_at = models.DateTimeField(default=timezone.now)
    execution_owner = models.CharField(max_length=100, blank=True)
    execution_lease_until = models.DateTimeField(null=True, blank=True)
    executed_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    approval_used_at = models.DateTimeField(null=True, blank=True)  # grant_approval: the one admission it allowed

    class Meta:
        constraints = [
            four_eyes("action_four_eyes"),
            models.CheckConstraint(
                condition=~Q(status__in=["approved", "executing", "executed", "interrupted"])
                | Q(decided_by__isnull=False)
                | Q(action="reconcile_now"),
                name="action_approved_has_decider",
            ),
        ]
        indexes = [
            models.Index(fields=["call", "previewed_at"], name="action_call_idx"),
            models.Index(fields=["status", "expires_at"], name="action_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.action} on call {self.call_id}: {self.status}"


class BulkStatus(models.TextChoices):
    PREVIEWED = "previewed"  # the selection is frozen and shown: nothing requested, nothing done
    REQUESTED = "requested"  # a reviewer asked for it with a reason; waits for a second person
    APPROVED = "approved"  # a different person approved it: a worker executes its items, each once
    REJECTED = "rejected"  # the second person said no (with a reason)
    EXPIRED = "expired"  # nobody requested or decided before expires_at
    EXECUTING = "executing"  # one worker claimed it (conditional UPDATE) and holds the lease
    FINISHED = "finished"  # every item has its result


class BulkItemStatus(models.TextChoices):
    PENDING = "pending"  # frozen, to be executed
    EXCLUDED = "excluded"  # left out at the freeze: another reviewer holds its claim
    SKIPPED_CHECKS = "skipped_checks"  # left out at the freeze: the action is not allowed on it, or its checks fail
    EXECUTING = "executing"  # a worker is executing it now
    EXECUTED = "executed"  # its action request ran; `result` says what happened
    SKIPPED_STALE = "skipped_stale"  # its call moved (its version) since the freeze: never acted on
    FAILED = "failed"  # re-checked at execution and refused, or its execution failed; `result` says why
    INTERRUPTED = "interrupted"  # its worker died while executing it: never run again


class BulkAction(FourEyesRequest):
    """One operator action on a frozen, shown selection of calls (docs/console.md): each item its call's id and version
    at the freeze. Requested with a reason, approved by a second person (a database constraint), executed item by item
    by a worker that re-checks every item (its version, the catalogue, the plan's policy checks) before acting on it,
    through an ActionRequest of its own, so each item's story is in its call's audit trail."""

    action = models.CharField(max_length=32)  # one of recovery.services.bulk.BULK_ACTIONS
    status = models.CharField(max_length=16, choices=BulkStatus.choices, default=BulkStatus.PREVIEWED)
    queue = models.CharField(max_length=40)  # the queue's slug the selection was made on
    selection = models.CharField(max_length=16)  # "rows" (picked one by one) or "matching" (every row of a filter)
    filters = models.JSONField(default=dict, blank=True)  # the queue's filters as the URL gave them
    selection_hash = models.CharField(max_length=64)  # the action and every item's (call, version, status)
    previewed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    previewed_at = models.DateTimeField(default=timezone.now)
    execution_owner = models.CharField(max_length=100, blank=True)
    execution_lease_until = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            four_eyes("bulk_four_eyes"),
            models.CheckConstraint(
                condition=~Q(status__in=["approved", "executing", "finished"]) | Q(decided_by__isnull=False),
                name="bulk_approved_has_decider",
            ),
        ]
        indexes = [models.Index(fields=["status", "expires_at"], name="bulk_status_idx")]

    def __str__(self) -> str:
        return f"bulk {self.action} #{self.pk}: {self.status}"


class BulkItem(models.Model):
    """One call of a bulk, frozen at its version; its result once the worker reached it."""

    bulk = models.ForeignKey(BulkAction, on_delete=models.PROTECT, related_name="items")
    position = models.PositiveIntegerField()  # 1..n, the order shown and executed
    call = models.ForeignKey(Call, on_delete=models.PROTECT, related_name="bulk_items")
    call_version = models.PositiveIntegerField()  # the call's version at the freeze
    call_state = models.CharField(max_length=24)  # its state at the freeze
    status = models.CharField(max_length=16, choices=BulkItemStatus.choices, default=BulkItemStatus.PENDING)
    checks = models.JSONField(default=list, blank=True)  # the plan's policy checks at the freeze
    why = models.TextField(blank=True)  # why it was left out, or what its execution did
    request = models.ForeignKey(
        ActionRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="bulk_items"
    )  # the action request that executed it
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["bulk", "call"], name="bulk_item_once"),
            models.UniqueConstraint(fields=["bulk", "position"], name="bulk_item_position"),
        ]
        indexes = [models.Index(fields=["bulk", "status"], name="bulk_item_status_idx")]

    def __str__(self) -> str:
        return f"item {self.position} of bulk {self.bulk_id}: call {self.call_id} {self.status}"

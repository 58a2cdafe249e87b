"""A runtime's tasks and their steps, with a task's status and outcome choices."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from recovery.models.registry import Tenant
from recovery.models.tokens import ApiToken


class TaskStatus(models.TextChoices):
    OPEN = "open"  # the runtime is still working
    SUBMITTED = "submitted"  # the runtime submitted its deliverable (POST .../complete)
    ABANDONED = "abandoned"  # the runtime or an operator gave up


class TaskOutcome(models.TextChoices):
    COMPLETED = "completed"  # every call settled and the deliverable submitted
    COMPLETED_WITH_UNKNOWNS = "completed_with_unknowns"  # submitted while some effects are still unknown
    FAILED = "failed"  # nothing or not enough was done
    DEGRADED = "degraded"  # finished on a fallback path (e.g. read-only summary)
    ABANDONED = "abandoned"
    COMPENSATED = "compensated"  # aborted as a saga, and every committed step was undone


class Task(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="tasks")
    external_id = models.CharField(max_length=200)
    agent = models.CharField(max_length=200)
    goal = models.TextField()
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.OPEN)
    outcome = models.CharField(max_length=32, choices=TaskOutcome.choices, blank=True)
    no_submission = models.BooleanField(default=False, help_text="Past its deadline without a submission.")
    budget = models.JSONField(default=dict, blank=True)  # as given by the runtime, validated
    max_rounds = models.PositiveIntegerField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    token_budget = models.PositiveIntegerField(null=True, blank=True)
    rounds_used = models.PositiveIntegerField(default=0)
    tokens_used = models.PositiveBigIntegerField(default=0)  # sums every report: can pass 2**31
    write_retries_used = models.PositiveIntegerField(default=0)
    submission = models.JSONField(null=True, blank=True)
    created_by_token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.PROTECT)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    # A saga abort (docs/compensation.md): "" (none), running, stopped (an entry failed or needs a person), done.
    saga = models.CharField(max_length=16, blank=True)
    saga_executor = models.CharField(max_length=16, blank=True)  # console (its worker) or runtime (the agent's)
    saga_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "external_id"], name="task_unique_external_id"),
        ]
        indexes = [
            models.Index(fields=["status", "deadline"], name="task_status_deadline_idx"),
            # A runtime's tasks (the per-runtime tools of the breakers page: recovery.selectors.observed).
            models.Index(fields=["tenant", "agent"], name="task_tenant_agent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.name}/{self.external_id}"


class Step(models.Model):
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="steps")
    index = models.PositiveIntegerField()
    name = models.CharField(max_length=200, blank=True)
    depends_on = models.ManyToManyField("self", symmetrical=False, blank=True, related_name="dependents")
    compensation = models.JSONField(default=dict, blank=True)  # the saga's compensation action for this step
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["task", "index"]
        constraints = [models.UniqueConstraint(fields=["task", "index"], name="step_unique_index")]

    def __str__(self) -> str:
        return f"step {self.index}"

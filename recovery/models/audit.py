"""The append-only, hash-chained audit trail (docs/design/audit.md): its events, the kinds of actor, and the chain
heads."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from recovery.models.calls import Call
from recovery.models.tasks import Task
from recovery.models.tokens import ApiToken


class ActorKind(models.TextChoices):
    USER = "user"  # a signed-in person
    TOKEN = "token"  # an agent runtime's API token
    JOB = "job"  # a background job
    SYSTEM = "system"  # a management command or migration


class AuditEvent(models.Model):
    """One append-only, hash-chained record of a state change or operator action (docs/design/audit.md).

    `seq` is a gap-free global sequence; `chain`/`chain_seq` number the events of one task (or the system chain).
    `hash` covers every field below plus `prev_hash`, so an edited payload or a removed event breaks the chain;
    `hmac` keys that hash with a secret kept outside the database (recovery.audit.chain).
    UPDATE, DELETE and TRUNCATE are refused by the database (recovery.statemachine.dbguards); `prev` and the chain
    head's `head_event` are foreign keys, so even with the guard off a referenced event cannot be deleted.
    """

    seq = models.BigIntegerField(unique=True)
    chain = models.CharField(max_length=64)
    chain_seq = models.BigIntegerField()
    prev = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # HMAC-SHA256 of `hash` under the RECOVERY_AUDIT_KEYS key `key_id`: a secret the database does not hold, so a
    # rewrite by someone with database access alone shows. Both empty for events written before keys existed.
    key_id = models.CharField(max_length=32, blank=True)
    hmac = models.CharField(max_length=64, blank=True)
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_events")
    call = models.ForeignKey(Call, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_events")
    actor_kind = models.CharField(max_length=8, choices=ActorKind.choices)
    actor_label = models.CharField(max_length=200)
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT)
    actor_token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.PROTECT)
    action = models.CharField(max_length=64)
    from_state = models.CharField(max_length=32, blank=True)
    to_state = models.CharField(max_length=32, blank=True)
    reason = models.TextField(blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["seq"]
        constraints = [models.UniqueConstraint(fields=["chain", "chain_seq"], name="audit_unique_chain_seq")]
        indexes = [
            models.Index(fields=["task", "seq"], name="audit_task_idx"),
            models.Index(fields=["call", "seq"], name="audit_call_idx"),
            models.Index(fields=["action", "created_at"], name="audit_action_idx"),
            models.Index(fields=["actor_label", "created_at"], name="audit_actor_idx"),
            models.Index(fields=["created_at"], name="audit_time_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.action}"


class AuditChainHead(models.Model):
    """The head of one audit chain (a task's, the system's) or the global sequence counter (key 'global').

    Appending locks the head row, so concurrent writers queue instead of forking the chain; `length` and
    `head_hash` let verify_audit notice a deleted tail even when the foreign keys were bypassed.
    """

    key = models.CharField(max_length=64, unique=True)
    length = models.BigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, blank=True)
    head_event = models.ForeignKey(AuditEvent, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.key} @ {self.length}"

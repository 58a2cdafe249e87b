"""Calls and what happened to each: its attempts, their redacted diagnostics, the recovery decision cards
(docs/design/decisions.md), the admission answers (docs/design/gate.md) and the reconcile receipts
(docs/reconciliation.md)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from recovery.engine.keys import key_expired, key_expires_at
from recovery.engine.reconcile import Observation
from recovery.engine.states import RECONCILABLE, CallState
from recovery.models.base import _choices
from recovery.models.registry import Provider, Risk, SideEffect, Tenant, Tool
from recovery.models.tasks import Step, Task
from recovery.models.tokens import ApiToken


class Call(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="calls")
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="calls")
    step = models.ForeignKey(Step, on_delete=models.PROTECT, related_name="calls")
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="calls")
    idempotency_key = models.CharField(max_length=255)
    arguments = models.JSONField(default=dict)
    fingerprint = models.CharField(max_length=64)  # sha256(tool + ":" + canonical_json(arguments))
    side_effect = models.CharField(max_length=8, choices=SideEffect.choices)  # the tool's, when the call was made
    risk = models.CharField(max_length=8, choices=Risk.choices)
    # Written only by recovery.statemachine.transitions (and guarded by a trigger): version counts state changes,
    # nothing else.
    state = models.CharField(max_length=32, choices=_choices(CallState), default=CallState.READY)
    version = models.PositiveIntegerField(default=0)
    state_changed_at = models.DateTimeField(default=timezone.now)
    outcome = models.CharField(max_length=32, blank=True)  # retry_exhausted, human_review_required, ...
    max_attempts = models.PositiveIntegerField(null=True, blank=True, default=3)  # None: no limit
    attempts_count = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)
    outcome_timeout_s = models.PositiveIntegerField(default=30)
    provider_ref = models.CharField(max_length=255, blank=True)
    # Reconciliation counters: receipts do not bump the version.
    checks_made = models.PositiveIntegerField(default=0)
    last_receipt_at = models.DateTimeField(null=True, blank=True)
    last_receipt_status = models.CharField(max_length=32, blank=True)
    next_check_at = models.DateTimeField(null=True, blank=True)
    # Two separate leases: a worker checking the provider, and a reviewer working the item.
    check_lease_owner = models.CharField(max_length=100, blank=True)
    check_lease_until = models.DateTimeField(null=True, blank=True)
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="claimed_calls"
    )
    claim_until = models.DateTimeField(null=True, blank=True)
    effects_observed = models.PositiveIntegerField(null=True, blank=True)
    duplicate_effect = models.BooleanField(default=False)
    # Replay reconciliation (docs/replay.md): set by a conditional UPDATE before the one same-key replay is sent, so a
    # call is replayed by reconciliation at most once, whatever happens to the worker or its lease.
    replay_reconciled_at = models.DateTimeField(null=True, blank=True)
    # Observed, not protected: made from an OpenTelemetry span after the fact (recovery.services.observed), never
    # admitted before it was sent. Its attempts are after-the-fact reports (docs/design/state-machine.md,
    # docs/recovered-tools.md).
    observed = models.BooleanField(default=False)
    # When retention removed its settled history — receipts, gate answers, response bodies (recovery.services.
    # retention); null while it is all here. Its states, attempts, decision cards and audit trail are never removed.
    history_pruned_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tool", "idempotency_key"], name="call_unique_key"),
        ]
        indexes = [
            # Queues: one state, oldest first, keyset on (state_changed_at, id).
            models.Index(fields=["state", "state_changed_at", "id"], name="call_queue_idx"),
            # All calls in every state: the same order without the state, so its page reads 51 rows and stops.
            models.Index(fields=["state_changed_at", "id"], name="call_changed_idx"),
            # The UNKNOWN queue spans two states: one index in page order, so a page reads its 51 rows and stops.
            models.Index(
                fields=["state_changed_at", "id"],
                name="call_unknown_queue_idx",
                condition=Q(state__in=[CallState.UNKNOWN, CallState.STILL_UNKNOWN]),
            ),
            # The compensation problems queue spans three states (recovery.selectors.queues), in page order too.
            models.Index(
                fields=["state_changed_at", "id"],
                name="call_compensation_queue_idx",
                condition=Q(
                    state__in=[CallState.COMPENSATING, CallState.PARTIAL_COMPENSATED, CallState.COMPENSATION_FAILED]
                ),
            ),
            # The open backlog as the overview and the queue sizes count it (per state and risk, the oldest, the
            # late; per tool or tenant): every column those counts read, so they are index-only scans of the open
            # items (25,000 open among 1,000,000 calls: 14 ms, against 85 ms reading their rows).
            models.Index(
                fields=["state", "risk", "state_changed_at", "tool", "tenant", "id"],
                name="call_backlog_idx",
                condition=Q(
                    state__in=[
                        CallState.UNKNOWN,
                        CallState.STILL_UNKNOWN,
                        CallState.HUMAN_REVIEW,
                        CallState.PARTIAL_COMPENSATED,
                        CallState.COMPENSATION_FAILED,
                    ]
                ),
            ),
            models.Index(fields=["tenant", "state", "state_changed_at"], name="call_tenant_state_idx"),
            models.Index(fields=["tool", "state", "state_changed_at"], name="call_tool_state_idx"),
            models.Index(fields=["idempotency_key"], name="call_key_idx"),
            models.Index(fields=["provider_ref"], name="call_provider_ref_idx"),
            models.Index(fields=["task", "fingerprint"], name="call_task_fingerprint_idx"),
            models.Index(
                fields=["next_check_at"],
                name="call_due_check_idx",
                condition=Q(state__in=sorted(RECONCILABLE)),
            ),
            models.Index(fields=["sent_at"], name="call_sent_idx", condition=Q(state=CallState.SENT)),
            # An observed write intent seen again, in any trace of the tenant (recovery.services.observed): only the
            # observed calls, a small part of the table.
            models.Index(
                fields=["tenant", "tool", "fingerprint"], name="call_observed_intent_idx", condition=Q(observed=True)
            ),
        ]
        permissions = [
            ("review_call", "Can claim calls, preview and request actions"),
            ("approve_action", "Can approve or reject actions requested by others"),
            ("export_audit", "Can export recovery history"),
            ("verify_audit", "Can verify the audit chain"),
        ]

    def __str__(self) -> str:
        return f"call {self.pk} {self.tool_id} {self.idempotency_key}"

    def has_attempts_left(self) -> bool:
        """Whether the call's own limit allows another attempt (None: no limit)."""
        return self.max_attempts is None or self.attempts_count < self.max_attempts

    @staticmethod
    def claim_live(claimed_by_id: int | None, claim_until: datetime | None, now: datetime) -> bool:
        """Whether a reviewer's claim still holds at `now`: someone holds it and the lease has not run out. For rows
        read as values (the queue pages); a loaded call asks `claim_held`."""
        return bool(claimed_by_id and claim_until and claim_until > now)

    @staticmethod
    def claim_free(user, now: datetime) -> Q:
        """The calls `user` may claim at `now`: unclaimed, lapsed (the opposite of `claim_live`), or already theirs."""
        return Q(claimed_by__isnull=True) | Q(claim_until__isnull=True) | Q(claim_until__lte=now) | Q(claimed_by=user)

    def claim_held(self, now: datetime) -> bool:
        return self.claim_live(self.claimed_by_id, self.claim_until, now)

    def first_sent_at(self) -> datetime | None:
        """When the provider could first have seen the call's key: its first attempt's admission (the attempt row's
        creation where admission did not stamp it); None before any attempt. One query; none for a call without
        attempts (attempts_count is written with every attempt, in its transaction)."""
        if not self.attempts_count:
            return None
        first = self.attempts.filter(number=1).values_list("admitted_at", "created_at").first()
        return (first[0] or first[1]) if first else None

    def key_since(self, first_sent_at: datetime | None) -> datetime:
        """When the provider first saw the call's key: its first attempt, or the call's creation before any."""
        return first_sent_at or self.created_at

    def key_expires_at(self, first_sent_at: datetime | None) -> datetime:
        return key_expires_at(self.key_since(first_sent_at), self.tool.key_retention_s)

    def key_expired(self, first_sent_at: datetime | None, now: datetime) -> bool:
        """Whether the provider has forgotten the call's idempotency key (the engine's rule,
        docs/design/idempotency.md)."""
        return key_expired(self.key_since(first_sent_at), self.tool.key_retention_s, now)


class Diagnostic(models.Model):
    """Raw failure detail, redacted before storage, for operators only (`Failure.diagnostic_ref`)."""

    ref = models.CharField(max_length=40, unique=True)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT)
    call = models.ForeignKey(Call, null=True, blank=True, on_delete=models.PROTECT, related_name="diagnostics")
    source = models.CharField(max_length=32)  # attempt, receipt, api, job
    summary = models.CharField(max_length=300)
    detail = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.ref


class Attempt(models.Model):
    call = models.ForeignKey(Call, on_delete=models.PROTECT, related_name="attempts")
    attempt_id = models.CharField(max_length=100)  # chosen by the runtime, unique within its call
    number = models.PositiveIntegerField()  # 1..n within the call
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="attempts")
    arguments = models.JSONField(default=dict)
    fingerprint = models.CharField(max_length=64)
    credential_version = models.PositiveIntegerField(null=True, blank=True)
    evidence = models.JSONField(default=list, blank=True)  # evidence kinds the candidate claimed
    policy_bypassed = models.BooleanField(default=False)  # reported after the fact; the gate would have denied it
    breaker_probe = models.BooleanField(default=False)  # admitted as its tool's half-open probe
    admitted_at = models.DateTimeField(null=True, blank=True)
    reported_at = models.DateTimeField(null=True, blank=True)
    facts = models.JSONField(null=True, blank=True)  # the outcome facts as reported (error text redacted)
    connection_opened = models.BooleanField(null=True, blank=True)
    sent = models.BooleanField(null=True, blank=True)
    http_status = models.PositiveIntegerField(null=True, blank=True)
    error_kind = models.CharField(max_length=32, blank=True)
    error_code = models.CharField(max_length=100, blank=True)
    provider_request_id = models.CharField(max_length=255, blank=True)
    retry_after_ms = models.PositiveIntegerField(null=True, blank=True)
    tokens_used = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    failure = models.JSONField(null=True, blank=True)  # the Failure object of docs/design/classification.md
    failure_class = models.CharField(max_length=32, blank=True)
    diagnostic = models.ForeignKey(Diagnostic, null=True, blank=True, on_delete=models.PROTECT)
    # API idempotency: the same attempt posted twice gets the stored answer; another body under the id is a 422.
    request_hash = models.CharField(max_length=64, blank=True)
    response = models.JSONField(null=True, blank=True)
    outcome_request_hash = models.CharField(max_length=64, blank=True)
    outcome_response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["call", "number"]
        constraints = [
            models.UniqueConstraint(fields=["call", "attempt_id"], name="attempt_unique_id"),
            models.UniqueConstraint(fields=["call", "number"], name="attempt_unique_number"),
        ]
        indexes = [models.Index(fields=["tool", "created_at"], name="attempt_tool_time_idx")]

    def __str__(self) -> str:
        return f"attempt {self.number} of call {self.call_id}"


class Decision(models.Model):
    """The recovery decision card of docs/design/decisions.md, one per failed attempt."""

    call = models.ForeignKey(Call, on_delete=models.PROTECT, related_name="decisions")
    attempt = models.OneToOneField(Attempt, on_delete=models.PROTECT, related_name="decision")
    route = models.CharField(max_length=16)  # repair, retry, reauth, replan, reconcile, reject, escalate, ...
    delay_ms = models.PositiveIntegerField(default=0)
    next_actions = models.JSONField(default=list)
    forbidden = models.JSONField(default=list)
    required_next = models.JSONField(default=dict)
    public_message = models.TextField()
    fallback = models.CharField(max_length=100, blank=True)
    card = models.JSONField(default=dict)  # the whole card as returned by the API
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["call", "created_at"], name="decision_call_idx")]

    def __str__(self) -> str:
        return f"{self.route} for call {self.call_id}"


class GateDecision(models.Model):
    """A stored admission answer (docs/design/gate.md): allowed or denied, why, and what is required next."""

    call = models.ForeignKey(Call, on_delete=models.PROTECT, related_name="gate_decisions")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    candidate_attempt_id = models.CharField(max_length=100, blank=True)
    candidate = models.JSONField(default=dict)  # tool, fingerprint, credential version, claimed evidence
    dry_run = models.BooleanField(default=False)  # asked through POST .../gate: nothing was admitted
    allowed = models.BooleanField()
    reason = models.CharField(max_length=64)
    evidence_used = models.CharField(max_length=32, blank=True)
    checks = models.JSONField(default=list)  # [{check, passed, detail}] in admission order
    required_next = models.JSONField(default=dict, blank=True)
    actor_token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.PROTECT)
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["call", "created_at"], name="gate_call_idx"),
            # The holds (docs/mcp-gateway.md: admissions denied with approval_required) by their time, for the
            # metrics: a partial index of those denials alone, so reading them costs what the holds are.
            models.Index(
                fields=["created_at"],
                name="gate_hold_created_idx",
                condition=Q(allowed=False, dry_run=False, reason="approval_required"),
            ),
        ]

    def __str__(self) -> str:
        return f"{'allowed' if self.allowed else 'denied'} ({self.reason}) for call {self.call_id}"


class ReceiptSource(models.TextChoices):
    POLL = "poll"  # a status query by a background job or an immediate check
    CALLBACK = "callback"  # a signed provider callback
    RUNTIME = "runtime"  # the runtime's own 2xx with a provider reference (an idempotency record)
    OPERATOR = "operator"  # evidence entered by a person with an approved action
    IDEMPOTENT_REPLAY = "idempotent_replay"  # replay reconciliation: the provider's idempotency record answered


class Receipt(models.Model):
    """A reconcile receipt (docs/reconciliation.md): what one status check observed, and what it still lacks."""

    call = models.ForeignKey(Call, on_delete=models.PROTECT, related_name="receipts")
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="receipts")
    source = models.CharField(max_length=24, choices=ReceiptSource.choices)
    observed = models.CharField(max_length=16, choices=_choices(Observation))
    provider_status = models.CharField(max_length=64, blank=True)
    provider_ref = models.CharField(max_length=255, blank=True)
    effects_observed = models.PositiveIntegerField(null=True, blank=True)
    request = models.JSONField(default=dict, blank=True)  # method and URL, secrets masked
    response = models.JSONField(default=dict, blank=True)  # status and body, redacted
    http_status = models.PositiveIntegerField(null=True, blank=True)
    local_state_before = models.CharField(max_length=32)
    local_state_after = models.CharField(max_length=32)
    applied = models.BooleanField(default=False)  # it moved the call
    forbidden = models.JSONField(default=list, blank=True)
    next_actions = models.JSONField(default=list, blank=True)
    evidence = models.JSONField(default=list, blank=True)
    event_id = models.CharField(max_length=200, blank=True)  # callbacks: deduplication key
    diagnostic = models.ForeignKey(Diagnostic, null=True, blank=True, on_delete=models.PROTECT)
    checked_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "event_id"], condition=~Q(event_id=""), name="receipt_unique_callback_event"
            ),
        ]
        indexes = [models.Index(fields=["call", "checked_at"], name="receipt_call_idx")]

    def __str__(self) -> str:
        return f"receipt {self.pk}: {self.observed}"

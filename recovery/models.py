"""The data model of SPEC §2.

Fields that queues and workers filter on are real columns with indexes; nested policy that only the engine reads
(request templates, schemas, schedules) is JSON validated by the registry loader. A call's `state` and `version`
are written by `recovery.transitions` alone (and guarded by a database trigger); audit rows are append-only at the
database level (see `recovery.dbguards`).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from recovery.compensation_states import OPEN as OPEN_ENTRY_STATES
from recovery.compensation_states import EntryState
from recovery.engine.keys import key_expired, key_expires_at
from recovery.engine.reconcile import Observation
from recovery.states import RECONCILABLE, CallState

name_validator = RegexValidator(r"^[a-z0-9][a-z0-9_.-]*$", "Use lowercase letters, digits, '.', '_' and '-'.")


def _choices(values: type[StrEnum]) -> list[tuple[str, str]]:
    """A plain enum's members as a field's choices, labelled as Django's TextChoices label them (the states and
    the observations are plain Python, shared with the engine)."""
    return [(member.value, member.name.replace("_", " ").title()) for member in values]


class SideEffect(models.TextChoices):
    READ = "read"  # no effect outside: safe to repeat
    WRITE = "write"  # changes the world: money, orders, access, messages


class RetryPath(models.TextChoices):
    UNPROBED = "unprobed"  # no duplicate probe yet: never counted as safe
    SAFE = "safe"  # a probe saw an idempotent replay with one effect
    UNSAFE = "unsafe"  # a probe saw a second effect, a new business id, or a key the provider did not know


class Risk(models.TextChoices):
    LOW = "low"
    HIGH = "high"  # payments, deletes, admin writes: never swapped silently, reviewed first


class Tenant(models.Model):
    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    display_name = models.CharField(max_length=200, blank=True)
    sandbox = models.BooleanField(default=False, help_text="Test tenant: duplicate probes are allowed here only.")
    all_tools = models.BooleanField(default=False, help_text="May use every registered tool.")
    tools = models.ManyToManyField("Tool", blank=True, related_name="tenants")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Provider(models.Model):
    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    base_url = models.URLField(max_length=500)
    connect_timeout_s = models.FloatField(default=3.0)
    read_timeout_s = models.FloatField(default=10.0)
    # {"kind": "bearer"|"header"|"none", "secret_env": "ENV_VAR_NAME", ...}: secrets live in the environment only.
    auth = models.JSONField(default=dict, blank=True)
    callback_secret_env = models.CharField(max_length=100, blank=True)
    idempotency_conflict_codes = models.JSONField(default=list, blank=True)
    # The provider's status endpoint has a breaker of its own (window_s, min_calls, failure_rate, cooldown_s).
    status_breaker = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Tool(models.Model):
    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="tools")
    description = models.TextField(blank=True)
    side_effect = models.CharField(max_length=8, choices=SideEffect.choices)
    risk = models.CharField(max_length=8, choices=Risk.choices, default=Risk.LOW)
    replay_safe = models.BooleanField(default=False, help_text="A same-key replay cannot cause a second effect.")
    # From the latest duplicate probe (SPEC §11): unprobed until one ran; unsafe switches every same-key replay of
    # the tool off; only a new passing probe or an approved action turns it back on. The registry load never resets
    # it, but a change of the provider's base URL voids it (back to unprobed: the probe proved another provider).
    retry_path = models.CharField(max_length=8, choices=RetryPath.choices, default=RetryPath.UNPROBED)
    retry_path_probe = models.ForeignKey(
        "DuplicateProbe", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    retry_path_key_age_s = models.PositiveIntegerField(null=True, blank=True)  # the key age the safe probe covered
    retry_path_base_url = models.URLField(max_length=500, blank=True)  # the provider's, when probed
    retry_path_changed_at = models.DateTimeField(null=True, blank=True)
    retry_path_reason = models.TextField(blank=True)  # the probe's decision, or the approved action's reason
    provider_ref_field = models.CharField(max_length=100, blank=True)
    # How an intent's key derives from the arguments ("refund-{order_id}") for a caller that names none: the key of an
    # OpenTelemetry span without recovery.idempotency_key, scoped to its trace (recovery.services.observed).
    key_template = models.CharField(max_length=200, blank=True)
    request = models.JSONField(default=dict, blank=True)  # {method, path, body}: replays, probes, dry runs
    args_schema = models.JSONField(default=dict, blank=True)
    result_schema = models.JSONField(default=dict, blank=True)
    required_result_fields = models.JSONField(default=list, blank=True)
    max_result_age_s = models.PositiveIntegerField(null=True, blank=True)
    result_time_field = models.CharField(max_length=100, blank=True)  # ISO 8601 time that max_result_age_s reads
    invariants = models.JSONField(default=list, blank=True)  # [{result, equals_arg | one_of | minimum}]
    approvable_codes = models.JSONField(default=list, blank=True)
    refusal_codes = models.JSONField(default=list, blank=True)  # provider codes meaning "refused, not executed"
    alternates = models.ManyToManyField("self", symmetrical=False, blank=True, related_name="alternate_of")
    outcome_timeout_s = models.PositiveIntegerField(default=30)
    key_retention_s = models.PositiveIntegerField(default=86_400)
    key_retention_declared = models.BooleanField(default=False)  # the registry entry names it (replay reconciliation)
    status_query = models.JSONField(default=dict, blank=True)  # {method, path, status_map}
    reconcile = models.JSONField(default=dict, blank=True)  # {first_check_s, backoff, max_checks, deadline_s}
    compensation = models.JSONField(default=dict, blank=True)  # {tool, args}
    budgets = models.JSONField(default=dict, blank=True)  # {max_attempts, write_retry, unknown_budget, ...}
    backoff = models.JSONField(default=dict, blank=True)  # {base_ms, cap_ms, jitter}
    breaker = models.JSONField(default=dict, blank=True)  # {window_s, min_calls, failure_rate, cooldown_s, ...}
    fallback = models.CharField(max_length=100, blank=True)
    exhausted_to_review = models.BooleanField(
        default=False, help_text="Out of budget, a retryable call goes to human review instead of failing."
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TokenScope(models.TextChoices):
    RUNTIME = "runtime"  # an agent runtime: the machine API, for its tenants
    METRICS = "metrics"  # a metrics scraper: GET /metrics and GET /api/v1/metrics only, for its tenants


class ApiToken(models.Model):
    name = models.CharField(max_length=100, unique=True)
    scope = models.CharField(max_length=16, choices=TokenScope.choices, default=TokenScope.RUNTIME)
    # The first characters of the token, shown in lists and used to find the row; the rest is only in `digest`.
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, unique=True)  # HMAC-SHA256(pepper, token), hex
    tenants = models.ManyToManyField(Tenant, related_name="api_tokens")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


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
    # A saga abort (SPEC §12): "" (none), running, stopped (an entry failed or needs a person), done.
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
    # Written only by recovery.transitions (and guarded by a trigger): version counts state changes, nothing else.
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
    # Replay reconciliation (SPEC §10.1): set by a conditional UPDATE before the one same-key replay is sent, so a
    # call is replayed by reconciliation at most once, whatever happens to the worker or its lease.
    replay_reconciled_at = models.DateTimeField(null=True, blank=True)
    # Observed, not protected: made from an OpenTelemetry span after the fact (recovery.services.observed), never
    # admitted before it was sent. Its attempts are after-the-fact reports (SPEC §8.1, §21).
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
        """Whether the provider has forgotten the call's idempotency key (the engine's rule, SPEC §9)."""
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
    failure = models.JSONField(null=True, blank=True)  # the Failure object of SPEC §3
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
    """The recovery decision card of SPEC §4, one per failed attempt."""

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
    """A stored admission answer (SPEC §5): allowed or denied, why, and what is required next."""

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
        indexes = [models.Index(fields=["call", "created_at"], name="gate_call_idx")]

    def __str__(self) -> str:
        return f"{'allowed' if self.allowed else 'denied'} ({self.reason}) for call {self.call_id}"


class ReceiptSource(models.TextChoices):
    POLL = "poll"  # a status query by a background job or an immediate check
    CALLBACK = "callback"  # a signed provider callback
    RUNTIME = "runtime"  # the runtime's own 2xx with a provider reference (an idempotency record)
    OPERATOR = "operator"  # evidence entered by a person with an approved action
    IDEMPOTENT_REPLAY = "idempotent_replay"  # replay reconciliation: the provider's idempotency record answered


class Receipt(models.Model):
    """A reconcile receipt (SPEC §10): what one status check observed, and what it still lacks."""

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


class ProbeDecision(models.TextChoices):
    SAFE = "retry_path_safe"
    UNSAFE = "retry_path_unsafe"
    INCONCLUSIVE = "inconclusive"  # the provider's ledger could not be read: the retry path is left as it was


class DuplicateProbe(models.Model):
    """A duplicate probe (SPEC §11): a COMMITTED call replayed with its original key on a test tenant, and what the
    provider's own ledger said about the key afterwards. A receipt of its own: never an attempt, it moves no call.
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


class ActorKind(models.TextChoices):
    USER = "user"  # a signed-in person
    TOKEN = "token"  # an agent runtime's API token
    JOB = "job"  # a background job
    SYSTEM = "system"  # a management command or migration


class AuditEvent(models.Model):
    """One append-only, hash-chained record of a state change or operator action (SPEC §15.6).

    `seq` is a gap-free global sequence; `chain`/`chain_seq` number the events of one task (or the system chain).
    `hash` covers every field below plus `prev_hash`, so an edited payload or a removed event breaks the chain;
    `hmac` keys that hash with a secret kept outside the database (recovery.audit).
    UPDATE, DELETE and TRUNCATE are refused by the database (recovery.dbguards); `prev` and the chain head's
    `head_event` are foreign keys, so even with the guard off a referenced event cannot be deleted.
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


class BreakerState(models.TextChoices):
    CLOSED = "closed"  # calls flow; outcomes are counted
    OPEN = "open"  # failing fast until the cooldown ends
    HALF_OPEN = "half_open"  # the cooldown ended: a few probes may go through
    FORCED_OPEN = "forced_open"  # an operator opened it; only an operator closes it


class Breaker(models.Model):
    """One circuit breaker per tool, shared by every process (SPEC §7).

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


class BreakerOperation(models.Model):
    """An operator's force open or reset of a tool's breaker (SPEC §7, §15.4), with the dry run's figures as the
    person saw them. A reset binds to the breaker's row as it was at the request (its state and updated_at): if the
    breaker moved since, the approval applies nothing (stale). Four eyes are a database constraint."""

    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="breaker_operations")
    operation = models.CharField(max_length=16, choices=BreakerOperationKind.choices)
    status = models.CharField(max_length=16, choices=BreakerOperationStatus.choices)
    reason = models.TextField()  # the requester's (for a force open, the one who confirmed it)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    requested_at = models.DateTimeField(default=timezone.now)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )  # a reset's approver or rejecter; a force open has none (one confirmation)
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    breaker_state = models.CharField(max_length=16, choices=BreakerState.choices)  # stored at the request
    breaker_updated_at = models.DateTimeField(null=True, blank=True)  # the row's at the request; None: no row
    preview = models.JSONField(default=dict, blank=True)  # the dry run's figures (recovery.services.breaker_operations)
    applied_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # a reset request's
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Four eyes, in the data model: whoever approves or rejects a reset did not request it.
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by")),
                name="breaker_operation_four_eyes",
            ),
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
    """The breaker of one provider's status endpoint (SPEC §10), separate from its tools' breakers.

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


class ActionRequest(models.Model):
    """One operator action on one call (SPEC §15.4): dry run, request, approval, execution — each step an audit event.

    The plan (the exact provider request(s), the policy checks, the forbidden actions, the expected effects) is
    stored with its hash and the call's version at preview; approving re-checks both, so an approval can never
    apply to a call that moved since the reviewer looked. Four eyes are a database constraint: the person who
    decides is never the person who requested.
    """

    call = models.ForeignKey(Call, on_delete=models.PROTECT, related_name="action_requests")
    action = models.CharField(max_length=32)  # a name from recovery.actions.ACTIONS
    status = models.CharField(max_length=16, choices=ActionStatus.choices, default=ActionStatus.PREVIEWED)
    plan = models.JSONField(default=dict)
    plan_hash = models.CharField(max_length=64)
    call_version = models.PositiveIntegerField()  # the call's version the plan was made for
    evidence = models.JSONField(default=dict, blank=True)  # mark committed / not committed: ref, receipt, link
    previewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    previewed_at = models.DateTimeField(default=timezone.now)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    requested_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)  # the requester's
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    expires_at = models.DateTimeField()
    execution_owner = models.CharField(max_length=100, blank=True)
    execution_lease_until = models.DateTimeField(null=True, blank=True)
    executed_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    approval_used_at = models.DateTimeField(null=True, blank=True)  # grant_approval: the one admission it allowed
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Four eyes, in the data model: whoever approves or rejects did not request it.
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by")),
                name="action_four_eyes",
            ),
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


class CompensationEntry(models.Model):
    """One entry of a call's compensation ledger (SPEC §12): the undo of a committed effect, as its own side effect.

    It has its own key (derived from the original key and the entry number, never regenerated), its own tool and
    arguments (the registry's template filled from the original call), its own states (recovery.compensation_states,
    written by `recovery.transitions.transition_entry` alone and guarded by a trigger), attempts and receipts. At
    most one entry of a call is open at a time (a partial unique index), and the original call stays COMPENSATING
    while it is.
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

    def task_id_for_audit(self) -> int:
        """The task whose chain records the entry's events: its original call's (read without loading the call)."""
        if "call" in self._state.fields_cache:
            return self.call.task_id
        return Call.objects.filter(pk=self.call_id).values_list("task_id", flat=True).get()


class CompensationAttempt(models.Model):
    """One send of a compensation's request and what came back (the outcome facts of SPEC §3, redacted)."""

    entry = models.ForeignKey(CompensationEntry, on_delete=models.PROTECT, related_name="attempts")
    number = models.PositiveIntegerField()
    attempt_id = models.CharField(max_length=100, blank=True)  # the runtime's, when the runtime sent it
    request = models.JSONField(default=dict)  # method, url, headers (masked), body
    facts = models.JSONField(default=dict, blank=True)
    http_status = models.PositiveIntegerField(null=True, blank=True)
    error_kind = models.CharField(max_length=32, blank=True)
    error_code = models.CharField(max_length=100, blank=True)
    provider_ref = models.CharField(max_length=255, blank=True)
    row = models.CharField(max_length=16, blank=True)  # the §3 row (or "refusal") that read the reply
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


class DrillRun(models.Model):
    """One run of `manage.py drill` (SPEC §18): the drills it ran and, per drill, each key's expected and observed
    end and effects and each check, as recovery/drills/judge.py judged them. Written when the run starts (so an
    interrupted run shows, unfinished) and completed when it ends; never changed afterwards.
    """

    drills = models.JSONField(default=list)  # the drills' names, in the order run
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)  # None: still running, or interrupted
    passed = models.BooleanField(default=False)  # every drill passed (never True for an unfinished run)
    results = models.JSONField(default=list, blank=True)  # per drill: expected, observed, keys, checks, passed
    jobs = models.CharField(max_length=200, blank=True)  # how background jobs ran (RQ workers or in-process)
    options = models.JSONField(default=dict, blank=True)  # backlog size, workers, database
    log = models.TextField(blank=True)  # what the command printed, its middle cut beyond LOG_LIMIT characters

    LOG_LIMIT = 200_000

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["started_at"], name="drillrun_started_idx")]

    def __str__(self) -> str:
        verdict = "running" if self.finished_at is None else ("passed" if self.passed else "FAILED")
        return f"drill run {self.pk} ({', '.join(self.drills) or 'no drills'}): {verdict}"

    @classmethod
    def cut_log(cls, text: str) -> str:
        """The log as stored: its head and tail when it is longer than LOG_LIMIT characters."""
        if len(text) <= cls.LOG_LIMIT:
            return text
        half = cls.LOG_LIMIT // 2
        return f"{text[:half]}\n… {len(text) - 2 * half} characters cut …\n{text[-half:]}"


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


class BulkAction(models.Model):
    """One operator action on a frozen, shown selection of calls (SPEC §15.3): each item its call's id and version at
    the freeze. Requested with a reason, approved by a second person (a database constraint), executed item by item
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
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    requested_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)  # the requester's
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    expires_at = models.DateTimeField()
    execution_owner = models.CharField(max_length=100, blank=True)
    execution_lease_until = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by")), name="bulk_four_eyes"
            ),
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


# --- metrics (SPEC §17): rollups folded from the audit sequence (recovery.services.metrics) ---------------------------


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


# --- OpenTelemetry trace ingest (SPEC §21): spans recorded as observed calls (recovery.services.observed) -----------


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

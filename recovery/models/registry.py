"""The registry's rows: tenants, providers and their tools, with the side-effect, risk and retry-path choices a
tool carries (loaded by recovery.registry)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from recovery.models.base import name_validator


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
    # Its wire format (docs/providers.md): where a reply's error code is (paths such as "errors[0].code", the first
    # that holds one wins; none: the code the runtime reported), and the reply header with its request id.
    error_code_paths = models.JSONField(default=list, blank=True)
    request_id_header = models.CharField(max_length=100, default="X-Request-Id", blank=True)  # blank: the default
    # An MCP server (docs/mcp-gateway.md): {command, args, cwd, env_names} or {url}, expose_unregistered,
    # reissue_window_s. Empty: an HTTP provider.
    mcp = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Tool(models.Model):
    # Not a column: its alternates' names once recovery.registry.policy read them for this instance (None: not yet).
    alternate_names: frozenset[str] | None = None

    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="tools")
    description = models.TextField(blank=True)
    side_effect = models.CharField(max_length=8, choices=SideEffect.choices)
    risk = models.CharField(max_length=8, choices=Risk.choices, default=Risk.LOW)
    replay_safe = models.BooleanField(default=False, help_text="A same-key replay cannot cause a second effect.")
    # From the latest duplicate probe (docs/replay.md): unprobed until one ran; unsafe switches every same-key replay of
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
    # A tool of an MCP server (docs/mcp-gateway.md): {tool, ref_path, ref_regex, error_pattern, marker, status_tool,
    # annotations}; empty for an HTTP tool.
    mcp = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

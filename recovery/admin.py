"""Django admin: the registry is edited here; everything recorded by the engine is read-only.

Calls, attempts and audit rows change only through services and `transitions.py`, so their admin pages never
offer add, change or delete — not even to superusers.
"""

from django.contrib import admin
from django.db import models as django_models

from recovery import models


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(models.Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "display_name", "sandbox", "all_tools", "created_at"]
    list_filter = ["sandbox"]
    readonly_fields = ["created_at"]
    search_fields = ["name", "display_name"]
    filter_horizontal = ["tools"]


@admin.register(models.Provider)
class ProviderAdmin(admin.ModelAdmin):
    formfield_overrides = {django_models.URLField: {"assume_scheme": "https"}}
    list_display = ["name", "base_url", "connect_timeout_s", "read_timeout_s"]
    readonly_fields = ["created_at", "updated_at"]
    search_fields = ["name"]


@admin.register(models.Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = ["name", "provider", "side_effect", "risk", "replay_safe", "retry_path_safe"]
    list_filter = ["side_effect", "risk", "replay_safe", "retry_path_safe", "provider"]
    search_fields = ["name"]
    filter_horizontal = ["alternates"]
    readonly_fields = ["created_at", "updated_at"]


@admin.register(models.ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    # Tokens are issued by `manage.py create_api_token` (the secret is shown once); here they can only be revoked.
    list_display = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["name", "prefix", "digest", "tenants", "created_by", "created_at", "last_used_at"]
    fields = [*readonly_fields, "revoked_at"]

    def has_add_permission(self, request):
        return False


@admin.register(models.Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "external_id", "agent", "status", "outcome", "no_submission", "created_at"]
    list_filter = ["status", "outcome", "no_submission"]
    search_fields = ["external_id", "agent"]


@admin.register(models.Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "index", "name"]


@admin.register(models.Call)
class CallAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "tool", "idempotency_key", "state", "version", "state_changed_at", "checks_made"]
    list_filter = ["state", "side_effect", "risk"]
    search_fields = ["idempotency_key", "provider_ref"]


@admin.register(models.Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["id", "call", "number", "attempt_id", "http_status", "failure_class", "policy_bypassed"]
    list_filter = ["failure_class", "policy_bypassed"]


@admin.register(models.Decision)
class DecisionAdmin(ReadOnlyAdmin):
    list_display = ["id", "call", "route", "delay_ms", "created_at"]


@admin.register(models.GateDecision)
class GateDecisionAdmin(ReadOnlyAdmin):
    list_display = ["id", "call", "allowed", "reason", "evidence_used", "created_at"]
    list_filter = ["allowed", "reason"]


@admin.register(models.Receipt)
class ReceiptAdmin(ReadOnlyAdmin):
    list_display = ["id", "call", "source", "observed", "provider_status", "applied", "checked_at"]
    list_filter = ["source", "observed"]


@admin.register(models.Diagnostic)
class DiagnosticAdmin(ReadOnlyAdmin):
    list_display = ["ref", "source", "summary", "created_at"]


@admin.register(models.AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["seq", "chain", "chain_seq", "action", "actor_label", "from_state", "to_state", "created_at"]
    list_filter = ["action", "actor_kind"]
    search_fields = ["actor_label", "chain", "reason"]


@admin.register(models.AuditChainHead)
class AuditChainHeadAdmin(ReadOnlyAdmin):
    list_display = ["key", "length", "head_hash", "updated_at"]

"""Django admin: the registry is edited here; everything recorded by the engine is read-only (docs/registry.md).
Registry forms validate like `load_tools` and each edit is an audit event; calls, attempts and audit rows offer no
add, change or delete, not even to superusers.
"""

import re

from django import forms
from django.contrib import admin
from django.db import models as django_models
from django.db import transaction
from django.utils.html import format_html

from recovery import models
from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.providers.notify import url_refusal
from recovery.registry import validate_registry
from recovery.registry.loader import PROVIDER_FIELDS, TOOL_FIELDS
from recovery.services.notifications import rule_catch_up
from recovery.services.tokens import token_revoke

_PATH_HEAD = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)(.*)")
_EMPTY = (None, "", {}, [])


class RegistryForm(forms.ModelForm):
    """A registry object's form: clean() runs the loader's validation on the object as a registry file would hold it."""

    # Subclasses set `kind` ("tenants", "providers" or "tools": the list the object belongs to in a registry file)
    # and define registry_item(cleaned) -> dict, the object as that file would hold it.
    kind = ""

    def clean(self):
        cleaned = super().clean()
        for name, field in self.fields.items():
            # An emptied JSON box means "not configured": the model's default, as an absent key in a file.
            if isinstance(field, forms.JSONField) and name in cleaned and cleaned[name] is None:
                cleaned[name] = self._meta.model._meta.get_field(name).get_default()
        failed = set(self.errors)  # fields that already failed their own validation are not reported twice
        prefix = f"$.{self.kind}[0]"
        for error in validate_registry({self.kind: [self.registry_item(cleaned)]}):
            match = _PATH_HEAD.fullmatch(error.path.removeprefix(prefix))
            if match and match[1] in self.fields:
                if match[1] not in failed:
                    detail = match[2].lstrip(".")
                    self.add_error(match[1], f"{detail}: {error.message}" if detail else error.message)
            else:
                self.add_error(None, f"{error.path.removeprefix(prefix).lstrip('.') or 'this'}: {error.message}")
        return cleaned


def _present(cleaned: dict, keys) -> dict:
    """The keys a registry file would carry: empty values are left out, as absent keys take the default."""
    return {key: cleaned[key] for key in keys if key in cleaned and cleaned[key] not in _EMPTY}


class TenantForm(RegistryForm):
    kind = "tenants"

    def registry_item(self, cleaned: dict) -> dict:
        item = _present(cleaned, ("name", "display_name", "sandbox"))
        tools = sorted(tool.name for tool in cleaned.get("tools") or [])
        if cleaned.get("all_tools") and tools:
            self.add_error("tools", "'All tools' is ticked: clear this list, or untick it to allow only these tools.")
        item["tools"] = "*" if cleaned.get("all_tools") else tools
        return item


class ProviderForm(RegistryForm):
    kind = "providers"

    def registry_item(self, cleaned: dict) -> dict:
        return _present(cleaned, ("name", *PROVIDER_FIELDS))


class ToolForm(RegistryForm):
    kind = "tools"

    def registry_item(self, cleaned: dict) -> dict:
        item = _present(cleaned, ("name", *TOOL_FIELDS))
        if cleaned.get("provider") is not None:
            item["provider"] = cleaned["provider"].name
        alternates = cleaned.get("alternates") or []
        if self.instance.pk and any(other.pk == self.instance.pk for other in alternates):
            self.add_error("alternates", "A tool is not its own alternate.")
        item["alternates"] = sorted(other.name for other in alternates if other.pk != self.instance.pk)
        return item


class RegistryAdmin(admin.ModelAdmin):
    """Registry edits are operator actions: each one is an audit event, in the admin's own transaction."""

    audit_action = AuditAction.REGISTRY_EDITED

    def _record(self, request, obj, op: str, fields: list[str]) -> None:
        kind = self.model._meta.model_name
        append_event(
            action=self.audit_action,
            actor=Actor.for_user(request.user),
            reason=f"{op} {kind} {obj.name} in the admin",
            evidence={"kind": kind, "name": obj.name, "op": op, "fields": sorted(fields)},
        )

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if form.changed_data or not change:
            self._record(request, obj, "changed" if change else "added", form.changed_data)

    def delete_model(self, request, obj):
        self._record(request, obj, "deleted", [])
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():  # the changelist's bulk delete action runs outside the admin's transaction
            for obj in queryset:
                self._record(request, obj, "deleted", [])
            super().delete_queryset(request, queryset)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(models.Tenant)
class TenantAdmin(RegistryAdmin):
    form = TenantForm
    list_display = ["name", "display_name", "sandbox", "all_tools", "created_at"]
    list_filter = ["sandbox"]
    readonly_fields = ["created_at"]
    search_fields = ["name", "display_name"]
    filter_horizontal = ["tools"]


@admin.register(models.Provider)
class ProviderAdmin(RegistryAdmin):
    form = ProviderForm
    formfield_overrides = {django_models.URLField: {"assume_scheme": "https"}}
    list_display = ["name", "base_url", "connect_timeout_s", "read_timeout_s"]
    readonly_fields = ["created_at", "updated_at"]
    search_fields = ["name"]


@admin.register(models.Tool)
class ToolAdmin(RegistryAdmin):
    form = ToolForm
    list_display = ["name", "provider", "side_effect", "risk", "replay_safe", "retry_path"]
    list_filter = ["side_effect", "risk", "replay_safe", "retry_path", "provider"]
    search_fields = ["name"]
    filter_horizontal = ["alternates"]
    readonly_fields = ["created_at", "updated_at"]


class ChannelForm(forms.ModelForm):
    """A channel is an outbound request an admin types in: its URL is checked against RECOVERY_NOTIFY_HOSTS now (and
    again at every send), the secret is named by an environment variable, never stored."""

    url = forms.URLField(
        required=False, assume_scheme="https", help_text=models.NotificationChannel.url.field.help_text
    )

    class Meta:
        model = models.NotificationChannel
        fields = ["name", "kind", "url", "slack_channel", "email_to", "secret_env", "allow_private", "enabled"]

    def clean(self):
        cleaned = super().clean()
        kind = cleaned.get("kind")
        if kind in (models.ChannelKind.WEBHOOK, models.ChannelKind.SLACK):
            url = cleaned.get("url") or ("https://slack.com/api" if kind == models.ChannelKind.SLACK else "")
            cleaned["url"] = url
            if not url:
                self.add_error("url", "A webhook needs the receiver's URL.")
            elif refusal := url_refusal(url, allow_private=bool(cleaned.get("allow_private"))):
                self.add_error("url", f"Not allowed: {refusal}.")
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", cleaned.get("secret_env") or ""):
                self.add_error("secret_env", "Name the environment variable holding the secret (A-Z, 0-9, _).")
        if kind == models.ChannelKind.SLACK and not cleaned.get("slack_channel"):
            self.add_error("slack_channel", "Slack needs the channel id to post in.")
        if kind == models.ChannelKind.EMAIL:
            addresses = [a.strip() for a in (cleaned.get("email_to") or "").split(",") if a.strip()]
            if not addresses or any(a != "assignee" and not re.fullmatch(r"[^@\s]+@[^@\s]+", a) for a in addresses):
                self.add_error("email_to", "Give one or more e-mail addresses, comma-separated.")
        return cleaned


class RuleForm(forms.ModelForm):
    class Meta:
        model = models.NotificationRule
        fields = ["name", "channel", "events", "tenant", "tool", "risk", "window_s", "enabled"]

    def clean_events(self):
        events = self.cleaned_data.get("events")
        known = set(models.EventKind.values)
        if not isinstance(events, list) or not events or any(e not in known for e in events):
            raise forms.ValidationError(f"A list of event kinds among: {', '.join(sorted(known))}.")
        return events

    def clean_window_s(self):
        window = self.cleaned_data.get("window_s")
        if not window or window < 1 or window > 86_400:
            raise forms.ValidationError("Between 1 and 86400 seconds.")
        return window


@admin.register(models.NotificationChannel)
class NotificationChannelAdmin(RegistryAdmin):
    audit_action = AuditAction.NOTIFICATIONS_EDITED
    form = ChannelForm
    list_display = ["name", "kind", "url", "slack_channel", "email_to", "enabled"]


@admin.register(models.NotificationRule)
class NotificationRuleAdmin(RegistryAdmin):
    audit_action = AuditAction.NOTIFICATIONS_EDITED
    form = RuleForm
    list_display = ["name", "channel", "events", "tenant", "tool", "risk", "window_s", "enabled"]

    def save_model(self, request, obj, form, change):
        """A rule added or enabled again catches up with what already waits (docs/notifications.md)."""
        super().save_model(request, obj, form, change)
        if not change or "enabled" in form.changed_data:
            taken = rule_catch_up(obj)
            if taken:
                self.message_user(request, f"The rule's first message will list the {taken} item(s) already waiting.")


@admin.register(models.ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    # Tokens are issued by `manage.py create_api_token` (the secret is shown once); here they are only revoked,
    # through the same service as `revoke_api_token`, so every revocation is an audit event.
    list_display = ["name", "scope", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["scope"]
    readonly_fields = [
        "name", "scope", "prefix", "digest", "tenants", "created_by", "created_at", "last_used_at", "revoked_at",
    ]  # fmt: skip
    fields = readonly_fields
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke the selected API tokens", permissions=["change"])
    def revoke(self, request, queryset):
        revoked = 0
        for token in queryset.filter(revoked_at__isnull=True):
            token_revoke(name=token.name, actor=Actor.for_user(request.user))
            revoked += 1
        self.message_user(request, f"{revoked} token(s) revoked.")


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


@admin.register(models.ActionRequest)
class ActionRequestAdmin(ReadOnlyAdmin):
    """Operator action requests, written only by recovery.services.actions (the console's action pages)."""

    list_display = ["id", "call", "action", "status", "requested_by", "decided_by", "previewed_at", "expires_at"]
    list_filter = ["status", "action"]
    search_fields = ["plan_hash", "reason"]
    raw_id_fields = ["call", "attempt"]


@admin.register(models.DrillRun)
class DrillRunAdmin(ReadOnlyAdmin):
    """Fault drill runs, written by `manage.py drill` only: each drill's expected and observed ends, effects and
    checks, and the printed log."""

    list_display = ["id", "started_at", "drill_names", "passed", "finished_at", "jobs"]
    list_filter = ["passed"]
    fields = ["drills", "started_at", "finished_at", "passed", "jobs", "options", "result_table", "printed_log"]
    readonly_fields = fields

    @admin.display(description="drills")
    def drill_names(self, obj):
        return ", ".join(obj.drills)

    @admin.display(description="results")
    def result_table(self, obj):
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.result_table())

    @admin.display(description="log")
    def printed_log(self, obj):
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.log)

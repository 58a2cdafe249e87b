"""The Django admin: admins edit the registry there; what the engine recorded is shown read-only, even to them."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse

from recovery.audit.chain import Actor
from recovery.models import (
    ActionRequest,
    ApiToken,
    Attempt,
    AuditChainHead,
    AuditEvent,
    Call,
    Decision,
    Diagnostic,
    DrillRun,
    GateDecision,
    NotificationChannel,
    NotificationRule,
    Provider,
    Receipt,
    Step,
    Task,
    Tenant,
    Tool,
)
from recovery.services.users import user_save_with_roles
from recovery.statemachine.transitions import transition_call

PASSWORD = "correct-horse-battery-9"
RECOVERY_MODELS = {
    Tenant, Provider, Tool, ApiToken, Task, Step, Call, Attempt, Decision, GateDecision, Receipt, Diagnostic,
    AuditEvent, AuditChainHead, DrillRun, ActionRequest, NotificationChannel, NotificationRule,
}  # fmt: skip
RECORDED = [AuditEvent, Call, Attempt, Receipt]


def _url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


@pytest.fixture
def admin_user(db):
    user, _ = user_save_with_roles(username="ada", roles=["admin"], password=PASSWORD, actor=Actor.system("tests"))
    return user


@pytest.fixture
def admin_client(client, admin_user):
    response = client.post(reverse("admin:login"), {"username": "ada", "password": PASSWORD, "next": "/admin/"})
    assert response.status_code == 302, "the admin could not sign in"
    return client


@pytest.fixture
def recorded(registry, make_call, actor):
    """One row of everything the engine records, so every changelist renders real rows."""
    call = make_call("READY", provider_ref="pr-1")
    transition_call(call, "SENT", actor=actor, reason="admitted")
    attempt = Attempt.objects.create(call=call, attempt_id="a-1", number=1, tool=call.tool, fingerprint="f" * 64)
    diagnostic = Diagnostic.objects.create(ref="diag-1", call=call, source="attempt", summary="timeout")
    Decision.objects.create(call=call, attempt=attempt, route="reconcile", public_message="checking")
    GateDecision.objects.create(call=call, attempt=attempt, allowed=True, reason="first_attempt")
    receipt = Receipt.objects.create(
        call=call,
        provider=registry["provider"],
        source="poll",
        observed="pending",
        local_state_before="SENT",
        local_state_after="SENT",
        diagnostic=diagnostic,
    )
    ApiToken.objects.create(name="runtime", prefix="rc_abc", digest="d" * 64)
    DrillRun.objects.create(drills=["timeout after send"])
    mail = NotificationChannel.objects.create(name="oncall", kind="email", email_to="oncall@example.com")
    NotificationRule.objects.create(name="reviews", channel=mail, events=["human_review"])
    ActionRequest.objects.create(
        call=call, action="reconcile_now", plan_hash="h" * 64, call_version=call.version, expires_at=call.created_at
    )
    return {"call": call, "attempt": attempt, "receipt": receipt, "event": AuditEvent.objects.get(call=call)}


def test_it_registers_every_recovery_model(db):
    registered = {model for model in admin.site._registry if model._meta.app_label == "recovery"}
    assert registered == RECOVERY_MODELS


def test_an_admin_signs_in_and_sees_the_index(admin_client):
    response = admin_client.get("/admin/")
    assert response.status_code == 200
    assert b"Recovery" in response.content
    assert response.context["user"].username == "ada"


def test_a_wrong_password_does_not_sign_in(client, admin_user):
    response = client.post(reverse("admin:login"), {"username": "ada", "password": "wrong-horse-battery-9"})
    assert response.status_code == 200  # the form again, with an error
    assert client.get("/admin/").status_code == 302


@pytest.mark.parametrize("model", sorted(RECOVERY_MODELS, key=lambda m: m.__name__), ids=lambda m: m.__name__)
def test_an_admin_opens_every_changelist(admin_client, recorded, model):
    response = admin_client.get(_url(model, "changelist"))
    assert response.status_code == 200
    assert response.context["cl"].result_count == model.objects.count() > 0


def test_an_admin_can_add_to_the_registry(admin_client):
    for model in (Tenant, Provider, Tool):
        assert admin_client.get(_url(model, "add")).status_code == 200
    response = admin_client.post(
        _url(Provider, "add"),
        {"name": "shipping", "base_url": "https://shipping.example.com/", "connect_timeout_s": "3",
         "read_timeout_s": "10", "auth": "{}", "idempotency_conflict_codes": "[]", "status_breaker": "{}",
         "created_at_0": "2025-01-02", "created_at_1": "03:04:05"},
    )  # fmt: skip
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    assert Provider.objects.filter(name="shipping").exists()


@pytest.mark.parametrize("model", RECORDED, ids=lambda m: m.__name__)
def test_nobody_adds_what_the_engine_records(admin_client, model):
    count = model.objects.count()
    assert admin_client.get(_url(model, "add")).status_code == 403
    assert admin_client.post(_url(model, "add"), {}).status_code == 403
    assert model.objects.count() == count


def test_an_api_token_cannot_be_added_in_the_admin(admin_client):
    assert admin_client.get(_url(ApiToken, "add")).status_code == 403


def test_an_audit_event_is_shown_read_only(admin_client, recorded):
    event = recorded["event"]
    response = admin_client.get(_url(AuditEvent, "change", event.pk))
    assert response.status_code == 200
    assert b"admitted" in response.content  # the event is shown...
    assert b'name="_save"' not in response.content  # ...with no Save button
    assert b'name="_continue"' not in response.content
    assert _url(AuditEvent, "delete", event.pk).encode() not in response.content


def test_a_post_to_an_audit_event_is_refused_and_changes_nothing(admin_client, recorded):
    event = recorded["event"]
    before = AuditEvent.objects.filter(pk=event.pk).values().get()
    response = admin_client.post(
        _url(AuditEvent, "change", event.pk),
        {"reason": "nothing happened", "to_state": "READY", "action": "call.transition", "_save": "Save"},
    )
    assert response.status_code == 403
    assert AuditEvent.objects.filter(pk=event.pk).values().get() == before
    assert admin_client.post(_url(AuditEvent, "delete", event.pk), {"post": "yes"}).status_code == 403
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_a_post_to_a_call_is_refused_and_changes_nothing(admin_client, recorded):
    call = recorded["call"]
    response = admin_client.post(_url(Call, "change", call.pk), {"state": "COMMITTED", "version": "9", "_save": "1"})
    assert response.status_code == 403
    call.refresh_from_db()
    assert (call.state, call.version) == ("SENT", 1)


def test_a_viewer_is_sent_to_the_admin_login(client, db):
    user_save_with_roles(username="val", roles=["viewer"], password=PASSWORD, actor=Actor.system("tests"))
    # The login form itself refuses a non-staff account...
    response = client.post(reverse("admin:login"), {"username": "val", "password": PASSWORD, "next": "/admin/"})
    assert response.status_code == 200
    assert b"staff account" in response.content
    # ...and a viewer who is signed in anyway (e.g. through the console) is redirected to it.
    client.login(username="val", password=PASSWORD)
    for path in ("/admin/", _url(Call, "changelist")):
        response = client.get(path)
        assert response.status_code == 302
        assert response.url.startswith(reverse("admin:login"))


def test_a_signed_out_request_is_sent_to_the_login(client, db):
    response = client.get("/admin/recovery/call/")
    assert response.status_code == 302
    assert response.url == "/admin/login/?next=/admin/recovery/call/"


def test_an_admin_adds_a_webhook_channel_and_a_rule_each_audited(admin_client, settings):
    settings.RECOVERY_NOTIFY_HOSTS = ["127.0.0.1"]
    channel = {"name": "hook", "kind": "webhook", "url": "http://127.0.0.1:9/hook", "secret_env": "HOOK_SECRET"}
    response = admin_client.post(_url(NotificationChannel, "add"), {**channel, "url": "https://127.0.0.1:9/hook"})
    assert "private or loopback" in str(response.context["adminform"].form.errors["url"])  # not without allowing it
    response = admin_client.post(_url(NotificationChannel, "add"), {**channel, "url": "https://other.example/hook"})
    assert "not on RECOVERY_NOTIFY_HOSTS" in str(response.context["adminform"].form.errors["url"])
    response = admin_client.post(_url(NotificationChannel, "add"), {**channel, "allow_private": "on", "enabled": "on"})
    assert response.status_code == 302
    hook = NotificationChannel.objects.get(name="hook")
    response = admin_client.post(
        _url(NotificationRule, "add"),
        {"name": "reviews", "channel": hook.pk, "events": '["human_review", "nonsense"]', "window_s": "30"},
    )
    assert "event kinds" in str(response.context["adminform"].form.errors["events"])
    response = admin_client.post(
        _url(NotificationRule, "add"),
        {"name": "reviews", "channel": hook.pk, "events": '["human_review", "resolved"]', "window_s": "30",
         "enabled": "on"},
    )  # fmt: skip
    assert response.status_code == 302
    edits = AuditEvent.objects.filter(action="notifications.edited").order_by("id")
    assert [e.evidence["kind"] for e in edits] == ["notificationchannel", "notificationrule"]
    assert {e.actor_user.username for e in edits} == {"ada"}

"""API tokens (docs/api.md): shown once, stored as a peppered HMAC, scoped to tenants, revocable, last use recorded."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import re
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recovery.models import ApiToken, AuditEvent, Tenant
from recovery.services.tokens import token_authenticate, token_create, token_revoke

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenants(db):
    return [Tenant.objects.create(name="acme"), Tenant.objects.create(name="globex")]


@pytest.fixture
def issued(tenants, actor):
    return token_create(name="support-agent", tenants=["acme", "globex"], actor=actor)


def test_it_stores_a_peppered_digest_and_never_the_token(issued, settings):
    token, raw = issued
    assert raw.startswith("rc_") and len(raw) > 40
    token.refresh_from_db()
    assert token.prefix == raw[:12]
    expected = hmac.new(settings.RECOVERY_TOKEN_PEPPER.encode(), raw.encode(), hashlib.sha256).hexdigest()
    assert token.digest == expected
    assert token.digest != hashlib.sha256(raw.encode()).hexdigest()  # the pepper is in it
    stored = json.dumps(list(ApiToken.objects.values()), default=str)
    assert raw not in stored and raw[12:] not in stored


def test_it_authenticates_a_live_token_with_its_tenants(issued, tenants):
    token, raw = issued
    found = token_authenticate(raw)
    assert found is not None and found.pk == token.pk
    assert found.tenant_ids == {tenant.pk for tenant in tenants}
    with CaptureQueriesContext(connection) as queries:
        assert {tenant.name for tenant in found.tenant_list} == {"acme", "globex"}  # read with the token
    assert len(queries) == 0


@pytest.mark.parametrize(
    "mangle",
    [
        lambda raw: raw[:-1] + ("A" if raw[-1] != "A" else "B"),  # the right prefix, a wrong secret
        lambda raw: raw[:12],  # the prefix alone
        lambda raw: "rc_" + "x" * 43,  # an unknown prefix
        lambda raw: raw[3:],  # no scheme
        lambda raw: "",
        lambda raw: raw + "x" * 300,  # absurdly long
    ],
)
def test_it_refuses_a_wrong_or_unknown_token(issued, mangle):
    _, raw = issued
    assert token_authenticate(mangle(raw)) is None


def test_it_refuses_a_token_checked_with_another_pepper(issued, settings):
    _, raw = issued
    settings.RECOVERY_TOKEN_PEPPER = "another-pepper"
    assert token_authenticate(raw) is None


def test_it_refuses_a_revoked_token(issued, actor):
    token, raw = issued
    revoked = token_revoke(name="support-agent", actor=actor)
    assert revoked.revoked_at is not None
    assert token_authenticate(raw) is None
    event = AuditEvent.objects.get(action="api_token.revoked")
    assert event.evidence == {"name": "support-agent", "prefix": token.prefix}
    with pytest.raises(ValueError, match="already revoked"):
        token_revoke(name="support-agent", actor=actor)
    with pytest.raises(ValueError, match="no API token named 'nobody'"):
        token_revoke(name="nobody", actor=actor)


def test_it_records_last_use_at_most_once_a_minute(issued):
    token, raw = issued
    assert token.last_used_at is None
    first = timezone.now()
    assert token_authenticate(raw, now=first).last_used_at == first
    token.refresh_from_db()
    assert token.last_used_at == first

    with CaptureQueriesContext(connection) as queries:
        token_authenticate(raw, now=first + timedelta(seconds=59))
    assert not [q for q in queries if q["sql"].startswith("UPDATE")]  # a read on the hot path
    token.refresh_from_db()
    assert token.last_used_at == first

    later = first + timedelta(seconds=61)
    token_authenticate(raw, now=later)
    token.refresh_from_db()
    assert token.last_used_at == later


def test_it_authenticates_in_a_fixed_number_of_queries(issued):
    _, raw = issued
    token_authenticate(raw)
    with CaptureQueriesContext(connection) as queries:
        token_authenticate(raw)  # within the minute: the token with its tenants, one query
    assert len(queries) == 1
    with CaptureQueriesContext(connection) as queries:
        token_authenticate("rc_" + "x" * 43)
    assert len(queries) == 1


def test_it_stores_nothing_for_an_unknown_tenant(tenants, actor):
    with pytest.raises(ValueError, match="unknown tenant 'initech'"):
        token_create(name="bad", tenants=["acme", "initech"], actor=actor)
    assert not ApiToken.objects.exists()
    assert not AuditEvent.objects.exists()


def test_it_refuses_a_duplicate_name_or_no_tenant(issued, actor):
    with pytest.raises(ValueError, match="already exists"):
        token_create(name="support-agent", tenants=["acme"], actor=actor)
    with pytest.raises(ValueError, match="at least one tenant"):
        token_create(name="other", tenants=[], actor=actor)
    assert ApiToken.objects.count() == 1


def test_it_writes_an_audit_event_without_the_secret(issued, actor):
    token, raw = issued
    token_revoke(name=token.name, actor=actor)
    events = list(AuditEvent.objects.values())
    assert [e["action"] for e in events] == ["api_token.created", "api_token.revoked"]
    assert events[0]["evidence"] == {
        "name": "support-agent",
        "prefix": raw[:12],
        "scope": "runtime",
        "tenants": ["acme", "globex"],
    }
    dumped = json.dumps(events, default=str)
    assert raw not in dumped and raw[12:] not in dumped and token.digest not in dumped


def test_the_command_prints_the_token_once(tenants):
    out = io.StringIO()
    call_command("create_api_token", "runtime-1", "--tenant", "acme", "--tenant", "globex", stdout=out)
    text = out.getvalue()
    token = ApiToken.objects.get(name="runtime-1")
    (raw,) = [line for line in text.splitlines() if line.startswith(token.prefix)]
    assert text.count(raw) == 1
    assert "will not be shown again" in text
    assert token_authenticate(raw).pk == token.pk
    assert set(token.tenants.values_list("name", flat=True)) == {"acme", "globex"}


def test_the_command_names_an_unknown_tenant_and_stores_nothing(tenants):
    with pytest.raises(CommandError, match=r"unknown tenant 'initech'.*no token was created"):
        call_command("create_api_token", "runtime-1", "--tenant", "acme", "--tenant", "initech", stdout=io.StringIO())
    assert not ApiToken.objects.exists()


def test_the_revoke_command_revokes(issued):
    token, raw = issued
    out = io.StringIO()
    call_command("revoke_api_token", "support-agent", stdout=out)
    assert f"revoked API token 'support-agent' ({token.prefix}" in out.getvalue()
    assert token_authenticate(raw) is None
    with pytest.raises(CommandError, match="already revoked"):
        call_command("revoke_api_token", "support-agent", stdout=io.StringIO())


# --- scopes: runtime (the machine API) or metrics (GET /api/v1/metrics and /metrics only) --------------------------


def test_a_token_is_a_runtime_token_unless_asked(issued):
    token, raw = issued
    assert token.scope == "runtime" and token_authenticate(raw).scope == "runtime"


def test_it_issues_a_metrics_token_and_audits_its_scope(tenants, actor):
    _, raw = token_create(name="prometheus", tenants=["acme"], scope="metrics", actor=actor)
    assert token_authenticate(raw).scope == "metrics"
    event = AuditEvent.objects.get(action="api_token.created")
    assert event.evidence["scope"] == "metrics" and event.reason == "metrics token for acme"


def test_it_refuses_an_unknown_scope_and_stores_nothing(tenants, actor):
    with pytest.raises(ValueError, match="unknown token scope 'admin': use one of runtime, metrics"):
        token_create(name="root", tenants=["acme"], scope="admin", actor=actor)
    assert not ApiToken.objects.exists() and not AuditEvent.objects.exists()


def test_the_command_issues_a_metrics_token(tenants):
    out = io.StringIO()
    call_command("create_api_token", "prometheus", "--tenant", "acme", "--scope", "metrics", stdout=out)
    token = ApiToken.objects.get(name="prometheus")
    assert token.scope == "metrics"
    assert f"created metrics API token 'prometheus' ({token.prefix}" in out.getvalue()


def test_the_command_refuses_an_unknown_scope(tenants):
    with pytest.raises(CommandError, match="invalid choice: 'admin'"):
        call_command("create_api_token", "root", "--tenant", "acme", "--scope", "admin", stdout=io.StringIO())
    assert not ApiToken.objects.exists()


def test_the_admin_lists_and_filters_tokens_by_scope(tenants, actor, admin_client):
    token_create(name="prometheus", tenants=["acme"], scope="metrics", actor=actor)
    token_create(name="support-agent", tenants=["acme"], actor=actor)
    listed = admin_client.get("/admin/recovery/apitoken/?scope__exact=metrics")
    assert listed.status_code == 200
    body = listed.content.decode()
    assert "prometheus" in body and "support-agent" not in body
    assert re.search(r'class="field-scope">\s*(Metrics|metrics)\s*<', body)

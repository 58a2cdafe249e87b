"""Breakers and deadlines through the API: a 5xx storm opens the tool's breaker for every runtime, admission then
degrades to the fallback, and after the cooldown exactly one probe reaches the provider."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from recovery_client import NotAdmitted, RecoveryClient

from recovery.audit.chain import Actor
from recovery.models import AuditEvent, Breaker
from recovery.registry import load_registry
from recovery.services.tokens import token_create

pytestmark = pytest.mark.django_db(transaction=True)

REGISTRY = {
    "tenants": [{"name": "acme", "tools": "*"}],
    "providers": [{"name": "shop", "base_url": "http://127.0.0.1:9"}],
    "tools": [
        {
            "name": "order.lookup",
            "provider": "shop",
            "side_effect": "read",
            "request": {"method": "GET", "path": "/orders"},
            "args_schema": {"type": "object"},
            "budgets": {"max_attempts": 2},
            "backoff": {"base_ms": 50, "cap_ms": 100},
            "breaker": {"window_s": 60, "bucket_s": 10, "min_calls": 3, "failure_rate": 0.5, "cooldown_s": 1,
                        "half_open_probes": 1, "probe_lease_s": 30},
            "fallback": "read_only_summary",
        }
    ],
}  # fmt: skip
SENT = {"connection_opened": True, "sent": True}


@pytest.fixture
def client(live_server) -> RecoveryClient:
    load_registry(REGISTRY, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["acme"], actor=Actor.system("tests"))
    return RecoveryClient(live_server.url, token)


def lookup(client, task, n):
    return client.add_call(task.id, step=n, tool="order.lookup", arguments={"n": n}, idempotency_key=f"k{n}")


def test_a_5xx_storm_opens_the_breaker_degrades_and_lets_one_probe_through(client):
    task = client.create_task("acme", "storm", agent="tests", goal="look up orders")
    answers = []
    for n in (1, 2, 3):
        call = lookup(client, task, n)
        client.admit(call.call_id, "a1")
        answers.append(client.report(call.call_id, "a1", SENT | {"http_status": 503}))
    assert [a.breaker_state for a in answers] == ["closed", "closed", "open"]
    assert answers[-1].decision["route"] == "degrade"
    assert answers[-1].decision["required_next"]["detail"]["fallback"] == "read_only_summary"
    assert AuditEvent.objects.filter(action="breaker.opened").count() == 1

    fresh = lookup(client, task, 4)
    with pytest.raises(NotAdmitted) as denied:  # fail fast: nothing reaches the provider
        client.admit(fresh.call_id, "a1")
    assert denied.value.gate["reason"] == "breaker_open"
    assert denied.value.required_next["action"] == "degrade"

    time.sleep(1.1)  # the cooldown
    probe = client.admit(fresh.call_id, "a1")
    other = lookup(client, task, 5)
    with pytest.raises(NotAdmitted):  # the single half-open probe is taken
        client.admit(other.call_id, "a1")
    assert client.report(fresh.call_id, probe.attempt_id, SENT | {"http_status": 200, "result": {}}).call_state == (
        "COMMITTED"
    )
    assert Breaker.objects.get(tool__name="order.lookup").state == "closed"
    assert client.admit(other.call_id, "a1").call_state == "SENT"
    client.report(other.call_id, "a1", SENT | {"http_status": 200, "result": {}})

    summary = client.complete_task(task.id, "partial summary from the read-only fallback")
    assert summary.outcome == "degraded"  # finished on the fallback path, not "completed"
    assert len(summary.raw["pending"]) == 3 and len(summary.raw["done"]) == 2


def test_a_task_past_its_deadline_without_a_submission_is_flagged(client):
    deadline = (timezone.now() + timedelta(seconds=1)).isoformat()
    task = client.create_task("acme", "late", agent="tests", goal="g", budget={"deadline": deadline})
    assert client.get_task(task.id).raw["no_submission"] is False
    time.sleep(1.1)
    flagged = client.get_task(task.id).raw
    assert flagged["no_submission"] is True
    assert flagged["next_action"].startswith("submit_or_abandon")


def test_an_admission_that_loses_the_half_open_probe_to_another_is_told_to_degrade(client, monkeypatch):
    """Two runtimes ask for the one probe at once: both gates see it free, only one reservation wins. The loser's
    409 must still say what to do (degrade, with the fallback), like any breaker denial — it said nothing before."""
    from recovery.services import attempts

    task = client.create_task("acme", "race", agent="tests", goal="look up orders")
    for n in (1, 2, 3):
        call = lookup(client, task, n)
        client.admit(call.call_id, "a1")
        client.report(call.call_id, "a1", SENT | {"http_status": 503})
    time.sleep(1.1)  # the cooldown: the breaker reads half_open with its one probe free
    loser = lookup(client, task, 4)
    real_reserve = attempts.breaker_reserve_probe

    def another_admission_reserves_first(tool, *, now):
        assert real_reserve(tool, now=now)  # the other runtime's admission, between our gate and our reservation
        return real_reserve(tool, now=now)

    monkeypatch.setattr(attempts, "breaker_reserve_probe", another_admission_reserves_first)
    with pytest.raises(NotAdmitted) as denied:
        client.admit(loser.call_id, "a1")

    assert denied.value.gate["reason"] == "breaker_open"
    assert denied.value.required_next["action"] == "degrade"
    assert denied.value.required_next["detail"]["fallback"] == "read_only_summary"
    breaker_check = [check for check in denied.value.gate["checks"] if check["name"] == "breaker"]
    assert breaker_check == [{"name": "breaker", "passed": False, "detail": "half_open: the probe is taken"}]
    assert client.get_call(loser.call_id)["state"] == "READY"

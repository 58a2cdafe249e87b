"""Duplicate probes (docs/replay.md) against the real sandbox process, through the operator action flow: a probe replays
a committed refund with its original key after a second person approved it, reads the provider's own ledger, and
decides the tool's retry path — safe when the provider deduplicated, unsafe when it ignored the key (broken mode).
An unsafe retry path refuses every same-key replay of the tool at the gate; a reload never resets it.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import AuditEvent, DuplicateProbe, Receipt, Tenant, Tool
from recovery.registry import load_registry
from recovery.services.action_plans import action_options
from recovery.services.reconcile import reconcile_due
from tests import test_action_services as base
from tests.sandbox import sandbox_registry
from tests.test_action_services import fresh, refused

held_jobs, world = base.held_jobs, base.world

pytestmark = pytest.mark.django_db(transaction=True)


def _committed(world):
    call = world.refund_call()
    assert world.attempt(call) == "COMMITTED"
    return fresh(call)


def test_a_probe_of_a_provider_that_deduplicates_proves_the_retry_path_safe(world):
    call = _committed(world)
    key = call.idempotency_key
    assert Tool.objects.get(name="refund.create").retry_path == "unprobed"

    req = world.run_action(call, "probe_duplicate")

    probe = DuplicateProbe.objects.get(call=call)
    assert (probe.first, probe.second, probe.downstream_audit, probe.decision) == (
        "COMMITTED",
        "idempotent_replay",
        "one_effect",
        "retry_path_safe",
    )
    assert (probe.expected_effects, probe.observed_effects) == (1, 1)
    assert probe.second_business_id == probe.first_business_id == call.provider_ref != ""
    assert probe.provider_base_url == world.sandbox.url and probe.action_id == req.pk
    assert probe.idempotency_key == key and probe.key_age_s >= 0
    tool = Tool.objects.get(name="refund.create")
    assert (tool.retry_path, tool.retry_path_probe_id, tool.retry_path_key_age_s) == ("safe", probe.pk, probe.key_age_s)
    assert [(p["status"], p["outcome"]) for p in world.posts(key)] == [(200, "answered"), (200, "replayed")]
    assert world.sandbox.ledger(key)["effects"] == 1
    # A receipt of its own: no attempt, no move, no reconcile receipt beyond the runtime's own.
    call_after = fresh(call)
    assert (call_after.state, call_after.version, call_after.attempts_count) == ("COMMITTED", call.version, 1)
    assert Receipt.objects.filter(call=call).count() == Receipt.objects.filter(call=call, source="runtime").count()
    assert "retry_path_safe" in req.result["what"]
    changed = AuditEvent.objects.get(action="tool.retry_path")
    assert (changed.from_state, changed.to_state) == ("unprobed", "safe")


def test_a_probe_of_a_provider_that_ignores_keys_marks_the_retry_path_unsafe_and_the_gate_refuses_replays(world):
    call = _committed(world)
    key = call.idempotency_key
    world.sandbox.fault(route="/refunds", key=key, kind="ignore_keys")  # broken mode for this key

    world.run_action(call, "probe_duplicate")

    probe = DuplicateProbe.objects.get(call=call)
    assert probe.decision == "retry_path_unsafe"
    assert (probe.second, probe.downstream_audit, probe.observed_effects) == ("new_business_id", "second_effect", 2)
    assert probe.second_business_id != probe.first_business_id
    assert world.sandbox.ledger(key)["effects"] == 2  # the probe's second effect is the evidence, on a test tenant
    assert Tool.objects.get(name="refund.create").retry_path == "unsafe"

    # A runtime's same-key retry after a receipt said not_committed is a replay: refused with retry_path_unsafe.
    other = world.unknown_call(kind="drop_before_commit")
    assert world.sandbox.ledger(other.idempotency_key)["effects"] == 0
    reconcile_due(worker="tests")
    assert fresh(other).state == "RETRYABLE"
    denied = world.admit(other, "state_verified")
    assert denied.status == 409
    gate = denied.response["gate"]
    assert gate["reason"] == "retry_path_unsafe"
    assert gate["required_next"]["action"] == "stop"
    # An operator's replay is refused too: the catalogue says why.
    review = world.review_call()
    options = {o.name: o for o in action_options(review, user=world.people["reviewer"], now=timezone.now())}
    assert not options["replay_same_key"].allowed and "duplicate probe" in options["replay_same_key"].reason

    # A reload of the registry never resets it; an approved action with a reason does.
    load_registry(sandbox_registry(world.sandbox.url), actor=Actor.system("tests"))
    assert Tool.objects.get(name="refund.create").retry_path == "unsafe"
    restored = world.run_action(call, "restore_retry_path")
    tool = Tool.objects.get(name="refund.create")
    assert tool.retry_path == "safe" and "the provider cannot tell us" in tool.retry_path_reason
    assert "safe again" in restored.result["what"]


def test_a_probe_without_the_providers_ledger_is_inconclusive_and_changes_nothing(world):
    Tool.objects.filter(name="refund.create").update(
        status_query={
            "method": "GET",
            "path": "/refunds/by-key/{idempotency_key}",
            "status_map": {"succeeded": "committed", "not_found": "not_committed"},
        }
    )  # no effects_field: the probe cannot count the key's effects
    Tool.objects.filter(name="refund.create").update(retry_path="unsafe")
    call = _committed(world)  # a first attempt is never a replay: it is admitted whatever the retry path says

    world.run_action(call, "probe_duplicate")

    probe = DuplicateProbe.objects.get(call=call)
    assert (probe.downstream_audit, probe.decision) == ("unreadable", "inconclusive")
    assert Tool.objects.get(name="refund.create").retry_path == "unsafe"  # as it was


def test_a_probe_runs_on_test_tenants_only_and_needs_a_second_person(world):
    call = _committed(world)
    Tenant.objects.filter(name="demo").update(sandbox=False)
    assert "sandbox (test) tenants only" in refused("forbidden", world.preview, fresh(call), "probe_duplicate").message
    Tenant.objects.filter(name="demo").update(sandbox=True)

    req = world.request(world.preview(fresh(call), "probe_duplicate", who="both"), who="both")
    refused("four_eyes", world.approve, req, who="both")  # a write: the requester never approves their own
    assert world.jobs.run() == 0 and not DuplicateProbe.objects.exists()
    plan = req.plan
    assert [r["method"] for r in plan["requests"]] == ["POST", "GET"]  # the replay, then the ledger read
    assert plan["requests"][0]["headers"]["Idempotency-Key"] == call.idempotency_key
    assert "two if it ignores keys" in plan["expected_effects"]

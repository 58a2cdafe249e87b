"""Replay reconciliation (docs/replay.md) against the real sandbox process: an unknown refund whose status query cannot
answer is settled by exactly one same-key replay — only for a tool a duplicate probe proved safe, only for a key the
provider still keeps and the probe covered, only when the tool's breaker admits it — and its answer is mapped onto
UNKNOWN's own edges. Two workers racing for one call send one replay (PostgreSQL). And when a write turns UNKNOWN
with first_check_s 0, its first status check is enqueued at once.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import Attempt, Breaker, BreakerState, Call, GateDecision, Receipt, Task, Tool
from recovery.registry import load_registry
from recovery.registry.format import validate_registry
from recovery.services import probes, replay_reconcile
from recovery.services.reconcile import apply_answer, reconcile_due
from tests import test_action_services as base
from tests.sandbox import sandbox_registry
from tests.test_action_services import _at_once, fresh

held_jobs = base.held_jobs

pytestmark = pytest.mark.django_db(transaction=True)
KEEPS_S = 86_400


def replaying_registry(url: str, **refund) -> dict:
    registry = sandbox_registry(url, max_checks=3)
    tool = next(t for t in registry["tools"] if t["name"] == "refund.create")
    tool["reconcile"]["replay_when_status_down"] = True
    tool["key_retention_s"] = KEEPS_S
    tool.update(refund)
    return registry


@pytest.fixture
def world(sandbox, monkeypatch, console_people, held_jobs):
    monkeypatch.setenv("SANDBOX_API_KEY", base.API_KEY)
    load_registry(replaying_registry(sandbox.url), actor=Actor.system("tests"))
    return base.World(sandbox=sandbox, people=dict(console_people), jobs=held_jobs)


PROBED_AGE_S = 600


def proved(world) -> Tool:
    """A real duplicate probe of a committed refund whose key is PROBED_AGE_S old (its first attempt dated back): the
    provider deduplicates, the retry path is safe for keys up to that age."""
    call = world.refund_call()
    assert world.attempt(call) == "COMMITTED"
    Attempt.objects.filter(call=call, number=1).update(admitted_at=timezone.now() - timedelta(seconds=PROBED_AGE_S))
    probe = probes.probe_call(fresh(call), actor=Actor.system("tests"))
    assert probe.decision == "retry_path_safe" and probe.key_age_s >= PROBED_AGE_S
    return Tool.objects.get(name="refund.create")


def lost_with_status_down(world, *, kind: str = "commit_then_drop") -> Call:
    """A refund whose reply was lost (after or before the commit) and whose status API answers 503 for its key."""
    call = world.refund_call()
    world.sandbox.fault(route="/refunds/by-key", key=call.idempotency_key, kind="status_down", status=503)
    world.sandbox.fault(route="/refunds", key=call.idempotency_key, kind=kind, times=1)
    assert world.attempt(call) == "UNKNOWN"
    return fresh(call)


def outcomes(world, key: str) -> list:
    return [(p["status"], p["outcome"]) for p in world.posts(key)]


def test_a_proved_tool_settles_a_lost_reply_by_one_idempotent_replay(world):
    proved(world)
    call = lost_with_status_down(world)
    key = call.idempotency_key

    reconcile_due(worker="tests")

    call = fresh(call)
    assert call.state == "COMMITTED" and call.replay_reconciled_at is not None
    assert outcomes(world, key) == [(None, "dropped_after_commit"), (200, "replayed")]
    assert world.sandbox.ledger(key)["effects"] == 1
    receipts = list(Receipt.objects.filter(call=call).order_by("pk").values_list("source", "observed"))
    assert receipts == [("poll", "failed"), ("idempotent_replay", "committed")]
    replay = Receipt.objects.get(call=call, source="idempotent_replay")
    assert replay.applied and replay.effects_observed == 1 and replay.provider_ref == call.provider_ref != ""
    attempt = Attempt.objects.get(call=call, number=2)
    assert (attempt.attempt_id, attempt.evidence, attempt.http_status) == (
        "reconcile-replay",
        ["replay_reconcile"],
        200,
    )
    gate = GateDecision.objects.get(call=call, attempt=attempt)
    assert gate.allowed and gate.evidence_used == "replay_reconcile"
    assert [c["name"] for c in gate.checks][-2:] == ["retry_path", "breaker"]
    task = Task.objects.get(pk=call.task_id)
    assert (task.rounds_used, task.write_retries_used) == (2, 1)  # counted like any attempt

    reconcile_due(worker="tests")  # settled: nothing more is sent
    assert len(world.posts(key)) == 2


def test_a_reply_lost_before_the_commit_is_made_once_by_the_replay(world):
    proved(world)
    call = lost_with_status_down(world, kind="drop_before_commit")

    reconcile_due(worker="tests")

    assert fresh(call).state == "COMMITTED"
    assert outcomes(world, call.idempotency_key) == [(None, "dropped_before_commit"), (200, "answered")]
    assert world.sandbox.ledger(call.idempotency_key)["effects"] == 1


def test_an_unprobed_tool_is_never_replayed_by_reconciliation(world):
    call = lost_with_status_down(world)  # no probe: the registry's replay_safe alone is not proof

    for _ in range(3):
        reconcile_due(worker="tests")
        Call.objects.filter(pk=call.pk).update(next_check_at=timezone.now())

    call = fresh(call)
    assert call.state == "HUMAN_REVIEW" and call.outcome == "poll_budget_exhausted"
    assert len(world.posts(call.idempotency_key)) == 1 and call.replay_reconciled_at is None
    assert not Receipt.objects.filter(call=call, source="idempotent_replay").exists()
    # Why, on the call's timeline: the gate's denial, stored once though three checks asked.
    denials = GateDecision.objects.filter(call=call, candidate_attempt_id="reconcile-replay")
    assert list(denials.values_list("allowed", "reason")) == [(False, "retry_path_unprobed")]


def test_the_gate_refuses_the_replay_when_the_tools_breaker_is_open(world):
    tool = proved(world)
    call = lost_with_status_down(world)
    Breaker.objects.update_or_create(tool=tool, defaults={"state": BreakerState.OPEN, "opened_at": timezone.now()})

    reconcile_due(worker="tests")

    call = fresh(call)
    assert call.state == "STILL_UNKNOWN" and call.replay_reconciled_at is None
    assert len(world.posts(call.idempotency_key)) == 1
    denial = GateDecision.objects.filter(call=call, allowed=False).latest("pk")
    assert denial.reason == "breaker_open" and denial.candidate["evidence"] == ["replay_reconcile"]


@pytest.mark.parametrize("covered_s, kept_s", [(60, KEEPS_S), (KEEPS_S, 3_900)])
def test_never_past_the_key_age_the_probe_covered_or_the_providers_retention(world, covered_s, kept_s):
    tool = proved(world)
    Tool.objects.filter(pk=tool.pk).update(retry_path_key_age_s=covered_s, key_retention_s=kept_s)
    call = lost_with_status_down(world)
    Attempt.objects.filter(call=call, number=1).update(admitted_at=timezone.now() - timedelta(seconds=3_700))

    reconcile_due(worker="tests")

    call = fresh(call)
    assert call.state == "STILL_UNKNOWN" and len(world.posts(call.idempotency_key)) == 1
    denial = GateDecision.objects.filter(call=call, allowed=False).latest("pk")
    assert denial.reason == "replay_key_too_old"
    assert denial.required_next["detail"]["limit_s"] == min(covered_s, kept_s - 300)


def test_a_replay_answered_5xx_is_still_unknown_and_never_replayed_again(world):
    proved(world)
    call = lost_with_status_down(world, kind="drop_before_commit")
    world.sandbox.fault(route="/refunds", key=call.idempotency_key, kind="error", status=503, method="POST", times=1)

    reconcile_due(worker="tests")
    call = fresh(call)
    assert call.state == "STILL_UNKNOWN"
    replay = Receipt.objects.get(call=call, source="idempotent_replay")
    assert (replay.observed, replay.http_status, replay.applied) == ("ambiguous", 503, False)

    Call.objects.filter(pk=call.pk).update(next_check_at=timezone.now())
    reconcile_due(worker="tests")

    assert [p["status"] for p in world.posts(call.idempotency_key)] == [None, 503]  # no second replay
    assert Receipt.objects.filter(call=call, source="idempotent_replay").count() == 1


def test_a_replay_that_times_out_is_still_unknown_and_never_replayed_again(world):
    proved(world)
    call = lost_with_status_down(world, kind="drop_before_commit")
    world.sandbox.fault(route="/refunds", key=call.idempotency_key, kind="latency", ms=3_000, method="POST", times=1)

    reconcile_due(worker="tests")  # the read timeout is 2 s: the replay's outcome is unknown

    call = fresh(call)
    replay = Receipt.objects.get(call=call, source="idempotent_replay")
    assert (call.state, replay.observed, replay.http_status) == ("STILL_UNKNOWN", "ambiguous", None)
    Call.objects.filter(pk=call.pk).update(next_check_at=timezone.now())
    reconcile_due(worker="tests")
    time.sleep(1.5)  # the sandbox logs the held request when it ends
    assert len(world.posts(call.idempotency_key)) == 2  # the lost first request and the one replay, no third


def test_a_replay_rejected_as_invalid_proves_nothing_was_stored(world):
    proved(world)
    call = lost_with_status_down(world, kind="drop_before_commit")
    world.sandbox.fault(
        route="/refunds", key=call.idempotency_key, kind="error", status=400, code="invalid_request", method="POST"
    )

    reconcile_due(worker="tests")

    call = fresh(call)
    replay = Receipt.objects.get(call=call, source="idempotent_replay")
    assert replay.observed == "not_committed" and replay.local_state_before == "STILL_UNKNOWN"
    assert call.state in ("NOT_COMMITTED", "RETRYABLE", "FAILED_PERMANENT")
    assert world.sandbox.ledger(call.idempotency_key)["effects"] == 0


@pytest.mark.postgres
def test_two_workers_racing_for_one_call_send_one_replay(world):
    proved(world)
    call = lost_with_status_down(world)
    loaded = [fresh(call), fresh(call)]  # both past their claim (a lease that expired under a slow worker)

    sent = _at_once(*(lambda c=c: replay_reconcile.replay(c, worker=f"w{id(c)}", apply=apply_answer) for c in loaded))

    assert sorted(sent) == [False, True]
    assert outcomes(world, call.idempotency_key) == [(None, "dropped_after_commit"), (200, "replayed")]
    assert fresh(call).state == "COMMITTED"
    assert Attempt.objects.filter(call=call, attempt_id="reconcile-replay").count() == 1


def test_a_first_check_due_at_once_is_enqueued_when_the_write_turns_unknown(world):
    call = world.refund_call()
    world.sandbox.fault(route="/refunds", key=call.idempotency_key, kind="commit_then_drop", times=1)
    assert world.attempt(call) == "UNKNOWN"

    # One sweep of the due calls (its run's id ends with a token of its own), not a job for this call alone.
    assert [job_id.rsplit("-", 1)[0] for _, _, job_id in world.jobs.checks] == ["reconcile-now"]
    assert world.jobs.run_checks() == 1

    assert fresh(call).state == "COMMITTED"
    assert list(Receipt.objects.filter(call=call).values_list("source", "observed")) == [("poll", "committed")]


def test_the_registry_states_what_replay_reconciliation_needs(sandbox):
    registry = replaying_registry(sandbox.url)
    index = next(i for i, t in enumerate(registry["tools"]) if t["name"] == "refund.create")
    refund, where = registry["tools"][index], f"$.tools[{index}]"
    assert validate_registry(registry) == []
    refund["status_query"] = None  # no status API: legal for a tool settled by replay reconciliation
    assert validate_registry(registry) == []

    del refund["key_retention_s"]
    refund["replay_safe"] = False
    errors = {e.path: e.message for e in validate_registry(registry)}
    assert "required with reconcile.replay_when_status_down" in errors[f"{where}.key_retention_s"]
    assert "needs replay_safe: true" in errors[f"{where}.reconcile.replay_when_status_down"]

    refund["reconcile"]["replay_when_status_down"] = False
    errors = {e.path: e.message for e in validate_registry(registry)}
    assert list(errors) == [f"{where}.status_query"]
    assert errors[f"{where}.status_query"].startswith("null only for a write settled by replay reconciliation")


def test_a_replay_lookup_settles_a_lost_reply_by_the_replay_alone_with_no_status_query(world):
    # A provider that answers a same-key re-send with the original outcome (PayPal's PayPal-Request-Id) and has no
    # lookup a lost reply could use: its status_query is the replay itself (docs/providers.md).
    proved(world)
    Tool.objects.filter(name="refund.create").update(status_query={"kind": "replay"})
    call = world.refund_call()
    world.sandbox.fault(route="/refunds", key=call.idempotency_key, kind="commit_then_drop", times=1)
    assert world.attempt(call) == "UNKNOWN"

    reconcile_due(worker="tests")

    assert fresh(call).state == "COMMITTED"
    assert outcomes(world, call.idempotency_key) == [(None, "dropped_after_commit"), (200, "replayed")]
    asked = world.sandbox.requests(path_prefix="/refunds/by-key", key=call.idempotency_key)
    assert asked == []  # nothing but the replay was asked
    sources = list(Receipt.objects.filter(call=call).values_list("source", "observed"))
    assert sources == [("idempotent_replay", "committed")]

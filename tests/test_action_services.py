"""Operator actions (docs/actions.md): the dry run, the request, the second person's decision — four eyes in the service
and in the database, the role matrix, stale and expired requests, evidence, one confirmation for reads, and the one
admission an approval allows.

Calls are made and attempted the way a runtime does (the real services, a real request to the sandbox process, the
facts `requests` saw); jobs the services enqueue are held (`world.jobs`) and run when a test says so, so a test can
look between an approval and its execution.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from recovery_client import facts_from_exception, facts_from_response

from recovery.audit.chain import Actor
from recovery.jobs import inprocess
from recovery.models import (
    ActionRequest,
    ActionStatus,
    Attempt,
    AuditEvent,
    Call,
    CompensationEntry,
    GateDecision,
    Provider,
    Receipt,
    Task,
    Tenant,
    Tool,
)
from recovery.models.roles import APPROVER, REVIEWER
from recovery.providers.requests import TemplateError, tool_request
from recovery.registry import load_registry
from recovery.selectors.waiting import asked_for, why_waiting
from recovery.services import action_execution
from recovery.services.action_plans import CHECKS
from recovery.services.actions import (
    action_approve,
    action_execute,
    action_preview,
    action_reject,
    action_request,
    action_withdraw,
    actions_expire_due,
)
from recovery.services.attempts import Admission, AttemptRequest, attempt_admit
from recovery.services.calls import call_add
from recovery.services.claims import call_claim
from recovery.services.compensation_plans import derive_key
from recovery.services.compensations import compensation_check, compensations_run_due
from recovery.services.errors import Refusal
from recovery.services.outcomes import attempt_report, facts_of
from recovery.services.reconcile import reconcile_due
from recovery.services.tasks import task_create
from recovery.services.users import user_save_with_roles
from tests.console import PASSWORD
from tests.sandbox import sandbox_registry

pytestmark = pytest.mark.django_db(transaction=True)

REGISTRY = Path(__file__).resolve().parent.parent / "recovery" / "fixtures" / "registry.example.json"
API_KEY = "sandbox-test-key"
REFUND = {"order_id": "O-8848", "amount_cents": 1250}
RUNTIME = Actor.system("runtime")
A = ActionStatus
_n = itertools.count(1)


class HeldJobs:
    """Stands in for the in-process runner: jobs enqueued on commit wait here until `run()` (the real job code).

    The status check enqueued at once when a write turns UNKNOWN (first_check_s 0, as the sandbox registry has it) is
    held apart in `checks`: these tests make UNKNOWN calls on purpose and settle them when they choose to, with
    `run_checks()` (or reconcile_due), not as a side effect of running an action's job."""

    def __init__(self) -> None:
        self.jobs: list[tuple] = []
        self.checks: list[tuple] = []

    def submit(self, func, args=(), *, job_id: str) -> bool:
        held = self.checks if job_id.startswith(("reconcile-call-", "reconcile-now-")) else self.jobs
        held.append((func, args, job_id))
        return True

    def run(self) -> int:
        jobs, self.jobs = self.jobs, []
        for func, args, _ in jobs:
            func(*args)
        return len(jobs)

    def run_checks(self) -> int:
        checks, self.checks = self.checks, []
        for func, args, _ in checks:
            func(*args)
        return len(checks)


@dataclass
class World:
    sandbox: object
    people: dict
    jobs: HeldJobs

    # --- a runtime's side ---

    def refund_call(self, key: str | None = None) -> Call:
        tenant = Tenant.objects.get(name="demo")
        task, _ = task_create(
            tenant=tenant, external_id=f"task-{next(_n)}", agent="tests", goal="refund", budget={}, actor=RUNTIME
        )
        key = key or f"refund-{next(_n)}"
        added = call_add(
            task=task,
            step_index=1,
            depends_on=[],
            tool_name="refund.create",
            arguments=REFUND,
            idempotency_key=key,
            actor=RUNTIME,
        )
        return added.call

    def admit(self, call: Call, *evidence: str) -> Admission:
        request = AttemptRequest(attempt_id=f"a-{next(_n)}", evidence=evidence)
        return attempt_admit(call=fresh(call), request=request, actor=RUNTIME)

    def attempt(self, call: Call, *evidence: str) -> str:
        """Admit, send the refund to the sandbox as a runtime does, report what happened: the state after."""
        admission = self.admit(call, *evidence)
        assert admission.status == 201, admission.response
        headers = {"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": call.idempotency_key}
        try:
            reply = requests.post(f"{self.sandbox.url}/refunds", json=REFUND, headers=headers, timeout=(2, 3))
            facts = facts_from_response(reply)
        except requests.RequestException as exc:
            facts = facts_from_exception(exc)
        attempt = Attempt.objects.get(call=call, attempt_id=admission.response["attempt_id"])
        answer = attempt_report(call=fresh(call), attempt=attempt, facts=facts_of(facts), actor=RUNTIME)
        return answer["call_state"]

    def unknown_call(self, *, kind: str = "commit_then_drop") -> Call:
        """A refund whose reply was lost (after the provider committed it, or before): UNKNOWN."""
        call = self.refund_call()
        self.sandbox.fault(route="/refunds", key=call.idempotency_key, kind=kind, times=1)
        assert self.attempt(call) == "UNKNOWN"
        return fresh(call)

    def review_call(self, *, kind: str = "commit_then_drop") -> Call:
        """An UNKNOWN refund escalated to HUMAN_REVIEW through the escalate action."""
        call = self.unknown_call(kind=kind)
        self.run_action(call, "escalate")
        call = fresh(call)
        assert call.state == "HUMAN_REVIEW"
        return call

    # --- the people's side ---

    def preview(self, call: Call, action: str, who: str = "reviewer", **evidence) -> ActionRequest:
        user = self.people[who]
        return action_preview(
            call_id=call.pk, action=action, user=user, actor=Actor.for_user(user), evidence=evidence or None
        )

    def request(self, req: ActionRequest, who: str = "reviewer", reason: str = "the provider cannot tell us"):
        user = self.people[who]
        return action_request(
            request_id=req.pk, user=user, actor=Actor.for_user(user), reason=reason, plan_hash=req.plan_hash
        )

    def approve(self, req: ActionRequest, who: str = "approver", reason: str = "checked the evidence"):
        user = self.people[who]
        return action_approve(request_id=req.pk, user=user, actor=Actor.for_user(user), reason=reason)

    def reject(self, req: ActionRequest, who: str = "approver", reason: str = "not convinced"):
        user = self.people[who]
        return action_reject(request_id=req.pk, user=user, actor=Actor.for_user(user), reason=reason)

    def withdraw(self, req: ActionRequest, who: str = "reviewer", reason: str = "asked for the wrong call"):
        user = self.people[who]
        return action_withdraw(request_id=req.pk, user=user, actor=Actor.for_user(user), reason=reason)

    def requested(self, call: Call, action: str, **evidence) -> ActionRequest:
        return self.request(self.preview(call, action, **evidence))

    def run_action(self, call: Call, action: str, **evidence) -> ActionRequest:
        """Preview, request, approve and let the held execution job run: the request as it ended."""
        req = self.approve(self.requested(call, action, **evidence))
        assert self.jobs.run() == 1
        req.refresh_from_db()
        assert req.status == A.EXECUTED, req.result
        return req

    def posts(self, key: str) -> list[dict]:
        return [r for r in self.sandbox.requests(key=key) if r["method"] == "POST"]


def fresh_request(req: ActionRequest) -> ActionRequest:
    return ActionRequest.objects.get(pk=req.pk)


def fresh(call: Call) -> Call:
    return Call.objects.select_related("tool__provider", "task").get(pk=call.pk)


def world_registry(sandbox_url: str, *, read_timeout_s: float = 2) -> dict:
    return sandbox_registry(sandbox_url, read_timeout_s=read_timeout_s)


@pytest.fixture
def held_jobs(settings, monkeypatch) -> HeldJobs:
    settings.REDIS_URL = None  # in-process mode: enqueue_now hands jobs to inprocess.get_runner()
    held = HeldJobs()
    monkeypatch.setattr(inprocess, "_runner", held)
    return held


@pytest.fixture
def world(sandbox, monkeypatch, console_people, held_jobs) -> World:
    monkeypatch.setenv("SANDBOX_API_KEY", API_KEY)
    load_registry(world_registry(sandbox.url), actor=Actor.system("tests"))
    people = dict(console_people)
    for name, roles in (("approver2", [APPROVER]), ("both", [REVIEWER, APPROVER])):
        people[name], _ = user_save_with_roles(username=name, roles=roles, password=PASSWORD, actor=RUNTIME)
    return World(sandbox=sandbox, people=people, jobs=held_jobs)


def events(call: Call, prefix: str = "action.") -> list[tuple[str, str]]:
    rows = AuditEvent.objects.filter(call_id=call.pk, action__startswith=prefix).order_by("seq")
    return list(rows.values_list("action", "actor_label"))


def request_events(req: ActionRequest) -> list[tuple[str, str]]:
    """The audit events of one request's steps: (action, actor)."""
    rows = AuditEvent.objects.filter(call_id=req.call_id, action__startswith="action.").order_by("seq")
    return [(e.action, e.actor_label) for e in rows if e.evidence.get("request") == req.pk]


def refused(code: str, func, *args, **kwargs) -> Refusal:
    with pytest.raises(Refusal) as caught:
        func(*args, **kwargs)
    assert caught.value.code == code, caught.value.message
    return caught.value


# --- the flow, and four eyes ---------------------------------------------------------------------------------------


def test_a_reviewer_requests_and_a_different_approver_approves_then_a_worker_executes(world):
    call = world.unknown_call()

    req = world.preview(call, "escalate")
    assert (req.status, req.call_version, req.previewed_by, req.plan["state"]) == (
        A.PREVIEWED,
        call.version,
        world.people["reviewer"],
        "UNKNOWN",
    )
    req = world.request(req)
    assert (req.status, req.requested_by, req.reason) == (
        A.REQUESTED,
        world.people["reviewer"],
        "the provider cannot tell us",
    )
    assert world.jobs.jobs == []  # a write waits for a second person
    req = world.approve(req)
    assert (req.status, req.decided_by, req.decision_reason) == (
        A.APPROVED,
        world.people["approver"],
        "checked the evidence",
    )
    assert fresh(call).state == "UNKNOWN"  # approving changes nothing by itself: the job does

    assert world.jobs.run() == 1

    req.refresh_from_db()
    assert req.status == A.EXECUTED and req.result["call_state"] == "HUMAN_REVIEW"
    assert fresh(call).state == "HUMAN_REVIEW"
    assert events(call) == [
        ("action.previewed", "user:reviewer"),
        ("action.requested", "user:reviewer"),
        ("action.approved", "user:approver"),
        ("action.executing", "job:actions"),
        ("action.executed", "job:actions"),
    ]
    moved = AuditEvent.objects.get(call_id=call.pk, to_state="HUMAN_REVIEW")
    assert (
        moved.actor_label == "job:actions"
        and f"#{req.pk}" in moved.reason
        and moved.evidence["action_request"] == req.pk
    )
    step = AuditEvent.objects.get(call_id=call.pk, action="action.approved")
    assert step.chain == f"task:{call.task_id}"
    assert step.evidence.items() >= {"request": req.pk, "action": "escalate", "plan_hash": req.plan_hash}.items()
    assert step.evidence["call_version"] == call.version and step.reason == "checked the evidence"


def test_nobody_approves_or_rejects_their_own_request(world):
    call = world.unknown_call()
    req = world.request(world.preview(call, "escalate", who="both"), who="both")

    refused("four_eyes", world.approve, req, who="both")
    refused("four_eyes", world.reject, req, who="both")

    req.refresh_from_db()
    assert req.status == A.REQUESTED and req.decided_by is None
    assert world.jobs.jobs == [] and not AuditEvent.objects.filter(action="action.approved").exists()


def test_the_database_refuses_a_decision_by_the_requester(world):
    call = world.unknown_call()
    req = world.requested(call, "escalate")

    with pytest.raises(IntegrityError), transaction.atomic():
        ActionRequest.objects.filter(pk=req.pk).update(decided_by=req.requested_by, status=A.APPROVED)

    req.refresh_from_db()
    assert (req.status, req.decided_by) == (A.REQUESTED, None)


def test_the_database_refuses_an_approved_write_without_a_decider(world):
    call = world.unknown_call()
    req = world.requested(call, "escalate")

    with pytest.raises(IntegrityError), transaction.atomic():
        ActionRequest.objects.filter(pk=req.pk).update(status=A.APPROVED)


@pytest.mark.parametrize(
    ("step", "who", "allowed"),
    [
        ("preview", "viewer", False),
        ("preview", "approver", False),
        ("preview", "admin", False),
        ("preview", "no-role", False),
        ("preview", "reviewer", True),
        ("request", "viewer", False),
        ("request", "approver", False),
        ("request", "reviewer2", True),
        ("approve", "viewer", False),
        ("approve", "reviewer", False),
        ("approve", "reviewer2", False),
        ("approve", "admin", False),
        ("approve", "approver", True),
        ("reject", "reviewer2", False),
        ("reject", "no-role", False),
        ("reject", "approver", True),
    ],
)
def test_each_step_needs_its_role(world, step, who, allowed):
    call = world.unknown_call()
    if step == "preview":
        act = lambda: world.preview(call, "escalate", who=who)  # noqa: E731
    elif step == "request":
        req = world.preview(call, "escalate")
        act = lambda: world.request(req, who=who)  # noqa: E731
    else:
        req = world.requested(call, "escalate")
        act = lambda: getattr(world, step)(req, who=who)  # noqa: E731

    if allowed:
        act()
        return
    before = (ActionRequest.objects.count(), list(ActionRequest.objects.values_list("status", flat=True)))
    refusal = refused("role", act)
    assert "role" in refusal.message
    assert (ActionRequest.objects.count(), list(ActionRequest.objects.values_list("status", flat=True))) == before


def test_the_catalogue_refuses_what_the_call_state_forbids_with_its_reason(world):
    call = world.unknown_call()

    replay = refused("forbidden", world.preview, call, "replay_same_key")
    assert "blind replay is forbidden while the outcome is unknown" in replay.message
    mark = refused("forbidden", world.preview, call, "mark_committed", provider_ref="re_1")
    assert "escalate it to human review first" in mark.message
    assert not ActionRequest.objects.exists()


def test_a_colleagues_claim_keeps_others_from_acting_on_the_call(world):
    call = world.unknown_call()
    call_claim(call_id=call.pk, user=world.people["reviewer2"], actor=Actor.for_user(world.people["reviewer2"]))

    refusal = refused("forbidden", world.preview, call, "escalate")

    assert "reviewer2 holds the claim" in refusal.message
    assert world.preview(call, "escalate", who="reviewer2").status == A.PREVIEWED


def test_a_reason_is_required_to_request_approve_and_reject(world):
    call = world.unknown_call()
    req = world.preview(call, "escalate")
    refusal = refused("reason", world.request, req, reason="   ")
    assert refusal.field == "reason"
    req = world.request(req)
    assert refused("reason", world.approve, req, reason="").field == "reason"
    assert refused("reason", world.reject, req, reason="x" * 2001).field == "reason"
    req.refresh_from_db()
    assert req.status == A.REQUESTED


def test_a_rejected_request_is_never_executed(world):
    call = world.unknown_call()
    req = world.reject(world.requested(call, "escalate"))

    assert (req.status, req.decided_by, req.decision_reason) == (A.REJECTED, world.people["approver"], "not convinced")
    assert world.jobs.jobs == []
    refused("not_pending", world.approve, req, who="approver2")
    assert action_execute(req.pk, worker="w").status == A.REJECTED
    assert fresh(call).state == "UNKNOWN"
    assert events(call)[-1] == ("action.rejected", "user:approver")


# --- stale and expired ---------------------------------------------------------------------------------------------


def test_approving_after_a_receipt_moved_the_call_is_refused_as_stale(world):
    call = world.unknown_call()  # the provider committed it; only the reply was lost
    req = world.requested(call, "escalate")

    reconcile_due(worker="poller")  # a receipt settles it between the preview and the approval
    assert fresh(call).state == "COMMITTED"

    refusal = refused("stale", world.approve, req)

    assert "the call changed since the preview" in refusal.message and "preview" in refusal.message.lower()
    req.refresh_from_db()
    assert req.status == A.STALE and req.decided_by is None
    assert world.jobs.jobs == []
    assert events(call)[-1] == ("action.stale", "user:approver")
    refused("not_pending", world.approve, req, who="approver2")


def test_requesting_a_preview_of_a_call_that_moved_makes_it_stale(world):
    call = world.unknown_call()
    req = world.preview(call, "escalate")
    reconcile_due(worker="poller")

    req = world.request(req)

    assert req.status == A.STALE and req.requested_by is None
    assert AuditEvent.objects.get(call_id=call.pk, action="action.stale").evidence["was"] == A.PREVIEWED


def test_a_plan_that_changed_since_the_preview_is_stale_even_when_the_call_did_not_move(world):
    call = world.review_call()
    req = world.requested(call, "replay_same_key")
    version = fresh(call).version
    Tool.objects.filter(name="refund.create").update(key_retention_s=1)  # the provider now forgets keys in a second
    time.sleep(1.1)

    refusal = refused("stale", world.approve, req)

    assert "the plan changed since the preview" in refusal.message and "key_retention now fails" in refusal.message
    assert fresh(call).version == version
    assert world.posts(call.idempotency_key)[1:] == []  # nothing was replayed


def test_a_plan_hash_the_reviewer_did_not_see_is_refused(world):
    call = world.unknown_call()
    req = world.preview(call, "escalate")
    user = world.people["reviewer"]

    refusal = refused(
        "stale",
        action_request,
        request_id=req.pk,
        user=user,
        actor=Actor.for_user(user),
        reason="r",
        plan_hash="0" * 64,
    )
    assert refusal.field == "plan_hash"
    req.refresh_from_db()
    assert req.status == A.PREVIEWED


def test_previews_and_requests_expire(world, settings):
    settings.RECOVERY_ACTION_TTL_S = 1
    call = world.unknown_call()
    previewed = world.preview(call, "escalate")
    requested = world.requested(call, "escalate")
    time.sleep(1.1)

    assert actions_expire_due() == 2

    for req in (previewed, requested):
        req.refresh_from_db()
        assert req.status == A.EXPIRED
    assert events(call)[-2:] == [("action.expired", "job:actions-expire")] * 2
    refused("not_pending", world.approve, requested)
    assert actions_expire_due() == 0


def test_approving_an_expired_request_is_refused_and_marks_it_expired(world, settings):
    settings.RECOVERY_ACTION_TTL_S = 1
    call = world.unknown_call()
    req = world.requested(call, "escalate")
    time.sleep(1.1)

    refused("expired", world.approve, req)

    req.refresh_from_db()
    assert req.status == A.EXPIRED and world.jobs.jobs == []
    assert events(call)[-1] == ("action.expired", "user:approver")


# --- the dry run ---------------------------------------------------------------------------------------------------


def test_a_dry_run_lists_the_exact_request_and_its_checks_and_sends_nothing(world):
    call = world.review_call()
    log = world.sandbox.requests()

    req = world.preview(call, "replay_same_key")
    reconcile_preview = world.preview(world.unknown_call(), "reconcile_now")
    log_after_unknown = world.sandbox.requests()
    world.preview(call, "abandon")

    assert world.sandbox.requests() == log_after_unknown  # the previews themselves sent nothing
    assert len(log_after_unknown) == len(log) + 1  # only the second call's own (runtime) attempt
    plan = req.plan
    (sent,) = plan["requests"]
    assert (sent["method"], sent["url"], sent["body"]) == ("POST", f"{world.sandbox.url}/refunds", REFUND)
    assert sent["headers"]["Idempotency-Key"] == call.idempotency_key == plan["idempotency_key"]
    assert sent["headers"]["Authorization"] == "Bearer [REDACTED]"
    assert API_KEY not in json.dumps(plan)
    assert plan["sends"] is True and plan["write"] is True and plan["target_state"] == "SENT"
    assert [c["check"] for c in plan["checks"]] == list(CHECKS)
    assert all(c["passed"] for c in plan["checks"]), plan["checks"]
    assert "one refund at most" in plan["expected_effects"]
    assert {f["action"] for f in plan["forbidden"]} == {
        "reconcile_now",
        "escalate",
        "start_compensation",
        "approve_new_compensation",
        "mark_compensation_committed",
        "mark_compensation_failed",
        "probe_duplicate",
        "restore_retry_path",
        "execute_held",
    }
    gate = GateDecision.objects.get(call_id=call.pk, dry_run=True)
    assert (gate.allowed, gate.candidate_attempt_id, gate.actor_user_id) == (
        True,
        f"preview-{req.pk}",
        req.previewed_by_id,
    )
    status_query = reconcile_preview.plan["requests"][0]
    assert status_query["method"] == "GET" and status_query["url"].endswith(
        f"/refunds/by-key/{reconcile_preview.plan['idempotency_key']}"
    )
    assert reconcile_preview.plan["approval"].startswith("one confirmation")


def test_the_plan_hash_ignores_wording_but_not_what_would_happen(world):
    call = world.review_call()
    first = world.preview(call, "replay_same_key")
    time.sleep(1.1)  # "kept N s more" reads differently a second later
    second = world.preview(call, "replay_same_key")
    assert first.plan_hash == second.plan_hash
    assert first.plan["checks"][-1]["detail"] != second.plan["checks"][-1]["detail"]
    assert world.preview(call, "abandon").plan_hash != first.plan_hash


# --- settling by hand: evidence --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("evidence", "field"),
    [
        ({}, "provider_ref"),
        ({"provider_ref": "   "}, "provider_ref"),
        ({"link": "javascript:alert(1)"}, "link"),
        ({"link": "ftp://example.com/receipt.pdf"}, "link"),
        ({"link": "not a link"}, "link"),
        ({"provider_ref": "x" * 256}, "provider_ref"),
        ({"amount": "5"}, "amount"),
    ],
)
def test_marking_a_call_committed_needs_evidence(world, evidence, field):
    call = world.review_call()
    before = ActionRequest.objects.count()

    refusal = refused("evidence", world.preview, call, "mark_committed", **evidence)

    assert refusal.field == field
    assert ActionRequest.objects.count() == before


def test_marking_committed_with_evidence_writes_an_operator_receipt_and_settles_the_call(world):
    call = world.review_call()
    link = "https://sandbox.example/receipts/re_42?x=<script>"

    req = world.run_action(call, "mark_committed", provider_ref="re_42", link=link)

    call = fresh(call)
    assert (call.state, call.provider_ref) == ("COMMITTED", "re_42")
    receipt = Receipt.objects.get(call_id=call.pk, source="operator")
    assert (receipt.observed, receipt.local_state_before, receipt.local_state_after, receipt.applied) == (
        "committed",
        "HUMAN_REVIEW",
        "COMMITTED",
        True,
    )
    assert f"link:{link}" in receipt.evidence and f"action_request:{req.pk}" in receipt.evidence
    assert req.evidence == {"provider_ref": "re_42", "link": link} == req.plan["evidence"]
    assert req.result["receipt"] == receipt.pk


def test_marking_not_committed_lets_the_runtime_retry_the_same_key_once_proven(world):
    call = world.review_call(kind="drop_before_commit")  # the provider never executed it
    assert world.sandbox.ledger(call.idempotency_key)["effects"] == 0

    world.run_action(call, "mark_not_committed", link="https://support.example/tickets/77")

    assert fresh(call).state == "RETRYABLE"
    assert world.attempt(call, "state_verified") == "COMMITTED"
    assert world.sandbox.ledger(call.idempotency_key)["effects"] == 1


def test_marking_not_committed_is_refused_when_the_provider_reported_the_effect(world):
    call = world.review_call()
    Call.objects.filter(pk=call.pk).update(effects_observed=1)  # as a receipt recorded it (a counter, not a state)
    req = world.preview(call, "mark_not_committed", provider_ref="re_1")

    (check,) = [c for c in req.plan["checks"] if not c["passed"]]
    assert check["check"] == "side_effect_budget" and "it was committed" in check["detail"]
    refusal = refused("forbidden", world.request, req)
    assert "side_effect_budget" in refusal.message
    req.refresh_from_db()
    assert req.status == A.PREVIEWED


# --- one confirmation for reads, two people for writes -------------------------------------------------------------


def test_a_read_only_reconcile_runs_on_the_requesters_confirmation_alone(world):
    call = world.unknown_call()

    req = world.requested(call, "reconcile_now")

    assert (req.status, req.decided_by, req.requested_by) == (A.APPROVED, None, world.people["reviewer"])
    assert world.jobs.run() == 1
    req.refresh_from_db()
    assert req.status == A.EXECUTED and req.result["observed"] == "committed"
    assert fresh(call).state == "COMMITTED"
    receipt = Receipt.objects.get(pk=req.result["receipt"])
    assert (receipt.source, receipt.applied) == ("poll", True)
    assert [name for name, _ in events(call)] == [
        "action.previewed",
        "action.requested",
        "action.approved",
        "action.executing",
        "action.executed",
    ]


def test_with_one_confirmation_off_a_reconcile_needs_a_second_person(world, settings):
    settings.RECOVERY_READ_ACTIONS_ONE_CONFIRMATION = False
    call = world.unknown_call()

    req = world.requested(call, "reconcile_now")

    assert req.status == A.REQUESTED and req.plan["approval"] == "a second person with the approver role"
    assert world.jobs.jobs == []
    assert world.approve(req).status == A.APPROVED


# --- concurrency -----------------------------------------------------------------------------------------------------


def _at_once(*funcs) -> list:
    """Run the functions on threads released together; each one's result or exception."""
    barrier = threading.Barrier(len(funcs))
    results: list = [None] * len(funcs)

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = funcs[index]()
        except Exception as exc:  # the result under test
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(funcs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.postgres
def test_two_approvers_at_once_approve_once_and_it_executes_once(world):
    call = world.review_call()
    req = world.requested(call, "replay_same_key")

    results = _at_once(lambda: world.approve(req, who="approver"), lambda: world.approve(req, who="approver2"))

    approved = [r for r in results if isinstance(r, ActionRequest)]
    losers = [r for r in results if isinstance(r, Refusal)]
    assert len(approved) == 1 and len(losers) == 1 and losers[0].code == "not_pending", results
    assert approved[0].status == A.APPROVED
    assert [name for name, _ in request_events(req)].count("action.approved") == 1
    assert world.jobs.run() == 1
    req.refresh_from_db()
    assert req.status == A.EXECUTED and fresh(call).state == "COMMITTED"
    assert len(world.posts(call.idempotency_key)) == 2  # the runtime's one, and one replay
    assert world.sandbox.ledger(call.idempotency_key)["effects"] == 1


# --- withdrawal ---------------------------------------------------------------------------------------------------


def test_the_requester_withdraws_a_pending_request_and_nobody_can_approve_it_after(world):
    call = world.unknown_call()
    req = world.requested(call, "escalate")

    withdrawn = world.withdraw(req)

    assert (withdrawn.status, withdrawn.decision_reason) == (A.WITHDRAWN, "asked for the wrong call")
    assert request_events(req)[-1] == ("action.withdrawn", "user:reviewer")
    assert refused("not_pending", world.approve, req).message == (
        "This request is withdrawn now: nothing more can be done with it."
    )
    assert world.jobs.jobs == [] and fresh(call).state == "UNKNOWN"


def test_only_the_requester_withdraws_and_only_while_nobody_has_decided(world):
    call = world.unknown_call()
    req = world.requested(call, "escalate")
    refused("role", world.withdraw, req, who="approver")
    refused("role", world.withdraw, req, who="reviewer2")
    refused("reason", world.withdraw, req, reason="  ")
    assert fresh_request(req).status == A.REQUESTED  # nothing changed by the refusals
    world.approve(req)
    refused("not_pending", world.withdraw, req)
    assert [name for name, _ in request_events(req)].count("action.withdrawn") == 0


@pytest.mark.postgres
def test_a_withdrawal_racing_an_approval_one_wins_in_every_round(world):
    wins = Counter()
    for _ in range(10):
        call = world.unknown_call()
        req = world.requested(call, "escalate")

        results = _at_once(lambda req=req: world.withdraw(req), lambda req=req: world.approve(req))

        won = [r for r in results if isinstance(r, ActionRequest)]
        lost = [r for r in results if isinstance(r, Refusal)]
        assert len(won) == 1 and len(lost) == 1 and lost[0].code == "not_pending", results
        final = fresh_request(req).status
        assert final == won[0].status and final in (A.WITHDRAWN, A.APPROVED)
        names = [name for name, _ in request_events(req)]
        assert names.count("action.withdrawn") + names.count("action.approved") == 1
        wins[final] += 1
        world.jobs.run()  # an approved escalation executes once; a withdrawn one has no job
    assert sum(wins.values()) == 10


# --- approval_granted: one admission -------------------------------------------------------------------------------


def _approval_call(world) -> Call:
    """A refund the provider refused pending an approval (403 needs_approval): HUMAN_REVIEW."""
    call = world.refund_call()
    world.sandbox.fault(
        route="/refunds", key=call.idempotency_key, kind="error", status=403, code="needs_approval", times=1
    )
    assert world.attempt(call) == "HUMAN_REVIEW"
    return fresh(call)


def test_a_granted_approval_admits_exactly_one_attempt(world):
    budgets = {"max_attempts": 5, "write_retry": 3, "unknown_budget": 1, "max_business_effects": 1}
    Tool.objects.filter(name="refund.create").update(budgets=budgets)  # room left for a third attempt
    call = _approval_call(world)
    denied = world.admit(call, "approval_granted")
    assert denied.status == 409 and denied.response["gate"]["reason"] == "human_review"

    grant = world.run_action(call, "grant_approval")
    assert fresh(call).state == "RETRYABLE"
    world.sandbox.fault(route="/refunds", key=call.idempotency_key, kind="error", status=503, times=1)
    assert world.attempt(call, "approval_granted") == "RETRYABLE"  # admitted once; the provider answered 503

    grant.refresh_from_db()
    first = Attempt.objects.get(call=call, number=2)
    assert grant.approval_used_at is not None and grant.attempt_id == first.pk
    assert first.evidence == ["approval_granted"]
    again = world.admit(call, "approval_granted")
    assert again.status == 409 and again.response["gate"]["reason"] == "no_new_evidence"
    assert Attempt.objects.filter(call=call).count() == 2


@pytest.mark.postgres
def test_two_admissions_racing_for_one_approval_admit_one(world):
    call = _approval_call(world)
    world.run_action(call, "grant_approval")

    results = _at_once(lambda: world.admit(call, "approval_granted"), lambda: world.admit(call, "approval_granted"))

    admitted = [r for r in results if isinstance(r, Admission) and r.status == 201]
    assert len(admitted) == 1, results
    assert Attempt.objects.filter(call=call, evidence=["approval_granted"]).count() == 1
    assert fresh(call).state == "SENT"


def test_a_replays_approval_admits_the_replays_own_attempt_and_no_other(world):
    call = world.review_call()
    req = world.approve(world.requested(call, "replay_same_key"))
    world.jobs.jobs.clear()
    assert action_execution._claim(req.pk, "w", timezone.now()) is not None  # a worker took it and is about to admit

    runtime = world.admit(call, "approval_granted")  # the runtime tries to ride on it
    assert runtime.status == 409 and runtime.response["gate"]["reason"] == "human_review"
    request = AttemptRequest(attempt_id=f"action-{req.pk}", evidence=("approval_granted",))
    own = attempt_admit(call=fresh(call), request=request, actor=RUNTIME)
    assert own.status == 201

    req.refresh_from_db()
    assert req.approval_used_at is not None and req.attempt.attempt_id == f"action-{req.pk}"


# --- the tool's request, from its template ---------------------------------------------------------------------------


def _request_for(template: dict, arguments: dict, *, side_effect: str = "write"):
    provider = Provider(name="p", base_url="http://provider.test/api/", auth={"kind": "none"}, read_timeout_s=4)
    tool = Tool(name="t.x", provider=provider, side_effect=side_effect, request=template)
    call = Call(tool=tool, idempotency_key="key/1 ü", arguments=arguments, side_effect=side_effect)
    return tool_request(tool, call)


def test_the_request_is_filled_from_the_template_as_a_runtime_fills_it():
    sent = _request_for(
        {
            "method": "post",
            "path": "/orders/{order.id}/lines/{{literal}}",
            "body": {"qty": "{qty}", "note": "for {order.id}", "missing": "{absent}", "key": "{idempotency_key}"},
        },
        {"order": {"id": "O/1"}, "qty": 3},
    )

    assert (sent.method, sent.url) == ("POST", "http://provider.test/api/orders/O%2F1/lines/{literal}")
    assert sent.body == {"qty": 3, "note": "for O/1", "missing": None, "key": "key/1 ü"}
    assert sent.headers["Idempotency-Key"] == "key/1 ü" and sent.headers["Content-Type"] == "application/json"
    assert sent.timeout == (3.0, 4.0)


def test_a_write_without_a_body_template_sends_its_arguments_and_a_read_sends_no_body():
    assert _request_for({"method": "POST", "path": "/refunds"}, {"a": 1}).body == {"a": 1}
    read = _request_for({"method": "GET", "path": "/orders/{id}"}, {"id": 7}, side_effect="read")
    assert (read.url, read.body) == ("http://provider.test/api/orders/7", None)
    assert "Idempotency-Key" not in read.headers and "Content-Type" not in read.headers


def test_a_template_that_needs_a_missing_argument_is_refused():
    with pytest.raises(TemplateError, match=r"\{order_id\}"):
        _request_for({"method": "POST", "path": "/orders/{order_id}/cancel"}, {})


# --- compensation (docs/compensation.md): "Start compensation" and "Approve new compensation" -------------------------
# Dry run (the exact cancel with the entry's own key, credentials masked, nothing sent), four eyes, executed once.

ORDER = {"customer_id": "C-1042", "items": [{"sku": "SKU-1", "quantity": 1}]}


def committed_order(world: World, budget: dict | None = None) -> Call:
    """An order created the way a runtime creates it: admitted, POST /orders to the sandbox, its reply reported."""
    tenant = Tenant.objects.get(name="demo")
    task, _ = task_create(
        tenant=tenant, external_id=f"order-{next(_n)}", agent="tests", goal="order", budget=budget or {}, actor=RUNTIME
    )
    key = f"order-{next(_n)}"
    added = call_add(
        task=task,
        step_index=1,
        depends_on=[],
        tool_name="order.create",
        arguments=ORDER,
        idempotency_key=key,
        actor=RUNTIME,
    )
    call = Call.objects.select_related("tool__provider", "task").get(pk=added.call.pk)
    attempt_admit(call=call, request=AttemptRequest(attempt_id="a1"), actor=RUNTIME)
    headers = {"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": key}
    try:
        facts = facts_from_response(
            requests.post(f"{world.sandbox.url}/orders", json=ORDER, headers=headers, timeout=3)
        )
    except requests.RequestException as exc:
        facts = facts_from_exception(exc)
    call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
    attempt = call.attempts.select_related("tool__provider").get(attempt_id="a1")
    assert attempt_report(call=call, attempt=attempt, facts=facts_of(facts), actor=RUNTIME)["call_state"] == "COMMITTED"
    return Call.objects.get(pk=call.pk)


def cancels(world: World, key: str) -> list[dict]:
    return [r for r in world.sandbox.requests(key=key) if r["method"] == "POST"]


def test_the_dry_run_shows_the_exact_cancel_with_its_own_key_and_sends_nothing(world):
    call = committed_order(world)
    before = len(world.sandbox.requests())

    preview = world.preview(call, "start_compensation")

    plan = preview.plan
    key = derive_key(call.idempotency_key, 1)
    (request,) = plan["requests"]
    assert request["method"] == "POST" and request["url"].endswith(f"/orders/{call.provider_ref}/cancel")
    assert request["headers"]["Idempotency-Key"] == key == plan["idempotency_key"]
    assert request["headers"]["Authorization"] != f"Bearer {API_KEY}" and API_KEY not in str(plan)  # masked
    assert request["body"] == {"reason": "compensation"}
    assert {c["check"] for c in plan["checks"]} == {
        "admission",
        "breaker",
        "call_budget",
        "task_budget",
        "side_effect_budget",
        "key_retention",
    } and all(c["passed"] for c in plan["checks"])
    assert f"order.create {call.provider_ref}: one cancellation expected" in plan["expected_effects"]
    assert plan["approval"] == "a second person with the approver role"
    assert len(world.sandbox.requests()) == before  # the dry run sent nothing
    assert (
        not CompensationEntry.objects.filter(call=call).exists() and Call.objects.get(pk=call.pk).state == "COMMITTED"
    )


def test_a_requested_compensation_needs_a_second_person_and_runs_once(world):
    call = committed_order(world)
    requested = world.requested(call, "start_compensation")
    assert requested.status == A.REQUESTED and world.jobs.run() == 0  # nothing runs before the approval

    approved = world.approve(requested)
    assert approved.status == A.APPROVED
    assert world.jobs.run() == 1
    action_execute(approved.pk, worker="second-worker")  # a duplicate job: the claim makes it a no-op

    approved.refresh_from_db()
    entry = CompensationEntry.objects.get(call=call)
    assert approved.status == A.EXECUTED and approved.result["entry_state"] == "committed"
    assert (entry.number, entry.state, entry.requested_by_id) == (1, "committed", approved.pk)
    assert Call.objects.get(pk=call.pk).state == "COMPENSATED"
    assert len(cancels(world, entry.idempotency_key)) == 1
    assert world.sandbox.ledger(entry.idempotency_key)["effects"] == 1


def test_the_requester_cannot_approve_their_own_compensation(world):
    call = committed_order(world)
    requested = world.request(world.preview(call, "start_compensation", who="both"), who="both")

    refused("four_eyes", world.approve, requested, who="both")

    assert not CompensationEntry.objects.filter(call=call).exists()


def test_after_a_refused_cancel_a_new_compensation_is_approved_with_the_next_key(world):
    call = committed_order(world)
    world.sandbox.fault(
        route=f"/orders/{call.provider_ref}/cancel", kind="error", status=409, code="not_cancellable", times=1
    )
    first = world.run_action(call, "start_compensation")
    assert first.result["entry_state"] == "failed" and Call.objects.get(pk=call.pk).state == "COMPENSATION_FAILED"
    refused("forbidden", world.preview, Call.objects.get(pk=call.pk), "start_compensation")

    second = world.run_action(Call.objects.get(pk=call.pk), "approve_new_compensation")

    entries = list(CompensationEntry.objects.filter(call=call).order_by("number").values_list("number", "state"))
    assert entries == [(1, "failed"), (2, "committed")]
    assert second.plan["idempotency_key"] == derive_key(call.idempotency_key, 2)
    assert Call.objects.get(pk=call.pk).state == "COMPENSATED"


def test_a_tool_without_a_registered_compensation_offers_none(world):
    call = committed_order(world)
    tool = call.tool
    tool.compensation = {}
    tool.save(update_fields=["compensation"])

    message = refused("forbidden", world.preview, Call.objects.get(pk=call.pk), "start_compensation").message

    assert "declares no compensation" in message


def test_a_compensation_in_review_is_settled_by_a_person_with_evidence(world):
    call = committed_order(world)
    world.sandbox.fault(route=f"/orders/{call.provider_ref}/cancel", kind="pending", checks=100, times=1)
    world.run_action(call, "start_compensation")
    entry = CompensationEntry.objects.get(call=call)
    assert entry.state == "unknown"  # 202: the provider is working on it
    for _ in range(3):  # the world's poll budget: 3 checks
        compensation_check(entry.pk, worker="w1", force=True)
    entry.refresh_from_db()
    assert (entry.state, entry.outcome) == ("review", "poll_budget_exhausted")
    assert Call.objects.get(pk=call.pk).state == "COMPENSATING"  # never HUMAN_REVIEW from here
    refused("evidence", world.preview, Call.objects.get(pk=call.pk), "mark_compensation_committed")

    done = world.run_action(Call.objects.get(pk=call.pk), "mark_compensation_committed", provider_ref="ca_seen_by_ops")

    entry.refresh_from_db()
    receipt = entry.receipts.get(source="operator")
    assert (entry.state, receipt.provider_ref, receipt.state_before, receipt.state_after) == (
        "committed",
        "ca_seen_by_ops",
        "review",
        "committed",
    )
    assert Call.objects.get(pk=call.pk).state == "COMPENSATED" and "committed" in done.result["what"]
    assert len(cancels(world, entry.idempotency_key)) == 1  # settling sent nothing


def test_a_compensation_entry_is_bounded_by_its_own_tools_attempts(world):
    call = committed_order(world)
    world.sandbox.fault(route=f"/orders/{call.provider_ref}/cancel", kind="error", status=503, code="busy")
    world.run_action(call, "start_compensation")
    entry = CompensationEntry.objects.get(call=call)
    assert entry.state == "not_committed" and entry.max_attempts == 3
    for _ in range(3):
        CompensationEntry.objects.filter(pk=entry.pk).update(send_at=None)  # its retry is due
        compensations_run_due(worker="w1")

    entry.refresh_from_db()
    assert (entry.state, entry.attempts_count, entry.outcome) == ("failed", 3, "retry_exhausted")
    assert Call.objects.get(pk=call.pk).state == "COMPENSATION_FAILED"
    assert len(cancels(world, entry.idempotency_key)) == 3  # the task's budgets never held the undo back


def test_a_compensation_ignores_the_tasks_spent_rounds_and_past_deadline(world):
    call = committed_order(world, budget={"max_rounds": 1})
    Task.objects.filter(pk=call.task_id).update(deadline=timezone.now() - timedelta(hours=1))  # it passed
    assert Task.objects.get(pk=call.task_id).rounds_used == 1  # the order used the task's only round

    done = world.run_action(call, "start_compensation")

    assert done.result["entry_state"] == "committed" and Call.objects.get(pk=call.pk).state == "COMPENSATED"
    budget = next(c for c in done.plan["checks"] if c["check"] == "task_budget")
    assert budget["passed"] and "not counted" in budget["detail"]


def test_a_call_waiting_for_an_approval_says_so_in_its_queue(world):
    call = _approval_call(world)

    asked = asked_for([call.pk])

    assert why_waiting(call.state, call.outcome, call.checks_made, asked[call.pk]) == (
        "the provider needs an approval before it may run again"
    )

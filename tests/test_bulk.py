"""Bulk actions on a frozen, shown selection (docs/console.md, docs/actions.md): the freeze, four eyes for the bulk,
item-by-item execution that re-checks every item, stale items skipped, claimed items excluded, a worker killed mid-bulk.

Calls are made and attempted the way a runtime does, against the real sandbox process (tests/test_action_services'
world); jobs the services enqueue are held and run when a test says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.devtools.drills.stage import database_url
from recovery.models import (
    ActionRequest,
    ActionStatus,
    AuditEvent,
    BulkAction,
    BulkItem,
    BulkItemStatus,
    BulkStatus,
    Call,
    Provider,
    Step,
    Task,
    Tenant,
    Tool,
)
from recovery.selectors.queues import QUEUES, QueueFilters
from recovery.services.actions import actions_sweep_interrupted
from recovery.services.bulk import (
    BULK_MAX,
    bulk_approve,
    bulk_counts,
    bulk_execute,
    bulk_preview,
    bulk_reject,
    bulk_request,
    bulks_expire_due,
    bulks_sweep_interrupted,
)
from recovery.services.claims import call_claim
from tests import test_action_services as base
from tests.test_action_execution import _until
from tests.test_action_services import API_KEY, fresh, refused

held_jobs, world = base.held_jobs, base.world

pytestmark = pytest.mark.django_db(transaction=True)

B, Item = BulkStatus, BulkItemStatus
UNKNOWN = QUEUES["unknown"]
REVIEW = QUEUES["human-review"]


def _preview(world, calls=None, *, action="escalate", queue=UNKNOWN, who="reviewer", filters=None) -> BulkAction:
    user = world.people[who]
    ids = None if calls is None else [call.pk for call in calls]
    return bulk_preview(
        action=action, queue=queue, user=user, actor=Actor.for_user(user), call_ids=ids, filters=filters
    )


def _request(world, bulk, who="reviewer", reason="the provider's status API is down for these") -> BulkAction:
    user = world.people[who]
    return bulk_request(
        bulk_id=bulk.pk, user=user, actor=Actor.for_user(user), reason=reason, selection_hash=bulk.selection_hash
    )


def _approve(world, bulk, who="approver") -> BulkAction:
    user = world.people[who]
    return bulk_approve(bulk_id=bulk.pk, user=user, actor=Actor.for_user(user), reason="read every item")


def _items(bulk) -> list[tuple[int, str]]:
    return list(BulkItem.objects.filter(bulk=bulk).order_by("position").values_list("call_id", "status"))


def test_a_bulk_escalation_runs_each_frozen_item_once_after_a_second_persons_approval(world):
    calls = [world.unknown_call() for _ in range(3)]

    bulk = _preview(world, calls)
    assert bulk.status == B.PREVIEWED and bulk.selection == "rows"
    assert _items(bulk) == [(call.pk, Item.PENDING) for call in calls]
    frozen = BulkItem.objects.get(bulk=bulk, position=1)
    assert (frozen.call_version, frozen.call_state) == (calls[0].version, "UNKNOWN")
    assert {c["check"] for c in frozen.checks} >= {"breaker", "call_budget"} and all(c["passed"] for c in frozen.checks)
    assert all(fresh(call).state == "UNKNOWN" for call in calls)  # a preview changes nothing

    bulk = _request(world, bulk)
    assert bulk.status == B.REQUESTED and world.jobs.jobs == []
    bulk = _approve(world, bulk)
    assert bulk.status == B.APPROVED and world.jobs.run() == 1

    bulk.refresh_from_db()
    assert bulk.status == B.FINISHED and bulk.finished_at is not None
    assert _items(bulk) == [(call.pk, Item.EXECUTED) for call in calls]
    assert [fresh(call).state for call in calls] == ["HUMAN_REVIEW"] * 3
    for item in BulkItem.objects.filter(bulk=bulk).select_related("request"):
        assert item.request.status == ActionStatus.EXECUTED and "HUMAN_REVIEW" in item.why
        assert (item.request.requested_by, item.request.decided_by) == (
            world.people["reviewer"],
            world.people["approver"],
        )
        story = AuditEvent.objects.filter(call_id=item.call_id, action__startswith="action.").order_by("seq")
        assert list(story.values_list("action", "actor_label")) == [
            ("action.approved", "job:bulk"),
            ("action.executing", "job:actions"),
            ("action.executed", "job:actions"),
        ]
        assert f"item {item.position} of bulk #{bulk.pk}" in story.first().reason
    own = AuditEvent.objects.filter(action__startswith="bulk.", evidence__bulk=bulk.pk).order_by("seq")
    assert list(own.values_list("action", "actor_label")) == [
        ("bulk.previewed", "user:reviewer"),
        ("bulk.requested", "user:reviewer"),
        ("bulk.approved", "user:approver"),
        ("bulk.executing", "job:bulk"),
        ("bulk.finished", "job:bulk"),
    ]
    assert bulk_execute(bulk.pk, worker="again").status == B.FINISHED  # a second run finds nothing to do
    assert ActionRequest.objects.filter(bulk_items__bulk=bulk).count() == 3


def test_an_item_that_moved_after_the_freeze_is_skipped_stale_and_never_acted_on(world):
    calls = [world.unknown_call() for _ in range(3)]
    bulk = _request(world, _preview(world, calls))
    world.run_action(calls[1], "escalate")  # a colleague escalated it by itself while the bulk waited
    bulk = _approve(world, bulk)
    moved = fresh(calls[1])
    assert moved.state == "HUMAN_REVIEW"
    requests_before = ActionRequest.objects.filter(call=moved).count()

    bulk_execute(bulk.pk, worker="w")

    assert _items(bulk) == [
        (calls[0].pk, Item.EXECUTED),
        (calls[1].pk, Item.SKIPPED_STALE),
        (calls[2].pk, Item.EXECUTED),
    ]
    stale = BulkItem.objects.get(bulk=bulk, call=moved)
    assert stale.request is None and "never acted on" in stale.why and "HUMAN_REVIEW" in stale.why
    assert fresh(moved).state == "HUMAN_REVIEW" and fresh(moved).version == moved.version
    assert ActionRequest.objects.filter(call=moved).count() == requests_before
    skipped = AuditEvent.objects.get(call_id=moved.pk, action="bulk.item_skipped")
    assert skipped.evidence["bulk"] == bulk.pk and skipped.actor_label == "job:bulk"


def test_the_freeze_excludes_items_claimed_by_another_reviewer_and_skips_what_the_action_cannot_do(world):
    free, claimed, reviewed = (world.unknown_call() for _ in range(3))
    world.run_action(reviewed, "escalate")
    colleague = world.people["both"]
    call_claim(call_id=claimed.pk, user=colleague, actor=Actor.for_user(colleague))

    bulk = _preview(world, [free, claimed, reviewed])

    items = {item.call_id: item for item in BulkItem.objects.filter(bulk=bulk)}
    assert items[free.pk].status == Item.PENDING
    assert items[claimed.pk].status == Item.EXCLUDED and "claimed by both" in items[claimed.pk].why
    assert items[reviewed.pk].status == Item.SKIPPED_CHECKS
    assert "already in human review" in items[reviewed.pk].why

    bulk_execute(_approve(world, _request(world, bulk)).pk, worker="w")
    assert fresh(claimed).state == "UNKNOWN" and fresh(free).state == "HUMAN_REVIEW"
    assert bulk_counts(bulk.pk) == {Item.EXECUTED: 1, Item.EXCLUDED: 1, Item.SKIPPED_CHECKS: 1}


def test_each_item_is_checked_again_at_execution_a_claim_taken_meanwhile_fails_it(world):
    first, second = world.unknown_call(), world.unknown_call()
    bulk = _approve(world, _request(world, _preview(world, [first, second])))
    colleague = world.people["both"]
    call_claim(call_id=second.pk, user=colleague, actor=Actor.for_user(colleague))  # a claim moves no version

    bulk_execute(bulk.pk, worker="w")

    item = BulkItem.objects.get(bulk=bulk, call=second)
    assert item.status == Item.FAILED and "re-checked at execution" in item.why and "both holds the claim" in item.why
    assert fresh(second).state == "UNKNOWN" and fresh(first).state == "HUMAN_REVIEW"
    assert AuditEvent.objects.filter(call_id=second.pk, action="bulk.item_refused").count() == 1


def test_four_eyes_a_requester_cannot_approve_their_own_bulk_and_the_database_refuses_it_too(world):
    bulk = _request(world, _preview(world, [world.unknown_call()], who="both"), who="both")
    refused("four_eyes", _approve, world, bulk, who="both")
    refused("role", _approve, world, bulk, who="reviewer")
    assert BulkAction.objects.get(pk=bulk.pk).status == B.REQUESTED
    with pytest.raises(IntegrityError), transaction.atomic():
        BulkAction.objects.filter(pk=bulk.pk).update(decided_by=world.people["both"], status=B.APPROVED)
    done = bulk_reject(bulk_id=bulk.pk, user=world.people["approver"], actor=Actor.system("t"), reason="no")
    assert done.status == B.REJECTED and world.jobs.jobs == []


def test_bad_selections_and_requests_are_refused_with_the_field_and_change_nothing(world):
    call = world.unknown_call()
    assert refused("selection", _preview, world, []).field == "calls"
    assert refused("forbidden", _preview, world, [call], action="mark_committed").field == "action"
    assert "No call has the id 999999" in refused("selection", _preview, world, [call, Call(pk=999999)]).message
    too_many = [Call(pk=n) for n in range(1, BULK_MAX + 2)]
    assert f"at most {BULK_MAX}" in refused("selection", _preview, world, too_many).message
    assert BulkAction.objects.count() == 0

    bulk = _preview(world, [call])
    assert refused("reason", _request, world, bulk, reason="  ").field == "reason"
    user = world.people["reviewer"]
    wrong = bulk_request  # a selection hash that is not the one shown
    caught = refused(
        "stale", wrong, bulk_id=bulk.pk, user=user, actor=Actor.for_user(user), reason="r", selection_hash="0" * 64
    )
    assert caught.field == "selection_hash"
    assert BulkAction.objects.get(pk=bulk.pk).status == B.PREVIEWED

    nothing = _preview(world, [call], action="grant_approval")  # only from HUMAN_REVIEW: every item skipped
    assert _items(nothing) == [(call.pk, Item.SKIPPED_CHECKS)]
    assert "would run" in refused("forbidden", _request, world, nothing).message


def test_an_unrequested_bulk_expires(world):
    bulk = _preview(world, [world.unknown_call()])
    assert bulks_expire_due(now=timezone.now()) == 0
    later = timezone.now() + timedelta(seconds=django_settings.RECOVERY_ACTION_TTL_S + 1)
    assert bulks_expire_due(now=later) == 1
    assert BulkAction.objects.get(pk=bulk.pk).status == B.EXPIRED


def _unknown_backlog(count: int) -> list[int]:
    """`count` UNKNOWN refunds on the sandbox registry's tool, inserted directly in that state (the database allows
    an insert in any state; only changes go through the transition function)."""
    tenant = Tenant.objects.get(name="demo")
    tool = Tool.objects.get(name="refund.create")
    task = Task.objects.create(tenant=tenant, external_id="backlog", agent="tests", goal="refunds")
    step = Step.objects.create(task=task, index=1)
    calls = [
        Call(
            tenant=tenant,
            task=task,
            step=step,
            tool=tool,
            idempotency_key=f"backlog-{n}",
            arguments={"order_id": f"O-{n}", "amount_cents": 100},
            fingerprint=f"backlog-{n}",
            side_effect="write",
            risk=tool.risk,
            state="UNKNOWN",
        )
        for n in range(count)
    ]
    return [call.pk for call in Call.objects.bulk_create(calls)]


def test_every_call_matching_a_filter_at_most_500_and_a_500_item_bulks_progress(world):
    ids = _unknown_backlog(BULK_MAX + 1)
    everything = QueueFilters(states=UNKNOWN.states)
    caught = refused("selection", _preview, world, filters=everything)
    assert f"More than {BULK_MAX} calls match" in caught.message and caught.field == "calls"
    Call.objects.filter(pk=ids[-1]).delete()

    bulk = _preview(world, filters=everything)
    assert bulk.selection == "matching" and bulk_counts(bulk.pk) == {Item.PENDING: BULK_MAX}
    bulk = _approve(world, _request(world, bulk))
    world.jobs.jobs.clear()  # executed here, in a thread, to watch it progress

    seen = []
    worker = threading.Thread(target=lambda: (bulk_execute(bulk.pk, worker="w"), connection.close()))
    worker.start()
    while worker.is_alive():
        seen.append(bulk_counts(bulk.pk).get(Item.EXECUTED, 0))
        time.sleep(0.2)
    worker.join()

    assert bulk_counts(bulk.pk) == {Item.EXECUTED: BULK_MAX}
    assert any(0 < n < BULK_MAX for n in seen), seen  # progress showed while it ran
    assert seen == sorted(seen)
    assert Call.objects.filter(pk__in=ids[:-1], state="HUMAN_REVIEW").count() == BULK_MAX


@pytest.mark.postgres  # concurrent approvals and workers
def test_two_approvals_and_two_workers_execute_a_bulk_once(world):
    calls = [world.unknown_call() for _ in range(4)]
    bulk = _request(world, _preview(world, calls))
    outcomes, barrier = [], threading.Barrier(2)

    def decide(who):
        barrier.wait()
        try:
            outcomes.append(_approve(world, bulk, who=who).status)
        except base.Refusal as refusal:
            outcomes.append(refusal.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(who,)) for who in ("approver", "approver2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == [B.APPROVED, "not_pending"]
    assert len(world.jobs.jobs) == 1
    world.jobs.jobs.clear()

    def work(name):
        barrier.wait()
        try:
            bulk_execute(bulk.pk, worker=name)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(name,)) for name in ("w1", "w2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert bulk_counts(bulk.pk) == {Item.EXECUTED: 4}
    assert ActionRequest.objects.filter(call__in=calls, action="escalate").count() == 4
    assert AuditEvent.objects.filter(action="bulk.executing", evidence__bulk=bulk.pk).count() == 1


def test_a_worker_killed_mid_bulk_leaves_its_item_interrupted_never_run_again_and_the_rest_resume(world):
    Provider.objects.filter(name="sandbox").update(read_timeout_s=20)  # the worker waits for the held reply
    calls = [world.review_call(kind="drop_before_commit") for _ in range(3)]
    bulk = _approve(world, _request(world, _preview(world, calls, action="replay_same_key", queue=REVIEW)))
    world.jobs.jobs.clear()  # this worker is a separate process, killed below
    held = calls[1].idempotency_key
    world.sandbox.fault(route="/refunds", key=held, kind="latency", ms=4000, times=1)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        "SANDBOX_API_KEY": API_KEY,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)
    code = f"from recovery.services.bulk import bulk_execute; bulk_execute({bulk.pk}, worker='doomed')"
    doomed = subprocess.Popen([sys.executable, "manage.py", "shell", "-c", code], cwd=django_settings.BASE_DIR, env=env)
    try:
        _until(lambda: fresh(calls[1]).state == "SENT")  # item 2's replay is on its way to the held reply
        time.sleep(0.5)
    finally:
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait()

    assert _items(bulk) == [
        (calls[0].pk, Item.EXECUTED),
        (calls[1].pk, Item.EXECUTING),
        (calls[2].pk, Item.PENDING),
    ]
    assert bulk_execute(bulk.pk, worker="another").status == B.EXECUTING  # still the dead worker's: no second run
    assert bulks_sweep_interrupted(now=timezone.now()) == 0  # its lease has not passed yet
    later = timezone.now() + timedelta(seconds=django_settings.RECOVERY_ACTION_LEASE_S + 60)
    assert bulks_sweep_interrupted(now=later) == 1
    assert BulkAction.objects.get(pk=bulk.pk).status == B.APPROVED
    assert len(world.jobs.jobs) == 1  # handed back: enqueued again to resume

    world.jobs.run()

    assert _items(bulk) == [
        (calls[0].pk, Item.EXECUTED),
        (calls[1].pk, Item.INTERRUPTED),
        (calls[2].pk, Item.EXECUTED),
    ]
    assert BulkAction.objects.get(pk=bulk.pk).status == B.FINISHED
    assert [fresh(calls[0]).state, fresh(calls[2]).state] == ["COMMITTED", "COMMITTED"]
    actions_sweep_interrupted(now=later)
    interrupted = BulkItem.objects.get(bulk=bulk, call=calls[1]).request
    interrupted.refresh_from_db()
    assert interrupted.status == ActionStatus.INTERRUPTED
    _until(lambda: len(world.posts(held)) == 2, timeout=10)  # the held reply is recorded once it is answered
    assert bulk_execute(bulk.pk, worker="third").status == B.FINISHED
    assert len(world.posts(held)) == 2  # the runtime's lost one and the one replay, never a second


def test_a_key_that_expires_while_the_bulk_waits_fails_its_item_and_nothing_is_sent(world):
    call = world.review_call()
    bulk = _approve(world, _request(world, _preview(world, [call], action="replay_same_key", queue=REVIEW)))
    world.jobs.jobs.clear()
    posts = len(world.posts(call.idempotency_key))
    Tool.objects.filter(pk=call.tool_id).update(key_retention_s=1)  # the provider now forgets keys after 1 s
    time.sleep(1.1)

    bulk_execute(bulk.pk, worker="w")

    item = BulkItem.objects.get(bulk=bulk)
    assert item.status == Item.FAILED and "re-checked at execution" in item.why, item.why
    assert "the provider no longer keeps this idempotency key" in item.why, item.why
    assert fresh(call).state == "HUMAN_REVIEW" and len(world.posts(call.idempotency_key)) == posts

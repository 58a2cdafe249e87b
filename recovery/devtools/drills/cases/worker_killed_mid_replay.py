"""Worker killed mid-replay: a refund committed with its reply lost while the status API is down; the poll budget
sends it to a person. The status API comes back; a reviewer requests a same-key replay, an approver approves it,
and an RQ worker executes it while the sandbox holds the replay's reply — and is killed with SIGKILL (its session
and its work horse). The request stays EXECUTING until its lease lapses and actions_sweep_interrupted marks it
INTERRUPTED (never re-run); the call, left SENT, is swept to UNKNOWN and settled COMMITTED by a receipt."""

from __future__ import annotations

import signal
import subprocess
import time
from datetime import datetime, timedelta

from django.utils import timezone
from recovery_client.runtime import HUMAN_REVIEW

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor
from recovery.devtools.drills.cases.shared import check_settled_by_one_receipt, request_replay, unconfirmed_refund
from recovery.devtools.drills.checks import in_order
from recovery.devtools.drills.evidence import action_events, at
from recovery.devtools.drills.framework import Run, missing_service, wait
from recovery.devtools.drills.stage import drill_people, parent_pid
from recovery.engine.states import CallState as S
from recovery.models import ActionRequest, ActionStatus, Attempt, AuditEvent, Call, Receipt
from recovery.services.actions import action_approve

# How long the sandbox holds the replay's reply (the worker is killed well inside it, and inside the drill
# provider's 2 s read timeout), and how long the drill waits for the execution lease to lapse (14 s on the drill
# provider), the sweeper (10 s outcome timeout) and a receipt.
HOLD_REPLY_MS = 8000
KILL_AFTER_S = 0.3  # after the admission: the request leaves at once and is at the sandbox well before this
SETTLE_WAIT_S = 90


def play(run: Run) -> None:
    if run.stage.workers is None:
        raise RuntimeError(missing_service(run.stage, run.drill))
    people = drill_people()
    agent, task_id, result = unconfirmed_refund(run, "killed", goal="refund an order nobody can confirm")
    key = result.key
    if result.outcome != HUMAN_REVIEW:
        raise RuntimeError(f"the refund ended {result.state} ({result.outcome}), not HUMAN_REVIEW: nothing to replay")
    run.sandbox.clear_faults()
    run.log("  the status API is back; a reviewer requests a same-key replay, an approver approves it")
    request = request_replay(result.call_id, people.reviewer, "the provider could not confirm it: replay, same key")
    run.sandbox.fault(route="/refunds", key=key, kind="latency", ms=HOLD_REPLY_MS, times=1)
    approved_at = timezone.now()
    approver = people.approvers[0]
    action_approve(request_id=request.pk, user=approver, actor=Actor.for_user(approver), reason="replay it once")

    worker, killed_at, left = _kill_the_executing_worker(run, request, result.call_id)
    _wait_settled(run, request, result.call_id, killed_at)
    agent.submit(task_id, "refund settled after an interrupted replay")
    # The held reply is written to a dead connection when its latency is over; it is logged then.
    wait(lambda: len(_posts_after(run, key, approved_at)) >= 1, 15)

    posts = _posts_after(run, key, approved_at)
    _check_killed_while_held(run, worker, killed_at, posts)
    _check_interrupted(run, request, result.call_id, left)
    swept = AuditEvent.objects.filter(
        call_id=result.call_id, from_state=S.SENT, to_state=S.UNKNOWN, created_at__gt=killed_at
    ).values_list("actor_label", flat=True)
    run.check(
        "the sweeper moved the call SENT → UNKNOWN",
        expected={"moved after the kill by": ["job:sweeper"]},
        observed={"moved after the kill by": list(swept)},
    )
    applied = list(Receipt.objects.filter(call_id=result.call_id, applied=True, checked_at__gt=killed_at))
    check_settled_by_one_receipt(run, applied, "applied receipts after the kill")
    run.check(
        "one replay request in the sandbox's request log",
        expected={"refund requests under the key": ["dropped_after_commit", "replayed"], "since the approval": 1},
        observed={
            "refund requests under the key": [post["outcome"] for post in run.sandbox.requests(key=key, method="POST")],
            "since the approval": len(posts),
        },
    )


def _check_killed_while_held(run: Run, worker: subprocess.Popen, killed_at: datetime, posts: list[dict]) -> None:
    """The worker died of SIGKILL after the replay reached the sandbox and before its held reply was due."""
    received = at(posts[0]) if posts else None
    if posts:
        run.log(f"  the replay was answered {posts[0]['status']} {posts[0]['outcome']} to a dead connection")
    run.check(
        "the worker was killed while the sandbox held the replay's reply",
        expected={"exit": -signal.SIGKILL, "times": in_order("replay at the sandbox", "kill", "reply due")},
        observed={
            "exit": worker.returncode,
            "times": {
                "replay at the sandbox": received,
                "kill": killed_at,
                "reply due": received + timedelta(milliseconds=HOLD_REPLY_MS) if received else None,
            },
        },
    )


def _kill_the_executing_worker(
    run: Run, request: ActionRequest, call_id: int
) -> tuple[subprocess.Popen, datetime, str]:
    """Once the replay is executing (the call SENT), kill -9 the RQ worker holding it and start another: the dead
    worker, when it was killed, and the request's status right after."""
    workers = run.stage.workers

    def in_flight() -> bool:
        request.refresh_from_db()
        return request.status == ActionStatus.EXECUTING and Call.objects.filter(pk=call_id, state=S.SENT).exists()

    if not wait(in_flight, 30, every_s=0.02):
        raise RuntimeError(f"the replay was not executing within 30 s: the request is {request.status}")
    time.sleep(KILL_AFTER_S)  # the request leaves right after the admission: let it reach the sandbox
    owner = request.execution_owner
    horse = int(owner.rsplit(":", 2)[1]) if owner.count(":") >= 2 else 0
    worker = workers.holding(horse)
    if worker is None:
        ours = ", ".join(str(child.pid) for child in workers.processes)
        raise RuntimeError(
            f"the execution's owner {owner!r} (parent {parent_pid(horse)}) is not one of this stage's RQ workers"
            f" ({ours})"
        )
    workers.kill(worker, horse)
    killed_at = timezone.now()
    run.log(
        f"  kill -9 of RQ worker {worker.pid} and its work horse {horse} while the sandbox holds the replay's reply"
    )
    request.refresh_from_db()
    left = request.status
    replacement = workers.replace(worker)
    run.log(f"  a new RQ worker {replacement.pid} takes its place; the request is {left}")
    return worker, killed_at, left


def _wait_settled(run: Run, request: ActionRequest, call_id: int, killed_at: datetime) -> None:
    """Until the request is no longer EXECUTING and the call is COMMITTED; what happened after the kill, logged."""

    def settled() -> bool:
        request.refresh_from_db()
        state = Call.objects.values_list("state", flat=True).get(pk=call_id)
        return request.status != ActionStatus.EXECUTING and state == S.COMMITTED

    wait(settled, SETTLE_WAIT_S, every_s=0.25)
    after_kill = AuditEvent.objects.filter(call_id=call_id, created_at__gt=killed_at).order_by("seq")
    story = [
        f"{event.action if not event.to_state else f'{event.from_state} → {event.to_state}'}"
        f" +{(event.created_at - killed_at).total_seconds():.1f} s ({event.actor_label})"
        for event in after_kill
    ]
    run.log(f"  after the kill: {'; '.join(story) or 'nothing'}")


def _check_interrupted(run: Run, request: ActionRequest, call_id: int, left: str) -> None:
    """The request was EXECUTING right after the kill and is INTERRUPTED now, never executed again."""
    actions = action_events([call_id])[call_id]
    approved = AuditAction.ACTION_APPROVED
    since = actions[actions.index(approved) :] if approved in actions else actions
    run.check(
        "the request was left EXECUTING, then INTERRUPTED, never re-run",
        expected={
            "after the kill": ActionStatus.EXECUTING,
            "now": ActionStatus.INTERRUPTED,
            "action events since the approval": [
                approved,
                AuditAction.ACTION_EXECUTING,
                AuditAction.ACTION_INTERRUPTED,
            ],
            "attempts": run.drill.sends,
        },
        observed={
            "after the kill": left,
            "now": request.status,
            "action events since the approval": since,
            "attempts": Attempt.objects.filter(call_id=call_id).count(),
        },
    )


def _posts_after(run: Run, key: str, moment: datetime) -> list[dict]:
    return [post for post in run.sandbox.requests(key=key, method="POST") if at(post) >= moment]

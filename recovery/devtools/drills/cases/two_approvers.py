"""Two approvers: `run.rounds` refunds, each refused 403 `needs_approval` by the provider (nothing executed:
HUMAN_REVIEW). In each round a reviewer previews and requests a same-key replay, then two approvers approve it at
the same moment (threads released by a barrier; on SQLite one after the other): exactly one approval and one
refusal, one execution, one effect per key."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db import connection
from django.utils import timezone
from recovery_client.runtime import HUMAN_REVIEW, CallResult

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor
from recovery.devtools.drills.cases.shared import request_replay
from recovery.devtools.drills.checks import each
from recovery.devtools.drills.evidence import action_events, at
from recovery.devtools.drills.framework import Run, wait
from recovery.devtools.drills.stage import drill_people
from recovery.engine.states import CallState as S
from recovery.models import ActionRequest, ActionStatus, Attempt, Call
from recovery.services.actions import action_approve
from recovery.services.errors import Refusal

SETUP_THREADS = 8  # refunds made at once while the rounds are set up
EXECUTION_WAIT_S = 120  # how long the drill waits for approved replays to be executed


@dataclass(kw_only=True)
class _Approval:
    """One approver's answer in a round: the status it left the request in, or the refusal's code."""

    username: str
    status: str = ""
    refused: str = ""
    began: float = 0.0
    ended: float = 0.0


def play(run: Run) -> None:
    at_once = connection.vendor == "postgresql"
    if not at_once:
        run.log(
            "  SQLite: the two approvals of each round run one after the other (SQLite runs one writer at a time);"
            " the concurrency claim is PostgreSQL's"
        )
    waiting = _refused_refunds(run)
    approved_at = timezone.now()
    answers, requests = _approve_rounds(run, waiting, at_once=at_once)
    _wait_executed(run, requests)
    submitter = run.agent(log=lambda line: None)
    for call_id in requests:
        task_id = Call.objects.values_list("task_id", flat=True).get(pk=call_id)
        submitter.submit(task_id, "refund replayed by an approved action")

    _check_answers(run, {f"round {n}": pair for n, pair in enumerate(answers.values(), 1)}, at_once=at_once)
    _check_one_execution(run, requests)

    # The provider's side: one replay request per key after the approvals (the first request was the 403).
    posts = Counter(entry["key"] for entry in run.posts_since("/refunds") if at(entry) >= approved_at)
    run.check(
        "one replay request per key",
        expected=each({"refund requests after its approval": 1}, of=run.rounds, unit="keys"),
        observed={r.key: {"refund requests after its approval": posts.get(r.key, 0)} for r in waiting},
    )


def _check_answers(run: Run, rounds: dict[str, list[_Approval]], *, at_once: bool) -> None:
    """Two different approvers in every round (their approvals in flight together on PostgreSQL), one approval
    taken and one refused."""
    starts = [abs(pair[0].began - pair[1].began) * 1000 for pair in rounds.values() if len(pair) == 2]
    run.log(f"  the approvals of a round started at most {max(starts, default=0):.1f} ms apart")
    run.check(
        "two approvers at once in every round",
        expected=each({"approvers": 2, "in flight together": at_once}, of=run.rounds, unit="rounds"),
        observed={
            n: {"approvers": len({a.username for a in pair}), "in flight together": _together(pair)}
            for n, pair in rounds.items()
        },
    )
    refusals = Counter(a.refused for pair in rounds.values() for a in pair if a.refused)
    run.log("  refusals: " + (", ".join(f"{code} x {n}" for code, n in refusals.items()) or "none"))
    run.check(
        "one approval and one refusal per round",
        expected=each({"approvals taken": 1, "refusals": 1}, of=run.rounds, unit="rounds"),
        observed={
            n: {"approvals taken": sum(bool(a.status) for a in pair), "refusals": sum(bool(a.refused) for a in pair)}
            for n, pair in rounds.items()
        },
    )


def _refused_refunds(run: Run) -> list[CallResult]:
    """The rounds' refunds, made on SETUP_THREADS threads, each refused 403 needs_approval: all in HUMAN_REVIEW."""
    tool = run.stage.tool("refund.create")
    local = threading.local()

    def refund(n: int) -> CallResult:
        if getattr(local, "agent", None) is None:  # one agent (one HTTP session) per thread
            local.agent = run.agent(log=lambda line: None)
        key, arguments = run.refund_args(f"approvers-{n:02d}", n)
        run.sandbox.fault(route="/refunds", key=key, kind="error", status=403, code="needs_approval", times=1)
        task = local.agent.start_task(run.key(f"drill-approvers-{n:02d}"), goal=f"refund {arguments['order_id']}")
        return local.agent.run_call(task.id, step=1, tool=tool, key=key, arguments=arguments)

    began = time.monotonic()
    with ThreadPoolExecutor(SETUP_THREADS, thread_name_prefix="drill-approvers") as pool:
        made = list(pool.map(refund, range(1, run.rounds + 1)))
    for result in made:
        run.call(result)
    waiting = [result for result in made if result.outcome == HUMAN_REVIEW and result.call_id is not None]
    run.log(
        f"  {run.rounds} refunds answered 403 needs_approval in {time.monotonic() - began:.1f} s:"
        f" {len(waiting)} in HUMAN_REVIEW"
    )
    if len(waiting) != run.rounds:
        raise RuntimeError(f"only {len(waiting)} of {run.rounds} refunds reached HUMAN_REVIEW: nothing to approve")
    return waiting


def _approve_rounds(
    run: Run, waiting: list[CallResult], *, at_once: bool
) -> tuple[dict[int, list[_Approval]], dict[int, int]]:
    """Round after round, a same-key replay requested by the reviewer and approved by both approvers: each call's
    two answers, and its action request's id."""
    people = drill_people()
    answers: dict[int, list[_Approval]] = {}
    requests: dict[int, int] = {}
    began = time.monotonic()
    for n, result in enumerate(waiting, 1):
        request = request_replay(result.call_id, people.reviewer, f"drill round {n}: replay with the same key")
        requests[result.call_id] = request.pk
        answers[result.call_id] = _approve_twice(
            request.pk, people.approvers, at_once=at_once, reason=f"drill round {n}: approved"
        )
        if n % 10 == 0 or n == run.rounds:
            run.log(f"  round {n} of {run.rounds} approved ({time.monotonic() - began:.1f} s)")
    return answers, requests


def _approve_twice(request_id: int, approvers, *, at_once: bool, reason: str) -> list[_Approval]:
    """Both approvers approve the request: released together by a barrier on threads of their own (each with its
    own database connection) when `at_once`, one after the other otherwise."""
    barrier = threading.Barrier(len(approvers)) if at_once else None

    def approve(user) -> _Approval:
        answer = _Approval(username=user.get_username())
        try:
            if barrier is not None:
                barrier.wait(timeout=30)
            answer.began = time.perf_counter()
            try:
                done = action_approve(request_id=request_id, user=user, actor=Actor.for_user(user), reason=reason)
                answer.status = done.status
            except Refusal as refused:
                answer.refused = refused.code
            answer.ended = time.perf_counter()
            return answer
        finally:
            if barrier is not None:
                connection.close()  # this thread's own

    if not at_once:
        return [approve(user) for user in approvers]
    with ThreadPoolExecutor(len(approvers), thread_name_prefix="drill-approver") as pool:
        return list(pool.map(approve, approvers))


def _together(pair: list[_Approval]) -> bool:
    """Whether both approvals were in flight at the same moment."""
    return len(pair) == 2 and max(a.began for a in pair) < min(a.ended for a in pair)


def _wait_executed(run: Run, requests: dict[int, int]) -> None:
    began = time.monotonic()

    def unfinished() -> int:
        pending = (ActionStatus.APPROVED, ActionStatus.EXECUTING)
        return ActionRequest.objects.filter(pk__in=requests.values(), status__in=pending).count()

    wait(lambda: unfinished() == 0, EXECUTION_WAIT_S, every_s=0.2)
    wait(lambda: Call.objects.filter(pk__in=list(requests), state=S.SENT).count() == 0, 30, every_s=0.2)
    run.log(f"  executions done {time.monotonic() - began:.1f} s after the last round ({unfinished()} unfinished)")


def _check_one_execution(run: Run, requests: dict[int, int]) -> None:
    """Each round's request executed once (one claim), its call admitted once more."""
    ids = list(requests)
    events = action_events(ids)
    statuses = dict(ActionRequest.objects.filter(pk__in=requests.values()).values_list("pk", "status"))
    replays = Counter(Attempt.objects.filter(call_id__in=ids).values_list("call_id", flat=True))
    run.check(
        "one execution per round",
        expected=each(
            {"request": ActionStatus.EXECUTED, "approved": 1, "executing": 1, "attempts": run.drill.sends},
            of=run.rounds,
            unit="rounds",
        ),
        observed={
            f"call {i}": {
                "request": statuses.get(requests[i]),
                "approved": events[i].count(AuditAction.ACTION_APPROVED),
                "executing": events[i].count(AuditAction.ACTION_EXECUTING),
                "attempts": replays[i],
            }
            for i in ids
        },
    )

"""Concurrent writers on PostgreSQL (docs/design/state-machine.md, docs/design/audit.md): one winner per state change,
and audit chains that never fork, never leave a gap in the global sequence and never deadlock, however many writers
append at once."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from recovery.audit.chain import Actor, append_event, verify_all, verify_chain
from recovery.models import AuditChainHead, AuditEvent, Call, Task
from recovery.statemachine.transitions import TransitionConflict, transition_call

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WORKERS = 8
TIMEOUT_S = 30


def run_workers(work: Callable[[int, threading.Barrier], None], workers: int = WORKERS) -> list[str]:
    """Run `work(worker_index, barrier)` on `workers` threads, each with its own database connection; return the
    errors they raised (an empty list when every thread finished cleanly)."""
    barrier = threading.Barrier(workers, timeout=TIMEOUT_S)
    errors: list[str] = []

    def target(index: int) -> None:
        try:
            work(index, barrier)
        except Exception as exc:
            errors.append(f"worker {index}: {exc!r}")
            barrier.abort()  # release the others instead of leaving them waiting for the timeout
        finally:
            connection.close()

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S * 2)
    assert not any(thread.is_alive() for thread in threads), "a worker hung"
    return errors


def test_it_lets_exactly_one_of_eight_racing_workers_move_a_call(make_call):
    rounds = 50
    calls = [make_call("READY") for _ in range(rounds)]
    outcomes: dict[int, list[tuple[int, str]]] = {call.pk: [] for call in calls}

    def work(index: int, barrier: threading.Barrier) -> None:
        actor = Actor.job(f"worker-{index}")
        for call in calls:
            mine = Call.objects.get(pk=call.pk)  # every racer reads READY at version 0 ...
            barrier.wait()  # ... before any of them moves it
            try:
                transition_call(mine, "SENT", actor=actor, reason=f"admitted by worker {index}")
            except TransitionConflict:
                outcomes[call.pk].append((index, "conflict"))
            else:
                outcomes[call.pk].append((index, "won"))

    assert run_workers(work) == []

    for call in calls:
        results = Counter(result for _, result in outcomes[call.pk])
        assert results == {"won": 1, "conflict": WORKERS - 1}, f"call {call.pk}: {outcomes[call.pk]}"
        (winner,) = [index for index, result in outcomes[call.pk] if result == "won"]
        (event,) = AuditEvent.objects.filter(call_id=call.pk)  # exactly one audit row, naming the winner
        assert (event.from_state, event.to_state, event.actor_label) == ("READY", "SENT", f"job:worker-{winner}")
        call.refresh_from_db()
        assert (call.state, call.version) == ("SENT", 1)
    report = verify_all()
    assert (report.ok, report.events) == (True, rounds), report.problem


def test_it_never_forks_a_chain_under_concurrent_appends(task):
    per_worker = 25

    def work(index: int, barrier: threading.Barrier) -> None:
        actor = Actor.job(f"worker-{index}")
        barrier.wait()
        for n in range(per_worker):
            with transaction.atomic():
                append_event(action="test.append", actor=actor, task_id=task.pk, reason=f"{index}:{n}")

    assert run_workers(work) == []

    events = list(AuditEvent.objects.filter(chain=f"task:{task.pk}").order_by("chain_seq"))
    total = WORKERS * per_worker
    assert [e.chain_seq for e in events] == list(range(1, total + 1))
    assert list(AuditEvent.objects.order_by("seq").values_list("seq", flat=True)) == list(range(1, total + 1))
    for before, after in itertools.pairwise(events):
        assert (after.prev_id, after.prev_hash) == (before.pk, before.hash)  # one line, no branches
    for index in range(WORKERS):  # each writer's events keep the order it wrote them in
        mine = [int(e.reason.split(":")[1]) for e in events if e.reason.startswith(f"{index}:")]
        assert mine == list(range(per_worker))
    assert AuditChainHead.objects.get(key=f"task:{task.pk}").length == total
    assert verify_chain(f"task:{task.pk}").ok
    report = verify_all()
    assert (report.ok, report.events) == (True, total), report.problem


def test_it_keeps_the_global_sequence_gap_free_when_concurrent_appends_roll_back(registry):
    tasks = [Task.objects.create(tenant=registry["tenant"], external_id=f"t{i}", agent="a", goal="g") for i in range(4)]
    per_worker = 20

    class Undo(Exception):
        pass

    def work(index: int, barrier: threading.Barrier) -> None:
        actor = Actor.job(f"worker-{index}")
        barrier.wait()
        for n in range(per_worker):
            owner = tasks[(index + n) % len(tasks)]
            try:
                with transaction.atomic():
                    append_event(action="test.append", actor=actor, task_id=owner.pk, reason=f"{index}:{n}")
                    if n % 3 == 0:
                        raise Undo  # the change this event recorded failed: the event goes with it
            except Undo:
                pass

    assert run_workers(work) == []

    kept = sum(1 for n in range(per_worker) if n % 3 != 0) * WORKERS
    assert list(AuditEvent.objects.order_by("seq").values_list("seq", flat=True)) == list(range(1, kept + 1))
    assert AuditChainHead.objects.get(key="global").length == kept
    for owner in tasks:
        seqs = list(AuditEvent.objects.filter(task=owner).order_by("chain_seq").values_list("chain_seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1))
    report = verify_all()
    assert (report.ok, report.events, report.chains) == (True, kept, len(tasks)), report.problem


def test_it_never_deadlocks_writers_appending_to_two_chains_in_opposite_orders(task, registry):
    other = Task.objects.create(tenant=registry["tenant"], external_id="other", agent="a", goal="g")
    per_worker = 10

    def work(index: int, barrier: threading.Barrier) -> None:
        actor = Actor.job(f"worker-{index}")
        first, second = (task, other) if index % 2 else (other, task)
        barrier.wait()
        for n in range(per_worker):
            with transaction.atomic():
                append_event(action="test.append", actor=actor, task_id=first.pk, reason=f"{index}:{n}:a")
                append_event(action="test.append", actor=actor, task_id=second.pk, reason=f"{index}:{n}:b")

    assert run_workers(work) == []  # a deadlock would surface here as OperationalError("deadlock detected")

    total = 2 * WORKERS * per_worker
    for owner in (task, other):
        assert AuditChainHead.objects.get(key=f"task:{owner.pk}").length == WORKERS * per_worker
    report = verify_all()
    assert (report.ok, report.events, report.chains) == (True, total, 2), report.problem

"""Reconciliation's threads (docs/reconciliation.md): status queries in flight on one set of threads, their answers
applied in batches on a second, smaller one. Only concurrency lives here, on the standard library's threads and
queue.Queue (not a ThreadPoolExecutor: each thread closes its own database connections when it ends, which an
executor's threads cannot be asked to do); what a check or an answer means is recovery.services.reconcile.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

logger = logging.getLogger("recovery.reconcile")
_STOP = object()


class _Threads:
    """`size` threads taking items from one queue (holding at most `bound` waiting, 0: no bound) and passing them to
    `work`: one at a time, or with `batch` > 1 whatever is waiting, up to `batch` items. Each thread stops at the
    first stop signal it takes, so close() puts one per thread."""

    def __init__(self, work: Callable, size: int, name: str, *, batch: int = 1, bound: int = 0):
        self.work, self.name, self.batch = work, name, batch
        self.items: queue.Queue = queue.Queue(maxsize=bound)
        self.errors: list[Exception] = []
        self.threads = [
            threading.Thread(target=self._run, name=f"reconcile-{name}-{n}", daemon=True) for n in range(size)
        ]
        for thread in self.threads:
            thread.start()

    def put(self, item: Any) -> None:
        """Hand over one item; waits while the queue holds `bound` items already."""
        self.items.put(item)

    def close(self) -> list[Exception]:
        """Wait until every item put so far is done; the errors the work raised or returned."""
        for _ in self.threads:
            self.items.put(_STOP)
        for thread in self.threads:
            thread.join()
        return self.errors

    def _take(self) -> tuple[list, bool]:
        first = self.items.get()
        if first is _STOP:
            return [], True
        taken = [first]
        while len(taken) < self.batch:
            try:
                item = self.items.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return taken, True
            taken.append(item)
        return taken, False

    def _run(self) -> None:
        try:
            stop = False
            while not stop:
                taken, stop = self._take()
                if taken:
                    self._do(taken if self.batch > 1 else taken[0])
        finally:
            connections.close_all()  # this thread's own: none outlives the run

    def _do(self, item: Any) -> None:
        try:
            self.errors.extend(self.work(item) or [])
        except Exception as exc:  # one item's failure must not stop the others (a call's lease then expires)
            logger.exception("reconciliation: %s failed for %r", self.name, item)
            self.errors.append(exc)


def run_checks(
    items: Iterable,
    ask: Callable[[Any], Any],
    apply: Callable[[list], list[Exception] | None],
    *,
    in_flight: int,
    apply_threads: int = 2,
    apply_batch: int = 20,
) -> tuple[int, list[Exception]]:
    """`ask` each of `items` on `in_flight` threads and `apply` what it answers (None: nothing to apply) in batches
    on `apply_threads` others, as answers arrive. `items` is drawn only while fewer than 2 x `in_flight` wait to be
    asked, so whatever claims them claims a few at a time. How many items were handed over, and the errors."""
    appliers = _Threads(apply, apply_threads, "apply", batch=apply_batch)

    def query(item: Any) -> None:
        answer = ask(item)
        if answer is not None:
            appliers.put(answer)

    queries = _Threads(query, in_flight, "query", bound=2 * in_flight)
    count = 0
    try:
        for item in items:
            queries.put(item)
            count += 1
    finally:
        errors = queries.close()
        errors = errors + appliers.close()
    return count, errors

"""Reports off the caller's clock (API 1.2, docs/api.md#reporting-off-the-clock): a 2xx that passes the checks its
admission handed over is answered to the caller at once and reported from a background thread, within the terms'
`within_s`, and always before the task's next admission (settle()). The console's verdict stays the word: one that
disagrees (the call not COMMITTED) is kept in `disagreed` for the task, and the runtime hands it on with the task's
next answer. A report that never arrives ends as any lost report does: swept to UNKNOWN, reconciled by receipt.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field
from typing import Any

from recovery_client import OutcomeAnswer, RecoveryClient, ReportTerms

__all__ = ["DeferredReports", "Pending", "passes"]

logger = logging.getLogger("recovery_client.deferred")
_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)|\[([0-9]+)\]")
_ABSENT = object()


def _resolve(value: Any, path: str) -> Any:
    """The value at a dotted path (`refund.id`, `items[0].id`) of a JSON value, or _ABSENT."""
    node = value
    for name, index in _PART.findall(path):
        if name:
            if not isinstance(node, dict) or name not in node:
                return _ABSENT
            node = node[name]
        else:
            if not isinstance(node, list) or int(index) >= len(node):
                return _ABSENT
            node = node[int(index)]
    return node


def passes(facts: dict[str, Any], terms: ReportTerms | None, *, key: str) -> bool:
    """Whether the caller may have this reply before the console judged it: the terms allow it, the reply is a 2xx
    other than 202 (accepted is not committed), every required result field is there, the provider's reference is
    there, and a key the reply echoes is the call's own."""
    if not terms or not terms.get("may_defer"):
        return False
    status = facts.get("http_status")
    if not isinstance(status, int) or not 200 <= status < 300 or status == 202 or "error" in facts:
        return False
    result = facts.get("result")
    for path in terms.get("required_result_fields") or []:
        if _resolve(result, path) in (_ABSENT, None):
            return False
    ref_field = terms.get("provider_ref_field") or ""
    reference = facts.get("provider_request_id") or (_resolve(result, ref_field) if ref_field else _ABSENT)
    if reference in (_ABSENT, None, "") or isinstance(reference, (dict, list, bool)):
        return False
    echoed = facts.get("echoed_idempotency_key")
    return echoed is None or echoed == key


@dataclass
class Pending:
    call_id: int
    attempt_id: str
    future: Future[OutcomeAnswer] = field(repr=False)


class DeferredReports:
    """The reports a runtime owes, per task, sent by one background thread in the order they were made."""

    def __init__(self, client: RecoveryClient, log: Callable[[str], None]) -> None:
        self.client, self.log = client, log
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recovery-report")
        self.pending: dict[int, list[Pending]] = {}
        self.disagreed: dict[int, list[OutcomeAnswer]] = {}
        self.lock = threading.Lock()

    def defer(self, task_id: int, call_id: int, attempt_id: str, facts: dict[str, Any]) -> None:
        """Send the report now, from the background thread (it leaves at once: well within the terms' within_s)."""
        future = self.pool.submit(self.client.report, call_id, attempt_id, facts)
        with self.lock:
            self.pending.setdefault(task_id, []).append(Pending(call_id, attempt_id, future))

    def settle(self, task_id: int, timeout_s: float = 60.0) -> list[OutcomeAnswer]:
        """Wait for the task's reports (before its next admission, its submit, its end): the verdicts that disagree
        with the early answer, also kept in `disagreed[task_id]`."""
        with self.lock:
            owed = self.pending.pop(task_id, [])
        if not owed:
            return []
        wait_all([p.future for p in owed], timeout=timeout_s)
        against: list[OutcomeAnswer] = []
        for report in owed:
            try:
                answer = report.future.result(timeout=0)
            except Exception:  # lost: the console sweeps the call to UNKNOWN and reconciles it by receipt
                logger.warning("deferred report of call %s %s was not delivered", report.call_id, report.attempt_id)
                self.log(f"  call {report.call_id}: its deferred report was not delivered; the console reconciles it")
                continue
            if answer.call_state != "COMMITTED":
                against.append(answer)
                self.log(f"  call {report.call_id}: the console's verdict is {answer.call_state}, not COMMITTED")
        if against:
            with self.lock:
                self.disagreed.setdefault(task_id, []).extend(against)
        return against

    def close(self) -> None:
        for task_id in list(self.pending):
            self.settle(task_id)
        self.pool.shutdown(wait=True)

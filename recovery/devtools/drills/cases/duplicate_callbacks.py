"""Duplicate callbacks: an UNKNOWN refund (accepted as pending, reply dropped) completes at the provider while the
agent waits, and the provider delivers its signed callback several times: one receipt applies, the copies change
nothing."""

from __future__ import annotations

import time
from itertools import pairwise

from recovery.devtools.drills.evidence import call_paths
from recovery.devtools.drills.framework import Run, wait
from recovery.devtools.drills.stage import callback_url
from recovery.devtools.drills.table import CALLBACK_COPIES
from recovery.engine.states import CallState as S
from recovery.models import Receipt


def play(run: Run) -> None:
    sandbox = run.sandbox
    key, arguments = run.refund_args("callbacks", 1)
    sandbox.configure(callback_url=callback_url(run.stage.api_url))
    sandbox.fault(route="/refunds", key=key, kind="pending", checks=0, times=1)
    sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    sandbox.fault(route="/refunds", key=key, kind="duplicate_callbacks", copies=CALLBACK_COPIES, times=1)
    finished = []

    def sleep(seconds: float) -> None:
        if not finished:  # the agent has just been told to wait for reconciliation: the call is UNKNOWN
            finished.append(True)
            # The provider finishes the pending refund (one status read of the sandbox's own, standing for time
            # passing there), which sends its callback, copies of one signed event.
            sandbox.call("GET", f"/refunds/by-key/{key}", timeout=5)
            run.log(f"  the provider completes the refund and calls back ({CALLBACK_COPIES} copies of one event)")
        time.sleep(seconds)

    agent = run.agent(sleep=sleep)
    goal = "refund an order the provider confirms by callback"
    task_id, result = run.refund(agent, key, arguments, task="drill-callbacks", goal=goal)
    agent.submit(task_id, f"refund {result.state}")

    def deliveries() -> list[dict]:
        return [entry for entry in sandbox.callbacks() if entry["idempotency_key"] == key]

    wait(lambda: len(deliveries()) >= CALLBACK_COPIES, 10)
    delivered = deliveries()
    events = sorted({entry["event_id"] for entry in delivered})
    run.check(
        f"the provider delivered one event {CALLBACK_COPIES} times",
        expected={"deliveries": CALLBACK_COPIES, "event ids": 1, "answered": ["2xx"]},
        observed={
            "deliveries": len(delivered),
            "event ids": len(events),
            "answered": sorted({_status_class(entry["status"]) for entry in delivered}),
        },
    )
    path = call_paths([result.call_id]).get(result.call_id, ())
    run.check(
        "one receipt applied, one transition",
        expected={"receipts stored for the event": 1, "receipts applied": 1, "transitions out of UNKNOWN": 1},
        observed={
            "receipts stored for the event": Receipt.objects.filter(
                call_id=result.call_id, event_id__in=events
            ).count(),
            "receipts applied": Receipt.objects.filter(call_id=result.call_id, applied=True).count(),
            "transitions out of UNKNOWN": sum(1 for before, after in pairwise(path) if before == S.UNKNOWN and after),
        },
    )


def _status_class(status) -> str:
    """2xx, 4xx, ... for an HTTP status; anything else (no answer) as it is."""
    return f"{status // 100}xx" if isinstance(status, int) else str(status)

"""Lost before commit: the request is held past the client's read timeout and then dropped unexecuted; the call is
UNKNOWN, a receipt proves nothing happened, and the same-key retry commits once."""

from __future__ import annotations

from recovery.devtools.drills.checks import in_order, including
from recovery.devtools.drills.evidence import attempts
from recovery.devtools.drills.framework import Run
from recovery.models import Receipt


def play(run: Run) -> None:
    key, arguments = run.refund_args("lost", 1)
    read_timeout_s = float(run.stage.registry["providers"][0].get("read_timeout_s", 5))
    run.sandbox.fault(route="/refunds", key=key, kind="latency", ms=int(read_timeout_s * 1000) + 500, times=1)
    run.sandbox.fault(route="/refunds", key=key, kind="drop_before_commit", times=1)
    agent = run.agent()
    task_id, result = run.refund(agent, key, arguments, task="drill-lost", goal="refund an order whose request is lost")
    agent.submit(task_id, f"refund {result.state}")

    first, second = [*attempts(result.call_id), None, None][:2]
    run.check(
        "the client timed out",
        expected={"first attempt's error": "read_timeout"},
        observed={"first attempt's error": (first.error_kind or first.http_status) if first else None},
    )
    posts = run.sandbox.requests(key=key, method="POST")
    run.check(
        "the provider executed nothing for the first request",
        expected={"first request": "dropped_before_commit"},
        observed={"first request": posts[0]["outcome"] if posts else None},
    )
    proof = Receipt.objects.filter(call_id=result.call_id, applied=True, observed="not_committed").first()
    run.check(
        "a receipt proved it not committed before the retry",
        expected={
            "times": in_order("not_committed receipt", "retry admitted"),
            "retry evidence": including("state_verified"),
        },
        observed={
            "times": {
                "not_committed receipt": proof.checked_at if proof else None,
                "retry admitted": second.admitted_at if second else None,
            },
            "retry evidence": second.evidence if second else None,
        },
    )
    run.check(
        "the retry carried the same key",
        expected={"keys of the refund requests": [key] * run.drill.sends},
        observed={"keys of the refund requests": [post["key"] for post in run.posts_since("/refunds")]},
    )

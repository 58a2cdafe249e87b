"""A refund on Square's wire format (docs/providers.md): the agent sends it form-encoded with its key in the body's
`idempotency_key` field, as the registry describes the tool, and the sandbox declines it with Square's error shape
(402, `{"errors": [{"category", "code": "CARD_DECLINED", "detail"}]}`). The console reads the code where the
provider's `error_code_paths` say, the tool's `refusal_codes` name it: refused, nothing executed, never retried."""

from __future__ import annotations

from recovery.devtools.drills.evidence import attempts
from recovery.devtools.drills.framework import Run
from recovery.devtools.drills.stage import SQUARE_REFUND

DECLINE = {"status": 402, "code": "CARD_DECLINED", "shape": "square"}


def play(run: Run) -> None:
    key, arguments = run.refund_args("square-wire", 1)
    tool = run.stage.tool(SQUARE_REFUND)
    run.sandbox.fault(route="/refunds", key=key, kind="error", times=1, **DECLINE)

    agent = run.agent()
    task_id, result = run.refund(
        agent, key, arguments, task="drill-square-wire", goal="refund an order on Square's wire", tool=SQUARE_REFUND
    )
    agent.submit(task_id, f"refund {result.state}")

    posts = run.sandbox.requests(key=key, method="POST")
    run.check(
        "the key travelled in the body of a form-encoded request",
        expected={"requests": [{"key": key, "status": DECLINE["status"], "outcome": "error_injected"}]},
        observed={"requests": [{"key": p["key"], "status": p["status"], "outcome": p["outcome"]} for p in posts]},
    )
    made = attempts(result.call_id)
    run.check(
        "Square's error code read and classified as a refusal",
        expected={"tool": tool, "code": DECLINE["code"], "row": "refusal", "attempts": 1},
        observed={
            "tool": made[0].tool.name if made else None,
            "code": made[0].error_code if made else None,
            "row": (made[0].failure or {}).get("row") if made else None,
            "attempts": len(made),
        },
    )

"""Refused before send: the provider's port is closed for the first attempt (the sandbox process is stopped just
before it is sent, and started again on the same port before the second). The facts come from the real
exception, nothing reached the provider, and the retry carries the same key."""

from __future__ import annotations

from recovery.devtools.drills.evidence import at, attempts
from recovery.devtools.drills.framework import Run
from recovery.devtools.sandbox.process import SandboxProcess


def play(run: Run) -> None:
    sandbox = run.sandbox
    if not isinstance(sandbox, SandboxProcess):
        raise RuntimeError("this drill stops and starts the sandbox process: run it on drill_stage()")
    key, arguments = run.refund_args("refused", 1)

    def before_send(tool: str, sent_key: str, number: int) -> None:
        if sent_key != key:
            return
        if number == 1:
            sandbox.stop()
            run.log(f"  the sandbox is stopped: {sandbox.url} refuses connections")
        elif sandbox.process is None:
            sandbox.start()
            sandbox.configure(callback_url=None)
            run.log(f"  the sandbox is back on {sandbox.url}")

    agent = run.agent(before_send=before_send)
    task_id, result = run.refund(
        agent, key, arguments, task="drill-refused", goal="refund an order while the provider is down"
    )
    agent.submit(task_id, f"refund {result.state}")

    made = attempts(result.call_id)
    facts = None
    if made:
        facts = {"error": made[0].error_kind or made[0].http_status, "connection opened": made[0].connection_opened}
    run.check(
        "the first attempt's facts come from the real exception",
        expected={"error": "connection_refused", "connection opened": False},
        observed=facts,
    )
    posts = sandbox.requests(key=key, method="POST")
    first_sent = result.sent[0].sent_at if result.sent else None
    run.check(
        "the sandbox logged no request for the first attempt",
        expected={
            "attempts": run.drill.sends,
            "requests logged": run.drill.sends - 1,
            "all after the first attempt": True,
        },
        observed={
            "attempts": len(made),
            "requests logged": len(posts),
            "all after the first attempt": bool(first_sent)
            and all(at(post).timestamp() > first_sent for post in posts),
        },
    )
    run.check(
        "the retry carried the same key",
        expected={"keys of the refund requests": [key]},
        observed={"keys of the refund requests": sorted({post["key"] for post in run.posts_since("/refunds")})},
    )

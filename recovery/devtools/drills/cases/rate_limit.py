"""Rate limit: a lookup answered 429 with a Retry-After, once per RETRYABLE of the table's path, then the answer; the
agent waits out each Retry-After."""

from __future__ import annotations

from itertools import pairwise

from recovery.devtools.drills.checks import at_least
from recovery.devtools.drills.evidence import at
from recovery.devtools.drills.framework import Run
from recovery.devtools.drills.table import RETRY_AFTER_S
from recovery.engine.states import CallState as S
from recovery.models import Decision


def play(run: Run) -> None:
    sandbox = run.sandbox
    limited = run.drill.path.count(S.RETRYABLE)
    order = run.order_id(1)
    route = f"/replica/orders/{order}"
    sandbox.fault(route=route, kind="rate_limit", retry_after_s=RETRY_AFTER_S, times=limited)
    agent = run.agent()
    task = agent.start_task(run.key("drill-rate-limit"), goal="look up an order at a rate-limited provider")
    key = run.key("lookup-rate-limited")
    tool = run.stage.tool("order.lookup_replica")
    result = run.call(agent.run_call(task.id, step=1, tool=tool, key=key, arguments={"order_id": order}))
    agent.submit(task.id, f"lookup {result.state}")

    cards = Decision.objects.filter(call_id=result.call_id).order_by("id").values_list("required_next", flat=True)
    run.check(
        "the decision cards named the Retry-After",
        expected=[{"action": "retry_after", "after ms": at_least(RETRY_AFTER_S * 1000)}] * limited,
        observed=[{"action": card.get("action"), "after ms": card.get("after_ms")} for card in cards],
    )
    logged = sandbox.requests(path_prefix=route)
    run.check(
        "no attempt before its Retry-After",
        expected={
            "answers": [429] * limited + [200],
            "seconds after each 429": [at_least(float(RETRY_AFTER_S))] * limited,
        },
        observed={
            "answers": [entry["status"] for entry in logged],
            "seconds after each 429": [
                (at(later) - at(earlier)).total_seconds()
                for earlier, later in pairwise(logged)
                if earlier["status"] == 429
            ],
        },
    )

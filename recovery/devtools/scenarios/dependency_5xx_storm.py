from __future__ import annotations

import time

from recovery_client.runtime import DEGRADED, CallResult

from recovery.devtools.scenarios.play import Play, exclusive_scenario

MAX_STORM_CALLS = 8  # failing lookups the storm makes at the most, waiting for the breaker to open


@exclusive_scenario(
    name="5xx-storm",
    title="5xx storm on order.lookup",
    pinned_end="breaker open, further attempts denied with degrade, task degraded",
)
def dependency_5xx_storm(play: Play) -> None:
    """503 on every lookup of one order: order.lookup's breaker opens, a further call is denied at admission with
    degrade and sends nothing, the task degrades, and after the cooldown a probe lookup of another order closes the
    breaker again. It runs alone: the breaker is shared by everyone who looks up orders."""
    order_id, route = play.order_route("storm", 1)
    healthy_order, _ = play.order_route("probe", 2)
    lookup = play.tool("order.lookup")
    # Scoped to this scenario's order: once the breaker has cooled down, anyone's lookup of another order succeeds.
    play.fault(route=route, kind="error", status=503, times=3 * MAX_STORM_CALLS)
    task_id = play.start(f"summarise order {order_id}")
    step, opened = _storm(play, task_id, lookup, order_id)
    sent_before = len(play.reads(route))
    step += 1
    denied = play.run_call(
        "denied", task_id, step=step, tool=lookup, key=play.key("lookup-denied"), arguments={"order_id": order_id}
    )
    sent_after = len(play.reads(route))
    refusal = denied.attempts[0] if denied.attempts else None
    detail = (refusal.required_next.get("detail") or {}) if refusal else {}
    cooldown_ms = refusal.required_next.get("after_ms", 0) if refusal else 0
    play.log(f"  the breaker cools down: {cooldown_ms / 1000:.1f} s, then a lookup of another order probes it")
    time.sleep(cooldown_ms / 1000 + 0.3)
    step += 1
    probe = play.run_call(
        "probe", task_id, step=step, tool=lookup, key=play.key("lookup-probe"), arguments={"order_id": healthy_order}
    )
    outcome = play.submit(task_id, "order status unavailable: a read-only summary from the fallback")

    seen = opened.attempts[-1].breaker_state if opened and opened.attempts else "never open"
    play.check("the breaker, as the storm left it", "open", seen)
    refused = f"{refusal.denied} → {refusal.required_next.get('action')}" if refusal and not refusal.admitted else "-"
    play.check("a further call at admission", "breaker_open → degrade", refused)
    play.check("the fallback it names", "read_only_summary", detail.get("fallback"))
    play.check("requests the refused call sent", 0, sent_after - sent_before)
    play.check("task outcome", "degraded", outcome)
    play.check("after the cooldown, a probe lookup", "COMMITTED", probe.state)
    play.check("the breaker after the probe", "closed", probe.sent[-1].breaker_state if probe.sent else "no probe")
    met = f"on storm call {step - 2}" if opened else "never"
    play.result.end = f"breaker opened {met}, then degrade; task {outcome}; closed again by a probe"


def _storm(play: Play, task_id: int, lookup: str, order_id: str) -> tuple[int, CallResult | None]:
    """Failing lookups until one ends on the fallback path: (the last step, that call's result or None)."""
    step, opened = 0, None
    # Each failing call spends its attempts; the breaker opens once the window holds enough failures (4 on the
    # drill registry, 10 on the shipped one), and the call that meets it ends on the fallback path.
    while step < MAX_STORM_CALLS and opened is None:
        step += 1
        key, arguments = play.key(f"lookup-{step}"), {"order_id": order_id}
        result = play.run_call(f"storm-{step}", task_id, step=step, tool=lookup, key=key, arguments=arguments)
        if result.outcome == DEGRADED:
            opened = result
    return step, opened

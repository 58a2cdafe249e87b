"""Dependency 5xx: every lookup is answered 503. Calls spend their attempts until the breaker opens, then are denied
at admission; after the cooldown, of four runtimes asking at once exactly one probe reaches the provider. The fault
is then cleared and the breaker closed again by a probe that succeeds (so later drills find it closed)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from django.utils import timezone
from recovery_client.runtime import CallResult

from recovery.audit.actions import AuditAction
from recovery.devtools.agent import Agent
from recovery.devtools.drills.checks import at_least, render
from recovery.devtools.drills.evidence import at
from recovery.devtools.drills.framework import Run, sleep_until
from recovery.models import Attempt, AuditEvent, Breaker, Tool
from recovery.registry.policy import breaker_policy

PROBERS = 4  # runtimes asking at once after the cooldown


def play(run: Run) -> None:
    tool = Tool.objects.get(name=run.stage.tool("order.lookup"))
    cooldown_s = breaker_policy(tool).cooldown_s
    left = _close_breaker(run, tool, cooldown_s)  # an earlier run may have left it open
    if left["probe"] is not None:
        run.log(f"  the breaker was left open by an earlier run: {render(left)}")
    run.sandbox.fault(route="/orders", method="GET", kind="error", status=503)
    agent = run.agent()
    task = agent.start_task(run.key("drill-5xx"), goal="look up orders while the order service fails")

    def lookup(runtime: Agent, label: str) -> CallResult:
        n = next(run.steps)
        arguments = {"order_id": run.order_id(n)}
        return run.call(runtime.run_call(task.id, step=n, tool=tool.name, key=_key(run, label), arguments=arguments))

    denied = _until_denied(lookup, agent)
    opened = list(
        AuditEvent.objects.filter(
            action=AuditAction.BREAKER_OPENED, created_at__gte=run.started, evidence__tool=tool.name
        )
    )
    for event in opened:
        run.log(f"  the breaker opened: {event.reason}")
    run.check(
        "the breaker opened",
        expected={"breaker.opened events": at_least(1)},
        observed={"breaker.opened events": len(opened)},
    )
    if not opened:
        return
    _check_refused_while_open(run, tool, cooldown_s, opened[0].created_at, denied)
    _check_one_probe(run, lookup)

    # The dependency recovers: the next probe after the cooldown closes the breaker (and clears its counts).
    run.sandbox.clear_faults()
    recovered = _close_breaker(run, tool, cooldown_s)
    run.log(f"  the service is back, after the cooldown: {render(recovered)}")
    run.check(
        "once the fault is gone, the next probe closes the breaker",
        expected={"probe": "COMMITTED", "breaker": "closed"},
        observed=recovered,
    )


def _key(run: Run, label: str) -> str:
    return run.key(f"lookup-5xx-{label}")


def _until_denied(lookup, agent: Agent) -> list[CallResult]:
    """Lookups until one is denied at its first admission (the breaker is open): that one, or none after eight."""
    for n in range(1, 9):
        result = lookup(agent, f"{n}")
        if result.attempts and not result.attempts[0].admitted:
            return [result]
    return []


def _check_refused_while_open(
    run: Run, tool: Tool, cooldown_s: float, opened_at: datetime, denied: list[CallResult]
) -> None:
    """A fresh call was denied at admission, and nothing reached the provider until the cooldown was over."""
    cool_until = opened_at + timedelta(seconds=cooldown_s)
    # Until the cooldown of its latest opening is over (on a slow machine a probe may already have reopened it).
    latest = Breaker.objects.get(tool=tool).opened_at or opened_at
    sleep_until(max(cool_until, latest + timedelta(seconds=cooldown_s)) + timedelta(seconds=0.3))
    reached = [entry for entry in _lookups(run) if opened_at < at(entry) < cool_until]
    told = next(end.told for end in run.drill.ends if end.told)
    run.check(
        "while open, admission refused before anything was sent",
        expected={"fresh calls denied": [{"reason": "breaker_open", "told": told}], "requests during the cooldown": 0},
        observed={
            "fresh calls denied": [
                {"reason": r.attempts[0].denied, "told": r.attempts[0].required_next.get("action")} for r in denied
            ],
            "requests during the cooldown": len(reached),
        },
    )


def _check_one_probe(run: Run, lookup) -> None:
    """After the cooldown, PROBERS runtimes at once: one admitted as the half-open probe, one request sent."""
    began = timezone.now()
    runtimes = [run.agent() for _ in range(PROBERS)]
    with ThreadPoolExecutor(PROBERS, thread_name_prefix="drill-prober") as pool:
        list(pool.map(lambda n: lookup(runtimes[n - 1], f"probe-{n}"), range(1, PROBERS + 1)))
    ended = timezone.now()
    keys = [_key(run, f"probe-{n}") for n in range(1, PROBERS + 1)]
    run.check(
        "after cooldown exactly one half-open probe reaches the provider",
        expected={"admitted as the probe": 1, "requests that reached the provider": 1},
        observed={
            "admitted as the probe": Attempt.objects.filter(call__idempotency_key__in=keys, breaker_probe=True).count(),
            "requests that reached the provider": sum(1 for entry in _lookups(run) if began <= at(entry) <= ended),
        },
    )


def _lookups(run: Run) -> list[dict]:
    return run.sandbox.requests(path_prefix="/orders/", method="GET")


def _close_breaker(run: Run, tool: Tool, cooldown_s: float) -> dict:
    """Bring the tool's breaker back to closed with one successful lookup after its cooldown (a half-open probe
    that succeeds closes it and clears its counts): the probe's state (None when none was needed) and the
    breaker's."""
    row = Breaker.objects.filter(tool=tool).first()
    if row is None or row.state == "closed":
        return {"probe": None, "breaker": "closed"}
    if row.state == "forced_open":
        raise RuntimeError(f"the breaker of {tool.name} was forced open by an operator; close it in the console")
    sleep_until((row.opened_at or timezone.now()) + timedelta(seconds=cooldown_s + 0.3))
    agent = run.agent(log=lambda line: None)
    task = agent.start_task(run.key(f"drill-breaker-{next(run.steps)}"), goal="probe the recovered service")
    n = next(run.steps)
    result = agent.run_call(
        task.id, step=1, tool=tool.name, key=run.key(f"lookup-recovered-{n}"), arguments={"order_id": run.order_id(n)}
    )
    agent.submit(task.id, f"lookup {result.state}")
    return {"probe": result.state, "breaker": Breaker.objects.get(tool=tool).state}

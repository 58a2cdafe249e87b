from __future__ import annotations

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.checks import contains
from recovery.devtools.scenarios.play import Play, scenario


@scenario(
    name="invalid-result",
    title="a lookup whose result fails validation",
    pinned_end="invalid_result, rejected, retried once, then COMMITTED",
)
def invalid_result(play: Play) -> None:
    """An order lookup whose first answer, a 200, lacks its status: classified invalid_result and rejected, the
    call is retried once, and the result the agent keeps is the second, whole one."""
    route, lookup, outcome = shared.lookup_task(play, kind="bad_result", drop=["status"], times=1)

    call = play.call(lookup.call_id)
    first = call["attempts"][0] if call["attempts"] else {}
    play.check("first answer classified", "invalid_result", first.get("failure_class"))
    play.check("first answer's route", "reject", (first.get("decision") or {}).get("route"))
    play.check("provider answers", ["bad_result", "answered"], [r["outcome"] for r in play.reads(route)])
    play.check("call state", "COMMITTED", call["state"])
    play.check("attempts made", 2, call["attempts_made"])
    play.check("the result the agent kept has a status", contains("status"), sorted(lookup.result or {}))
    play.check("task outcome", "completed", outcome)
    play.result.end = f"rejected once, {call['state']} on attempt {call['attempts_made']}"

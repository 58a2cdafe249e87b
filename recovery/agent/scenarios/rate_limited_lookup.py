from __future__ import annotations

from recovery.agent.scenarios import shared
from recovery.agent.scenarios.play import Play, scenario


@scenario(
    name="rate-limited-lookup",
    title="rate-limited lookup (429, Retry-After 2 s, twice)",
    pinned_end="COMMITTED, no attempt before its Retry-After",
)
def rate_limited_lookup(play: Play) -> None:
    """An order lookup answered 429 with Retry-After 2 s, twice: the console admits each new attempt only once its
    delay has passed, and the third attempt commits."""
    route, lookup, outcome = shared.lookup_task(play, kind="rate_limit", retry_after_s=2, times=2)

    call = play.call(lookup.call_id)
    requests = play.reads(route)
    play.check("call state", "COMMITTED", call["state"])
    play.check("provider answers", ["rate_limited", "rate_limited", "answered"], [r["outcome"] for r in requests])
    gaps = shared.gaps(requests)
    play.check("seconds between attempts", "each >= 2 (Retry-After)", gaps, bool(gaps) and min(gaps) >= 2.0)
    play.check("task outcome", "completed", outcome)
    play.result.end = f"{call['state']} on attempt {call['attempts_made']}, gaps {gaps} s"

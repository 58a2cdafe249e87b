from __future__ import annotations

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.checks import at_least, each
from recovery.devtools.scenarios.play import Play, scenario

RETRY_AFTER_S = 2  # what the provider's 429s say


@scenario(
    name="rate-limited-lookup",
    title="rate-limited lookup (429, Retry-After 2 s, twice)",
    pinned_end="COMMITTED, no attempt before its Retry-After",
)
def rate_limited_lookup(play: Play) -> None:
    """An order lookup answered 429 with Retry-After 2 s, twice: the console admits each new attempt only once its
    delay has passed, and the third attempt commits."""
    route, lookup, outcome = shared.lookup_task(play, kind="rate_limit", retry_after_s=RETRY_AFTER_S, times=2)

    call = play.call(lookup.call_id)
    requests = play.reads(route)
    play.check("call state", "COMMITTED", call["state"])
    play.check("provider answers", ["rate_limited", "rate_limited", "answered"], [r["outcome"] for r in requests])
    gaps = shared.gaps(requests)
    play.check("seconds between attempts", each(at_least(RETRY_AFTER_S, "Retry-After")), gaps)
    play.check("task outcome", "completed", outcome)
    play.result.end = f"{call['state']} on attempt {call['attempts_made']}, gaps {gaps} s"

"""Circuit breaker rules (docs/breakers.md) as pure functions over counts and time.

The shared storage (one PostgreSQL row per breaker, outcome counts per time bucket, a probe lease taken by a
conditional update) calls these; nothing here reads a clock or holds state, so every rule is testable with numbers.

- Only errors that say something about the dependency's health count: transient, outcome_unknown and any 5xx.
  Our own or the caller's mistakes (invalid_arguments, authentication, authorization, a read's invalid result, a
  permanent 4xx) are not counted either way, so a misbehaving agent cannot open a breaker for everyone else.
- The window is the last `window_s` seconds of whole buckets, the current bucket included.
- An open breaker past its cooldown reads half_open and admits `half_open_probes` probes, each reserved with a
  lease so a crashed prober's reservation expires; a forced_open breaker stays open until an operator lifts it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from recovery.engine.states import CallState as S
from recovery.engine.types import (
    CLOSED,
    FORCED_OPEN,
    HALF_OPEN,
    OPEN,
    OUTCOME_UNKNOWN,
    TRANSIENT,
    BreakerPolicy,
    BreakerView,
)

# An outcome that proves the dependency answered: COMMITTED (docs/design/classification.md row 10) or ACCEPTED (row 9).
_SUCCESSES = frozenset({S.COMMITTED, S.ACCEPTED, "9", "10"})


def counts_as_failure(outcome_row: str | None, failure_class: str | None, http_status: int | None) -> bool | None:
    """True: counts as a failure; False: counts as a success; None: not counted at all.

    `outcome_row` is the Outcome's state (COMMITTED, ACCEPTED, ...) or its docs/design/classification.md row ("9", "10",
    ...): either names a success. A 5xx counts as a failure whatever its class (a write's 5xx is outcome_unknown, a
    read's transient).
    """
    if http_status is not None and 500 <= http_status <= 599:
        return True
    if outcome_row in _SUCCESSES:
        return False
    if failure_class in (TRANSIENT, OUTCOME_UNKNOWN):
        return True
    return None


def bucket_start(now_epoch_s: float, policy: BreakerPolicy) -> int:
    """The start (epoch seconds) of the bucket `now` falls in."""
    return int(now_epoch_s // policy.bucket_s) * policy.bucket_s


def window_totals(
    buckets: Iterable[tuple[int, int, int]], policy: BreakerPolicy, now_epoch_s: float
) -> tuple[int, int]:
    """(calls, failures) over the sliding window, from (bucket start, successes, failures) rows.

    Buckets older than the window are ignored (storage may prune them lazily), and so are buckets after the current
    one: a process whose clock runs ahead must not count outcomes no one else can see yet.
    """
    current = bucket_start(now_epoch_s, policy)
    oldest_excluded = current - policy.window_s
    calls = failures = 0
    for start, successes, failed in buckets:
        if oldest_excluded < start <= current:
            calls += successes + failed
            failures += failed
    return calls, failures


def should_open(calls: int, failures: int, policy: BreakerPolicy) -> bool:
    """Whether a closed breaker opens: at least min_calls in the window and a failure rate at or above the threshold."""
    if calls <= 0 or calls < policy.min_calls:
        return False
    return failures / calls >= policy.failure_rate


def effective_state(
    state: str,
    opened_at_epoch_s: float | None,
    policy: BreakerPolicy,
    now_epoch_s: float,
    *,
    live_probes: int = 0,
) -> BreakerView:
    """The breaker as admission sees it now. `live_probes`: half-open probes reserved under an unexpired lease.

    An open breaker whose cooldown has passed reads half_open (the stored row changes only when a probe is
    reserved, by a conditional update); forced_open never decays.
    """
    if state == FORCED_OPEN:
        return BreakerView(state=FORCED_OPEN, probe_available=False, retry_in_ms=0)
    if state == OPEN:
        elapsed = now_epoch_s - opened_at_epoch_s if opened_at_epoch_s is not None else policy.cooldown_s
        if elapsed < policy.cooldown_s:
            return BreakerView(
                state=OPEN, probe_available=False, retry_in_ms=math.ceil((policy.cooldown_s - elapsed) * 1000)
            )
        return BreakerView(state=HALF_OPEN, probe_available=live_probes < policy.half_open_probes)
    if state == HALF_OPEN:
        return BreakerView(state=HALF_OPEN, probe_available=live_probes < policy.half_open_probes)
    return BreakerView(state=CLOSED)


def after_probe(success: bool) -> str:
    """A probe's success closes the breaker; its failure reopens it (with a fresh cooldown)."""
    return CLOSED if success else OPEN


def probe_lease_until(now_epoch_s: float, policy: BreakerPolicy) -> float:
    """When a probe reserved now stops holding its reservation."""
    return now_epoch_s + policy.probe_lease_s


def probe_lease_expired(lease_until_epoch_s: float | None, now_epoch_s: float) -> bool:
    """Whether a probe reservation has lapsed (its prober crashed or never reported), freeing the probe."""
    return lease_until_epoch_s is None or now_epoch_s >= lease_until_epoch_s

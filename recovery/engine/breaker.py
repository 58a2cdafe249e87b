"""Circuit breaker rules (docs/breakers.md) as pure functions over counts and time: the window, opening, cooldown,
leased half-open probes, and after_outcome(), the one step the storage (recovery.services.breakers) asks per outcome.
Which outcomes count is the classification's (recovery.engine.classify.counts_as_failure). No clock, no state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from recovery.engine.types import (
    CLOSED,
    FORCED_OPEN,
    HALF_OPEN,
    OPEN,
    BreakerPolicy,
    BreakerView,
)


def window_totals(
    buckets: Iterable[tuple[int, int, int]], policy: BreakerPolicy, now_epoch_s: float
) -> tuple[int, int]:
    """(calls, failures) over the sliding window, from (bucket start, successes, failures) rows.

    Buckets older than the window are ignored (storage may prune them lazily), and so are buckets after the current
    one: a process whose clock runs ahead must not count outcomes no one else can see yet.
    """
    current = policy.bucket_of(now_epoch_s)
    oldest_excluded = current - policy.window_s
    calls = failures = 0
    for start, successes, failed in buckets:
        if oldest_excluded < start <= current:
            calls += successes + failed
            failures += failed
    return calls, failures


def window_buckets(buckets: Iterable[tuple[int, int, int]], policy: BreakerPolicy, now_epoch_s: float) -> int:
    """How many buckets inside the window window_totals() counts hold an outcome: what every page calls the window's
    buckets (an empty row, or one outside the window, is none of them)."""
    current = policy.bucket_of(now_epoch_s)
    oldest_excluded = current - policy.window_s
    return sum(1 for start, successes, failed in buckets if oldest_excluded < start <= current and successes + failed)


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


# --- one outcome, as the storage asks about it ----------------------------------------------------------------------


@dataclass(frozen=True)
class BreakerRow:
    """A breaker's stored row as read, times in epoch seconds; state None: no row yet (it never opened: closed)."""

    state: str | None = None
    opened_at_s: float | None = None
    probes_reserved: int = 0
    lease_until_s: float | None = None


@dataclass(frozen=True)
class BreakerStep:
    """What one outcome does to a breaker: the state change to write (`to_state` "" : none) from `from_state`, its
    audit event (`event` "opened", "closed" or "reopened", with reason and evidence), whether the window's counts
    are dropped, and the breaker as admission reads it afterwards."""

    view: BreakerView
    from_state: str = ""
    to_state: str = ""
    event: str = ""
    reason: str = ""
    evidence: dict = field(default_factory=dict)
    reset_counts: bool = False


def view_of_row(row: BreakerRow, policy: BreakerPolicy, now_epoch_s: float) -> BreakerView:
    """The effective state of a stored row now: a probe whose lease ran out no longer holds its reservation."""
    if row.state is None:
        return BreakerView(state=CLOSED)
    live = 0 if probe_lease_expired(row.lease_until_s, now_epoch_s) else row.probes_reserved
    return effective_state(row.state, row.opened_at_s, policy, now_epoch_s, live_probes=live)


def after_outcome(
    row: BreakerRow,
    *,
    failed: bool | None,
    probe: bool,
    calls: int,
    failures: int,
    policy: BreakerPolicy,
    now_epoch_s: float,
) -> BreakerStep:
    """One outcome (counts_as_failure's verdict `failed`; None: not counted) on the breaker stored as `row`, the
    window's `calls` and `failures` counting it already.

    A probe's outcome closes (success) or reopens (failure) a half_open breaker; any other counted outcome opens a
    closed one once the window reaches min_calls at the failure rate. Nothing else moves it here: a forced_open
    breaker only moves by an operator, and an open one turns half_open when a probe is reserved.
    """
    if failed is not None and probe and row.state == HALF_OPEN:
        target = after_probe(not failed)
        word = "failed" if failed else "succeeded"
        return BreakerStep(
            view=view_of_row(BreakerRow(target, now_epoch_s), policy, now_epoch_s),
            from_state=HALF_OPEN,
            to_state=target,
            event="reopened" if failed else "closed",
            reason="the half-open probe failed: a new cooldown starts" if failed else "the half-open probe succeeded",
            evidence={"probe": word},
            # Counting starts afresh: the failures that opened it are still inside the window when the cooldown is
            # shorter than the window, and would reopen it on the next single failure.
            reset_counts=target == CLOSED,
        )
    if failed is not None and row.state in (None, CLOSED) and should_open(calls, failures, policy):
        return BreakerStep(
            view=view_of_row(BreakerRow(OPEN, now_epoch_s), policy, now_epoch_s),
            from_state=CLOSED,
            to_state=OPEN,
            event="opened",
            reason=(
                f"{failures} of {calls} calls failed in the last {policy.window_s} s "
                f"(opens at {policy.failure_rate:.0%} with at least {policy.min_calls} calls)"
            ),
            evidence={"calls": calls, "failures": failures, "window_s": policy.window_s},
        )
    return BreakerStep(view=view_of_row(row, policy, now_epoch_s))

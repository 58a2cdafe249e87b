"""Budgets and backoff (docs/design/budgets.md): the tighter scope wins (`tighter`), the retry delay with its jitter,
cap and Retry-After (`backoff_delay`), the deadline re-check before any wait (`fits_deadline`) and exhaustion.
"""

from __future__ import annotations

import random
from dataclasses import fields
from datetime import datetime, timedelta

from recovery.engine.types import BackoffPolicy, Budgets

# Above this exponent base * 2^n is far past any sane cap; bounding it keeps the float arithmetic finite.
_MAX_EXPONENT = 62

# Exhausted limits, in the order exhausted_limit() checks them.
MAX_ATTEMPTS = "max_attempts"
MAX_ROUNDS = "max_rounds"
DEADLINE = "deadline"
TOKEN_BUDGET = "token_budget"
WRITE_RETRY = "write_retry"
LIMITS = (MAX_ATTEMPTS, MAX_ROUNDS, DEADLINE, TOKEN_BUDGET, WRITE_RETRY)


def tighter(*scopes: Budgets) -> Budgets:
    """The tighter of several scopes, field by field: the smallest limit, the earliest deadline; None = unlimited."""
    merged = {}
    for f in fields(Budgets):
        values = [getattr(scope, f.name) for scope in scopes if getattr(scope, f.name) is not None]
        merged[f.name] = min(values) if values else None
    return Budgets(**merged)


def backoff_delay(attempt: int, policy: BackoffPolicy, *, retry_after_ms: int | None, rng: random.Random) -> int:
    """Milliseconds to wait after failed attempt number `attempt` (1-based). Deterministic for a seeded rng."""
    if retry_after_ms is not None:
        return max(0, retry_after_ms)
    exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
    delay = max(0, policy.base_ms) * 2**exponent
    if policy.jitter == "proportional":
        jittered = delay * rng.uniform(0.8, 1.2)
    elif policy.jitter == "full":
        jittered = rng.uniform(0, delay)
    else:
        raise ValueError(f"unknown jitter {policy.jitter!r}: expected 'proportional' or 'full'")
    return max(0, min(policy.cap_ms, round(jittered)))


def remaining_ms(*, now: datetime, deadline: datetime | None) -> int | None:
    """Milliseconds left before the deadline (negative when past it); None when there is no deadline."""
    if deadline is None:
        return None
    return int((deadline - now) / timedelta(milliseconds=1))


def fits_deadline(*, now: datetime, deadline: datetime | None, wait_ms: int, call_estimate_ms: int) -> bool:
    """Whether a wait of `wait_ms` followed by one call of `call_estimate_ms` still ends by the deadline."""
    if deadline is None:
        return True
    return now + timedelta(milliseconds=max(0, wait_ms) + max(0, call_estimate_ms)) <= deadline


def exhausted_limit(
    *,
    budgets: Budgets,
    attempts_made: int,
    rounds_used: int,
    tokens_used: int,
    is_write: bool,
    write_retries_used: int,
    now: datetime,
    call_estimate_ms: int = 0,
    wait_ms: int = 0,
) -> str | None:
    """The first limit of LIMITS that leaves no budget for one more attempt, or None when there is budget.

    `budgets` is already the tighter of the scopes. A write's retry is any attempt after its first, and write_retry
    counts the task's write retries (TaskView.write_retries_used). The deadline must hold `wait_ms` plus one call.
    """
    if budgets.max_attempts is not None and attempts_made >= budgets.max_attempts:
        return MAX_ATTEMPTS
    if budgets.max_rounds is not None and rounds_used >= budgets.max_rounds:
        return MAX_ROUNDS
    if not fits_deadline(now=now, deadline=budgets.deadline, wait_ms=wait_ms, call_estimate_ms=call_estimate_ms):
        return DEADLINE
    if budgets.token_budget is not None and tokens_used >= budgets.token_budget:
        return TOKEN_BUDGET
    is_retry = attempts_made >= 1
    if is_write and is_retry and budgets.write_retry is not None and write_retries_used >= budgets.write_retry:
        return WRITE_RETRY
    return None

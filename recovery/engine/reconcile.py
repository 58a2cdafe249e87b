"""Where a call goes after a receipt, and when it is checked next (docs/reconciliation.md,
docs/design/state-machine.md): `settle()` decides from the call's state, what the provider said and the tool's
ReconcilePolicy; `next_check()` says when a call that stays unsettled is checked again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from recovery.engine.states import RECONCILABLE
from recovery.engine.states import CallState as S


class Observation(StrEnum):
    """What a receipt observed (a status query, a callback, a runtime's own 2xx)."""

    COMMITTED = "committed"  # the provider has the effect
    NOT_COMMITTED = "not_committed"  # the provider confirms it never executed (or gave up)
    PENDING = "pending"  # the provider is still working on it
    FAILED = "failed"  # the query failed (5xx, timeout): nothing learned
    AMBIGUOUS = "ambiguous"  # an answer we cannot map: nothing learned
    UNREACHABLE = "unreachable"  # skipped: the status endpoint's breaker is open


LEARNED_NOTHING = frozenset({Observation.FAILED, Observation.AMBIGUOUS, Observation.UNREACHABLE})


@dataclass(frozen=True, kw_only=True)
class ReconcilePolicy:
    """A tool's reconciliation schedule (the registry's `reconcile`): the one place its defaults live."""

    first_check_s: int = 5  # after a write turns UNKNOWN (or ACCEPTED), when its first status check is due
    backoff: float = 2  # each check after the first waits this many times longer than the one before
    max_checks: int | None = None  # the poll budget: past it, a person decides (None: no budget)
    deadline_s: int | None = None  # from the attempt's sending: past it, a person decides (None: no deadline)
    max_interval_s: int = 3600  # checks are never further apart than this
    min_interval_s: int = 1  # nor closer together, whatever the schedule says
    replay_when_status_down: bool = False  # replay reconciliation (docs/replay.md), for a tool a probe proved safe

    def deadline(self, started_at: datetime | None) -> datetime | None:
        return started_at + timedelta(seconds=self.deadline_s) if self.deadline_s and started_at else None


@dataclass(frozen=True, kw_only=True)
class StatusBreakerPolicy:
    """The breaker of a provider's status endpoint (the registry's provider `status_breaker`, docs/reconciliation.md):
    over a fixed window of `window_s`, at `min_calls` checks with `failure_rate` of them failed, it opens; checks are
    skipped for `cooldown_s`, then one probe goes through. The one place its defaults live."""

    window_s: int = 60
    min_calls: int = 5
    failure_rate: float = 0.5
    cooldown_s: int = 30


def next_check(policy: ReconcilePolicy, *, checks: int, now: datetime, started_at: datetime | None) -> datetime:
    """When a call still unsettled after `checks` checks is checked again: the schedule's backoff, capped, never
    later than the deadline."""
    # A first check at once (first_check_s 0) still backs off from the minimum interval afterwards.
    base = max(policy.first_check_s, policy.min_interval_s)
    delay = min(base * policy.backoff ** max(checks - 1, 0), policy.max_interval_s)
    due = now + timedelta(seconds=max(delay, policy.min_interval_s))
    deadline = policy.deadline(started_at)
    return min(due, deadline) if deadline else due


@dataclass(frozen=True)
class Settlement:
    """A receipt's consequence: the states the call passes through, in order (none: it stays), the outcome to
    record, and why (for the transitions' reason)."""

    steps: tuple[S, ...] = ()
    outcome: str = ""
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class ReceiptView:
    """What settle() reads of a receipt and of the call it is about."""

    state: S
    observed: Observation
    effects: int | None  # business effects the provider counts for the key, when it says
    from_callback: bool  # a provider's signed callback (it may come before the runtime's report)
    checks: int  # status checks made, this one included
    attempts_made: int
    max_attempts: int | None  # None: no limit
    max_effects: int | None  # the tool's max_business_effects
    has_status_api: bool
    started_at: datetime | None  # when the attempt was sent (the deadline counts from it)
    now: datetime


def settle(receipt: ReceiptView, policy: ReconcilePolicy) -> Settlement:
    """Where docs/design/state-machine.md/docs/reconciliation.md send the call for this receipt."""
    state, observed = receipt.state, receipt.observed
    limit = receipt.max_effects
    excess = observed == Observation.COMMITTED and limit is not None and (receipt.effects or 0) > limit
    if excess and state in (*RECONCILABLE, S.COMMITTED):
        why = f"the provider reports {receipt.effects} business effects for this key (at most {limit} allowed)"
        return Settlement((S.HUMAN_REVIEW,), "duplicate_effect", why)
    if state == S.SENT and observed == Observation.COMMITTED and receipt.from_callback:
        return Settlement((S.COMMITTED,))  # the provider's signed word can come before the runtime's report
    if state not in RECONCILABLE:
        return Settlement()  # kept as evidence: the call was settled (or is still in flight) when this came
    steps, outcome = _moves(receipt)
    if observed == Observation.AMBIGUOUS and not receipt.has_status_api and state != S.ACCEPTED:
        return Settlement((*steps, S.HUMAN_REVIEW), "no_status_api", "the tool has no status API")
    final = steps[-1] if steps else state
    if final in RECONCILABLE:
        deadline = policy.deadline(receipt.started_at)
        if policy.max_checks is not None and receipt.checks >= policy.max_checks:
            why = f"{receipt.checks} of {policy.max_checks} checks made"
            return Settlement(_to_review(steps, final), "poll_budget_exhausted", why)
        if deadline is not None and receipt.now >= deadline:
            why = f"the deadline {deadline.isoformat()} passed"
            return Settlement(_to_review(steps, final), "deadline_exceeded", why)
    return Settlement(steps, outcome)


def _moves(receipt: ReceiptView) -> tuple[tuple[S, ...], str]:
    """The table of docs/reconciliation.md for a reconcilable call: (states to pass through, outcome)."""
    state, observed = receipt.state, receipt.observed
    if state == S.ACCEPTED:
        if observed == Observation.COMMITTED:
            return (S.COMMITTED,), ""
        if observed == Observation.NOT_COMMITTED:
            return (S.FAILED_PERMANENT,), "provider_gave_up"
        return ((S.UNKNOWN,), "") if observed in LEARNED_NOTHING else ((), "")
    if observed == Observation.COMMITTED:
        return (S.COMMITTED,), ""
    if observed == Observation.NOT_COMMITTED:
        if receipt.max_attempts is None or receipt.attempts_made < receipt.max_attempts:
            return (S.NOT_COMMITTED, S.RETRYABLE), ""  # a same-key retry may go, admitted with state_verified
        return (S.NOT_COMMITTED, S.FAILED_PERMANENT), "retry_exhausted"
    if observed in LEARNED_NOTHING and state == S.UNKNOWN:
        return (S.STILL_UNKNOWN,), ""
    return (), ""


def _to_review(steps: tuple[S, ...], final: S) -> tuple[S, ...]:
    return (*steps, *((S.UNKNOWN,) if final == S.ACCEPTED else ()), S.HUMAN_REVIEW)

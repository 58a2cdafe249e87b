"""The breaker of each provider's status endpoint (docs/reconciliation.md): reconciliation
backs off a status API that keeps failing, separately from the provider's tools and their breakers. No lock is held
across an HTTP request: a check asks before and records after, each in its own short statement or transaction.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.reconcile import StatusBreakerPolicy
from recovery.models import BreakerState, Provider, StatusBreaker
from recovery.registry.policy import status_breaker_policy

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
GO, PROBE, SKIP = "go", "probe", "skip"  # what status_breaker_allows() says a check may do


def status_breaker_allows(provider: Provider, *, now: datetime) -> str:
    """May a status query go to `provider` now? GO (closed), PROBE (this caller won the one probe past an open
    breaker's cooldown) or SKIP."""
    row = StatusBreaker.objects.filter(provider=provider).values_list("state", "opened_at", "probe_until").first()
    if row is None or row[0] == CLOSED:
        return GO
    state, opened_at, probe_until = row
    policy = status_breaker_policy(provider)
    lease = now + timedelta(seconds=max(policy.cooldown_s, 5))
    if state == OPEN:
        if opened_at is not None and now < opened_at + timedelta(seconds=policy.cooldown_s):
            return SKIP
        # The first caller past the cooldown takes the probe: the WHERE names the row it read.
        mine = StatusBreaker.objects.filter(provider=provider, state=OPEN, opened_at=opened_at)
        return PROBE if mine.update(state=HALF_OPEN, probe_until=lease, updated_at=now) else SKIP
    if probe_until is not None and now < probe_until:
        return SKIP  # half_open with a live probe out
    stale = StatusBreaker.objects.filter(provider=provider, state=HALF_OPEN, probe_until=probe_until)
    # The probe's lease expired (its prober crashed): another one may go.
    return PROBE if stale.update(probe_until=lease, updated_at=now) else SKIP


def status_breaker_record(provider: Provider, *, failed: bool, now: datetime, count: int = 1) -> str:
    """Count `count` status queries that all failed or all succeeded; returns the breaker's state after them."""
    policy = status_breaker_policy(provider)
    window_start = now - timedelta(seconds=policy.window_s)
    if not failed:
        # The common case in one statement: a success on a closed breaker (its window rolled when expired).
        counted = StatusBreaker.objects.filter(
            provider=provider, state=CLOSED, window_started_at__gt=window_start
        ).update(calls=F("calls") + count, updated_at=now)
        if counted:
            return CLOSED
    with transaction.atomic():
        StatusBreaker.objects.get_or_create(provider=provider, defaults={"window_started_at": now, "updated_at": now})
        row = StatusBreaker.objects.select_for_update().get(provider=provider)
        before = row.state
        if row.state == HALF_OPEN:
            row.state = OPEN if failed else CLOSED
            row.opened_at = now if failed else None
            row.probe_until, row.calls, row.failures, row.window_started_at = None, 0, 0, now
        elif row.state == CLOSED:
            if row.window_started_at <= window_start:
                row.calls, row.failures, row.window_started_at = 0, 0, now
            row.calls += count
            row.failures += count if failed else 0
            if row.calls >= policy.min_calls and row.failures >= policy.failure_rate * row.calls:
                row.state, row.opened_at = OPEN, now
        row.updated_at = now
        row.save()
        if row.state != before:
            _audit(provider, before, row, policy)
    return row.state


def _audit(provider: Provider, before: str, row: StatusBreaker, policy: StatusBreakerPolicy) -> None:
    if row.state == OPEN and before == CLOSED:
        reason = (
            f"{row.failures} of {row.calls} status queries failed in {policy.window_s} s: checks are skipped "
            f"for {policy.cooldown_s} s"
        )
    elif row.state == OPEN:
        reason = "the probe status query failed: a new cooldown starts"
    else:
        reason = "the probe status query succeeded"
    append_event(
        action=AuditAction.STATUS_BREAKER_OPENED if row.state == OPEN else AuditAction.STATUS_BREAKER_CLOSED,
        actor=Actor.job("reconcile"),
        from_state=before,
        to_state=row.state,
        reason=reason,
        evidence={"provider": provider.name, "calls": row.calls, "failures": row.failures},
    )


class StatusBreakerGate:
    """The status breakers as one batch of checks sees them, shared by its threads: each provider's breaker asked
    once, failures recorded as they happen (one may open it: the rest of the batch is skipped), successes counted in
    one UPDATE by flush() at the end. A batch that finds a breaker past its cooldown sends exactly one probe."""

    def __init__(self):
        self.lock, self.verdict, self.successes = threading.Lock(), {}, {}

    def ask(self, provider: Provider, now: datetime) -> str:
        with self.lock:
            if provider.pk not in self.verdict:
                self.verdict[provider.pk] = status_breaker_allows(provider, now=now)
            verdict = self.verdict[provider.pk]
            if verdict == PROBE:
                self.verdict[provider.pk] = SKIP  # the probe is this check; the others wait for its result
            return verdict

    def record(self, provider: Provider, *, failed: bool, probe: bool) -> None:
        if failed or probe:
            state = status_breaker_record(provider, failed=failed, now=timezone.now())
            with self.lock:
                if state == OPEN:
                    self.verdict[provider.pk] = SKIP
            return
        with self.lock:
            self.successes[provider.pk] = (provider, self.successes.get(provider.pk, (provider, 0))[1] + 1)

    def flush(self) -> None:
        for provider, count in self.successes.values():
            status_breaker_record(provider, failed=False, now=timezone.now(), count=count)

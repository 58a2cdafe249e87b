"""Circuit breakers shared by every process (docs/breakers.md): storage around the pure rules of
recovery.engine.breaker.

One Breaker row per tool holds the state, created lazily the first time the breaker opens (no row reads closed).
Outcome counts live in BreakerBucket rows, one per tool and `bucket_s`, bumped by an upsert that never touches the
Breaker row, so recording an outcome on a closed breaker is two statements and, called outside a transaction, holds
the bucket's row lock only for its own statement. Every state change is a conditional UPDATE whose WHERE names the
state it leaves: of any number of processes that see the same failure rate, exactly one moves the breaker and
writes its audit event. No function holds a row lock beyond its own short transaction, let alone a provider call.

Statements per function (each an upper bound, independent of traffic):
- breaker_view (recovery.selectors.breakers): 1 SELECT.
- breaker_reserve_probe: 1 UPDATE.
- breaker_record: 2 while nothing changes (the bucket upsert, one SELECT of the state with the window's sums),
  +1 DELETE of buckets that left the window on the first outcome of each new bucket; a state change adds its
  UPDATE (and an INSERT for a breaker's first opening, or a DELETE of the counts when a probe closes it) plus the
  audit append (4 statements, 6 on a new chain). An uncounted outcome (None) is 1 SELECT.

Lock order: the bucket and breaker rows before the audit heads (like recovery.statemachine.transitions: conditional
UPDATE, then the audit row). So reserve a probe before appending audit events in the same transaction, and record an
outcome outside any transaction that has already appended audit events (or holds them to its end): a caller
that takes the audit heads first and then the bucket row, racing one that does the opposite, deadlocks.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Case, F, Q, Value, When

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine import breaker as rules
from recovery.engine.types import CLOSED, HALF_OPEN, OPEN, BreakerPolicy, BreakerView
from recovery.models import Breaker, BreakerBucket, Tool
from recovery.registry.policy import breaker_policy
from recovery.selectors.breakers import breaker_view, view_of_state

# Raw SQL (docs/architecture.md, the data layer), on the path of every outcome: the bucket upsert adds to a counter,
# which the ORM cannot say (its conflict update sets columns, it does not add to them); the state and the window's sums
# are read with it in one statement; a first opening inserts the row unless a concurrent opener did.

_BUCKET = BreakerBucket._meta.db_table
_COUNT = (
    f"INSERT INTO {_BUCKET} (tool_id, bucket_start, successes, failures) VALUES (%s, %s, %s, %s) "
    f"ON CONFLICT (tool_id, bucket_start) DO UPDATE SET successes = {_BUCKET}.successes + excluded.successes, "
    f"failures = {_BUCKET}.failures + excluded.failures "
    "RETURNING successes + failures"
)
_BREAKER = Breaker._meta.db_table
_CREATE = (
    f"INSERT INTO {_BREAKER} (tool_id, state, opened_at, probes_reserved, probe_lease_until, updated_at) "
    "VALUES (%s, %s, %s, 0, NULL, %s) ON CONFLICT (tool_id) DO NOTHING"
)


def breaker_create(tool_id: int, state: str, *, now: datetime) -> bool:
    """The first row of a tool's breaker, in `state` (opened now); False when a concurrent writer created it first
    (its caller then moves the existing row by a conditional UPDATE). One INSERT … ON CONFLICT DO NOTHING: raw SQL,
    because the ORM's bulk_create(ignore_conflicts=True) does not say whether the row was inserted."""
    with connection.cursor() as cursor:
        stamp = connection.ops.adapt_datetimefield_value(now)
        cursor.execute(_CREATE, [tool_id, state, stamp, stamp])
        return bool(cursor.rowcount)


def breaker_reserve_probe(tool: Tool, *, now: datetime, policy: BreakerPolicy | None = None) -> bool:
    """Reserve one half-open probe until now + probe_lease_s; False when none is free. One conditional UPDATE.

    It succeeds on a half_open breaker with fewer than half_open_probes reserved under an unexpired lease, or on an
    open one past its cooldown (which it turns half_open). Concurrent reservers queue on the row and each
    re-checks the WHERE against the row its predecessor left, so exactly half_open_probes of them win. The lease
    is one per breaker and each reservation extends it; once it has expired (its probers crashed or never
    reported) the count starts again from this reservation.
    """
    policy = policy or breaker_policy(tool)
    now_s = now.timestamp()
    cooled_before = now - timedelta(seconds=policy.cooldown_s)
    lease_until = datetime.fromtimestamp(rules.probe_lease_until(now_s, policy), tz=UTC)
    half_open_live = Q(state=HALF_OPEN, probe_lease_until__gt=now)
    cooled_open = Q(state=OPEN) & (Q(opened_at__isnull=True) | Q(opened_at__lte=cooled_before))
    lease_expired = Q(probe_lease_until__isnull=True) | Q(probe_lease_until__lte=now)
    has_room = lease_expired | Q(probes_reserved__lt=policy.half_open_probes)
    return bool(
        Breaker.objects.filter(Q(tool_id=tool.pk) & (cooled_open | (Q(state=HALF_OPEN) & has_room))).update(
            state=HALF_OPEN,
            # SET reads the row as it was: an open breaker or an expired lease starts counting again at 1.
            probes_reserved=Case(When(half_open_live, then=F("probes_reserved") + 1), default=Value(1)),
            probe_lease_until=lease_until,
            updated_at=now,
        )
    )


def breaker_record(
    tool: Tool,
    *,
    counts_as_failure: bool | None,
    probe: bool,
    now: datetime,
    policy: BreakerPolicy | None = None,
    actor: Actor | None = None,
) -> BreakerView:
    """Count one outcome (engine.breaker.counts_as_failure's answer) and apply docs/breakers.md; returns the breaker
    after it.

    None counts nothing (a probe's reservation then stays until its lease expires). A probe's outcome closes or
    reopens a half_open breaker; any other outcome can open a closed one when the window reaches min_calls at the
    failure rate. `actor` is who the audit event names (default `system:breaker`).
    """
    policy = policy or breaker_policy(tool)
    if counts_as_failure is None:
        return breaker_view(tool, now=now, policy=policy)
    actor = actor or Actor.system("breaker")
    current = rules.bucket_start(now.timestamp(), policy)
    _count(tool, current, failed=counts_as_failure, policy=policy)
    if probe:
        view = _finish_probe(tool, success=not counts_as_failure, now=now, policy=policy, actor=actor)
        if view is not None:
            return view
        # Not half_open any more (another probe settled it first): an ordinary outcome from here on.
    row = _state_and_window(tool, current, policy)
    state, calls, failures = row[0], row[4], row[5]
    if state in (None, CLOSED) and rules.should_open(calls, failures, policy):
        exists = state is not None
        if _trip(tool, row_exists=exists, calls=calls, failures=failures, now=now, policy=policy, actor=actor):
            return view_of_state((OPEN, now, 0, None), policy, now)
        return breaker_view(tool, now=now, policy=policy)  # another process opened it first: read what it wrote
    return view_of_state(row, policy, now)


def _count(tool: Tool, current: int, *, failed: bool, policy: BreakerPolicy) -> None:
    """Add the outcome to the current bucket; the first outcome of a bucket also prunes the ones outside the window."""
    with connection.cursor() as cursor:
        cursor.execute(_COUNT, [tool.pk, current, 0 if failed else 1, 1 if failed else 0])
        (total,) = cursor.fetchall()[0]
    if total == 1:  # this outcome created the bucket: at most once per tool and bucket_s
        # _raw_delete: one DELETE, without the BEGIN/COMMIT that QuerySet.delete() wraps around it in autocommit.
        BreakerBucket.objects.filter(tool_id=tool.pk, bucket_start__lte=current - policy.window_s)._raw_delete(
            connection.alias
        )


_WINDOW_SUM = (
    f"COALESCE((SELECT SUM({{}}) FROM {_BUCKET} u WHERE u.tool_id = t.id AND u.bucket_start > %s "
    "AND u.bucket_start <= %s), 0)"
)
_STATE_AND_WINDOW = (
    "SELECT b.state, b.opened_at, b.probes_reserved, b.probe_lease_until, "
    f"{_WINDOW_SUM.format('u.successes + u.failures')}, {_WINDOW_SUM.format('u.failures')} "
    f"FROM {Tool._meta.db_table} t LEFT JOIN {_BREAKER} b ON b.tool_id = t.id WHERE t.id = %s"
)


def _aware(value: datetime | str | None) -> datetime | None:
    """A timestamp column read with raw SQL: PostgreSQL gives an aware datetime, SQLite the text Django stored (UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def _state_and_window(tool: Tool, current: int, policy: BreakerPolicy) -> tuple:
    """(state, opened_at, probes_reserved, probe_lease_until, calls, failures) in one SELECT; state None: no row.

    The window is engine.breaker.window_totals' one: whole buckets after `current - window_s`, up to `current`.
    Raw SQL like the bucket upsert: this runs on every outcome, and building it with the ORM cost several times
    what the statement itself does.
    """
    start = current - policy.window_s
    with connection.cursor() as cursor:
        cursor.execute(_STATE_AND_WINDOW, [start, current, start, current, tool.pk])
        row = cursor.fetchone()
    if row is None:
        raise Tool.DoesNotExist(f"no tool with id {tool.pk}")
    state, opened_at, probes_reserved, lease_until, calls, failures = row
    return (state, _aware(opened_at), probes_reserved, _aware(lease_until), int(calls), int(failures))


def _trip(
    tool: Tool, *, row_exists: bool, calls: int, failures: int, now: datetime, policy: BreakerPolicy, actor: Actor
) -> bool:
    """closed -> open; True for the one process that made the change (and wrote its audit event)."""
    closed = Breaker.objects.filter(tool_id=tool.pk, state=CLOSED)
    with transaction.atomic():
        won = 0
        if not row_exists:
            won = breaker_create(tool.pk, OPEN, now=now)
        if not won:  # the row exists (or a concurrent opener just created it): only a closed breaker opens
            won = closed.update(state=OPEN, opened_at=now, probes_reserved=0, probe_lease_until=None, updated_at=now)
        if won:
            append_event(
                action=AuditAction.BREAKER_OPENED,
                actor=actor,
                from_state=CLOSED,
                to_state=OPEN,
                reason=(
                    f"{failures} of {calls} calls failed in the last {policy.window_s} s "
                    f"(opens at {policy.failure_rate:.0%} with at least {policy.min_calls} calls)"
                ),
                evidence={"tool": tool.name, "calls": calls, "failures": failures, "window_s": policy.window_s},
            )
    return bool(won)


def _finish_probe(
    tool: Tool, *, success: bool, now: datetime, policy: BreakerPolicy, actor: Actor
) -> BreakerView | None:
    """half_open -> closed (success) or open (failure); None when the breaker was not half_open any more."""
    target = rules.after_probe(success)
    with transaction.atomic():
        moved = Breaker.objects.filter(tool_id=tool.pk, state=HALF_OPEN).update(
            state=target,
            opened_at=None if target == CLOSED else now,
            probes_reserved=0,
            probe_lease_until=None,
            updated_at=now,
        )
        if not moved:
            return None
        if target == CLOSED:
            # Counting starts afresh: the failures that opened it are still inside the window when the cooldown is
            # shorter than the window, and would reopen it on the next single failure.
            BreakerBucket.objects.filter(tool_id=tool.pk)._raw_delete(connection.alias)
        append_event(
            action=AuditAction.BREAKER_CLOSED if target == CLOSED else AuditAction.BREAKER_REOPENED,
            actor=actor,
            from_state=HALF_OPEN,
            to_state=target,
            reason="the half-open probe succeeded" if success else "the half-open probe failed: a new cooldown starts",
            evidence={"tool": tool.name, "probe": "succeeded" if success else "failed"},
        )
    return view_of_state((target, now, 0, None), policy, now)


def breaker_release_probe(tool: Tool, *, now: datetime) -> None:
    """Give back a reserved probe whose attempt was never made (its admission lost a race). One conditional UPDATE."""
    Breaker.objects.filter(tool_id=tool.pk, state=HALF_OPEN, probes_reserved__gt=0).update(
        probes_reserved=F("probes_reserved") - 1, updated_at=now
    )

"""Circuit breakers shared by every process: the rows around the pure rules of recovery.engine.breaker.

breaker_record() is the one bookkeeping call per outcome: count, read once, ask the rules once, write once.
How it counts, locks and races is docs/breakers.md ("How an outcome moves a breaker").
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Case, F, Q, Value, When

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine import breaker as rules
from recovery.engine.types import HALF_OPEN, OPEN, BreakerPolicy, BreakerView
from recovery.models import Breaker, BreakerBucket, Tool
from recovery.registry.policy import breaker_policy
from recovery.selectors.breakers import breaker_view
from recovery.statemachine.notices import notice_breaker_opened

# Raw SQL (docs/architecture.md, the data layer), on the path of every outcome: the bucket upsert adds to a counter,
# which the ORM cannot say (its conflict update sets columns, it does not add to them); the state and the window's sums
# are read in one statement; a first opening inserts the row unless a concurrent opener did.

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
    """Count one outcome (engine.breaker.counts_as_failure's verdict; None counts nothing) and move the breaker as
    engine.breaker.after_outcome says; the breaker after it. `actor`: who the audit event names (`system:breaker`).

    The count first (outside any transaction), then one read of the row with the window, one step of the rules,
    one conditional write. A write that finds the breaker moved by another process writes nothing; the breaker is
    read again and, the probe settled by the other, the outcome counts as an ordinary one.
    """
    policy = policy or breaker_policy(tool)
    actor = actor or Actor.system("breaker")
    current, counted = None, None
    if counts_as_failure is not None:
        current = policy.bucket_of(now.timestamp())
        counted = _count_and_read(tool, current, failed=counts_as_failure, policy=policy)
    for _ in range(_ROUNDS):
        row, calls, failures = counted or _read(tool, current, policy)
        counted = None  # a second round reads again
        step = rules.after_outcome(
            row,
            failed=counts_as_failure,
            probe=probe,
            calls=calls,
            failures=failures,
            policy=policy,
            now_epoch_s=now.timestamp(),
        )
        if not step.to_state or _write(tool, step, row_exists=row.state is not None, now=now, actor=actor):
            return step.view
        probe = False
    return breaker_view(tool, now=now, policy=policy)  # moved under us twice: read what the last writer wrote


# A probe's write lost to another probe, then an opening lost to another opener: at most two rounds.
_ROUNDS = 2


def _count_and_read(
    tool: Tool, current: int, *, failed: bool, policy: BreakerPolicy
) -> tuple[rules.BreakerRow, int, int] | None:
    """_count, and on PostgreSQL _read's answer with it, in one statement (None elsewhere: read it next)."""
    if connection.vendor != "postgresql":
        _count(tool, current, failed=failed, policy=policy)
        return None
    start = current - policy.window_s
    with connection.cursor() as cursor:
        window = [start, current, current]
        # raw SQL: the count and the read in one statement (docs/benchmarks.md, the protected benchmark's fourth round)
        cursor.execute(
            _COUNT_AND_READ, [tool.pk, current, 0 if failed else 1, 1 if failed else 0, *window, *window, tool.pk]
        )
        state, opened_at, probes_reserved, lease_until, calls, failures, total = cursor.fetchone()
    _prune(tool, current, total, policy)
    row = rules.BreakerRow(state, _epoch(opened_at), probes_reserved or 0, _epoch(lease_until))
    return row, int(calls), int(failures)


def _count(tool: Tool, current: int, *, failed: bool, policy: BreakerPolicy) -> None:
    """Add the outcome to the current bucket; the first outcome of a bucket also prunes the ones outside the window."""
    with connection.cursor() as cursor:
        cursor.execute(_COUNT, [tool.pk, current, 0 if failed else 1, 1 if failed else 0])
        (total,) = cursor.fetchall()[0]
    _prune(tool, current, total, policy)


def _prune(tool: Tool, current: int, total: int, policy: BreakerPolicy) -> None:
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
_STATE_FIELDS = ("state", "opened_at", "probes_reserved", "probe_lease_until")
# The count and the read in one statement (PostgreSQL, every counted outcome): the statement does not see its own
# upsert, so the window's sums leave the current bucket out and add it as the upsert returned it.
_OTHER_BUCKETS_SUM = (
    f"COALESCE((SELECT SUM({{}}) FROM {_BUCKET} u WHERE u.tool_id = t.id AND u.bucket_start > %s "
    "AND u.bucket_start <= %s AND u.bucket_start <> %s), 0)"
)
_COUNT_AND_READ = (
    f"WITH counted AS ({_COUNT.removesuffix('RETURNING successes + failures')}RETURNING successes, failures) "
    "SELECT b.state, b.opened_at, b.probes_reserved, b.probe_lease_until, "
    f"{_OTHER_BUCKETS_SUM.format('u.successes + u.failures')} + (SELECT successes + failures FROM counted), "
    f"{_OTHER_BUCKETS_SUM.format('u.failures')} + (SELECT failures FROM counted), "
    "(SELECT successes + failures FROM counted) "
    f"FROM {Tool._meta.db_table} t LEFT JOIN {_BREAKER} b ON b.tool_id = t.id WHERE t.id = %s"
)


def _aware(value: datetime | str | None) -> datetime | None:
    """A timestamp column read with raw SQL: PostgreSQL gives an aware datetime, SQLite the text Django stored (UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _read(tool: Tool, current: int | None, policy: BreakerPolicy) -> tuple[rules.BreakerRow, int, int]:
    """The stored row and the window's (calls, failures), in one SELECT; an uncounted outcome (`current` None)
    reads the row alone."""
    if current is None:
        found = Breaker.objects.filter(tool_id=tool.pk).values_list(*_STATE_FIELDS).first()
        state, opened_at, probes_reserved, lease_until = found or (None, None, 0, None)
        calls = failures = 0
    else:
        state, opened_at, probes_reserved, lease_until, calls, failures = _state_and_window(tool, current, policy)
    return rules.BreakerRow(state, _epoch(opened_at), probes_reserved or 0, _epoch(lease_until)), calls, failures


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


_EVENTS = {
    "opened": AuditAction.BREAKER_OPENED,
    "closed": AuditAction.BREAKER_CLOSED,
    "reopened": AuditAction.BREAKER_REOPENED,
}


def _write(tool: Tool, step: rules.BreakerStep, *, row_exists: bool, now: datetime, actor: Actor) -> bool:
    """The step's state change and its audit event, in one short transaction; False, writing nothing, when the
    breaker is not in `step.from_state` any more (another process moved it first). A first opening inserts the
    row; of concurrent openers exactly one inserts it or moves it."""
    with transaction.atomic():
        won = not row_exists and breaker_create(tool.pk, step.to_state, now=now)
        if not won:  # the row exists (or a concurrent opener just created it): only the state read is left
            won = Breaker.objects.filter(tool_id=tool.pk, state=step.from_state).update(
                state=step.to_state,
                opened_at=now if step.to_state == OPEN else None,
                probes_reserved=0,
                probe_lease_until=None,
                updated_at=now,
            )
        if not won:
            return False
        if step.reset_counts:
            BreakerBucket.objects.filter(tool_id=tool.pk)._raw_delete(connection.alias)
        append_event(
            action=_EVENTS[step.event],
            actor=actor,
            from_state=step.from_state,
            to_state=step.to_state,
            reason=step.reason,
            evidence={"tool": tool.name, **step.evidence},
        )
        if step.to_state == OPEN:
            notice_breaker_opened(tool.pk, tool.name, forced=False, reason=step.event)
    return True


def breaker_release_probe(tool: Tool, *, now: datetime) -> None:
    """Give back a reserved probe whose attempt was never made (its admission lost a race). One conditional UPDATE."""
    Breaker.objects.filter(tool_id=tool.pk, state=HALF_OPEN, probes_reserved__gt=0).update(
        probes_reserved=F("probes_reserved") - 1, updated_at=now
    )

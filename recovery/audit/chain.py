"""The tamper-evident audit trail (docs/design/audit.md): append, verify, and the recorded maintenance switch.

Each event links to the one before it in its chain ("task:<id>" or "system") and takes a gap-free global `seq`;
appending locks the global head, then the chain's, to the end of the caller's transaction (one lock order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet, signals
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.queue import Queue
from recovery.audit.signing import Keyring, event_hash, hash_of
from recovery.engine.canonical import normalize
from recovery.models import ActorKind, AuditChainHead, AuditEvent
from recovery.statemachine import dbguards
from recovery.statemachine.field_values import pipeline, prepared

GLOBAL = "global"
SYSTEM_CHAIN = "system"


@dataclass(frozen=True, kw_only=True)
class Actor:
    """Who did it: a person, an agent runtime's token, a background job or the system."""

    kind: str
    label: str
    user_id: int | None = None
    token_id: int | None = None

    @classmethod
    def for_user(cls, user) -> Actor:
        return cls(kind=ActorKind.USER, label=f"user:{user.get_username()}", user_id=user.pk)

    @classmethod
    def for_token(cls, token) -> Actor:
        return cls(kind=ActorKind.TOKEN, label=f"token:{token.name}", token_id=token.pk)

    @classmethod
    def job(cls, name: str) -> Actor:
        return cls(kind=ActorKind.JOB, label=f"job:{name}")

    @classmethod
    def system(cls, name: str) -> Actor:
        return cls(kind=ActorKind.SYSTEM, label=f"system:{name}")


def chain_key(task_id: int | None) -> str:
    return f"task:{task_id}" if task_id else SYSTEM_CHAIN


# Raw SQL (docs/architecture.md, the data layer: the audit head advance and the multi-row event insert): a head is
# locked and read in one statement, and a transaction's events go in with one INSERT whose ids were taken with the
# global head's lock — what the ORM cannot say, on the path of every write.
_HEADS = AuditChainHead._meta.db_table
_EVENTS = AuditEvent._meta.db_table
_CREATE_HEAD = (
    f"INSERT INTO {_HEADS} (key, length, head_hash, updated_at) VALUES (%s, 0, '', %s) ON CONFLICT (key) DO NOTHING"
)


def _ids_sql(ids: int) -> str:
    """A column of `ids` event ids taken from the events' sequence (uncorrelated: evaluated once per statement)."""
    return f", (SELECT array_agg(nextval(pg_get_serial_sequence('{_EVENTS}', 'id'))) FROM generate_series(1, {ids}))"


def _lock(cursor, key: str, now: datetime) -> tuple[int, str, int | None]:
    """Lock one head row and read it: (length, head hash, head event id). A head is created on a chain's first event;
    the caller moves it forward once the events it counts exist (the trigger checks that). SQLite: the transaction
    already holds the database's write lock (BEGIN IMMEDIATE)."""
    lock = " FOR UPDATE" if cursor.db.vendor == "postgresql" else ""
    sql = f"SELECT length, head_hash, head_event_id FROM {_HEADS} WHERE key = %s{lock}"
    cursor.execute(sql, [key])
    row = cursor.fetchone()
    if row is None:
        # A concurrent creator of the same head waits on the unique key and then finds the row.
        cursor.execute(_CREATE_HEAD, [key, now])
        cursor.execute(sql, [key])
        row = cursor.fetchone()
    return int(row[0]), row[1], row[2]


def _lock_heads(cursor, chains: list[str], now: datetime, *, ids: int) -> tuple[dict[str, list], list[int]]:
    """Lock the global head, then each of `chains`' heads, and read them ({key: [length, hash, event id]}), with
    `ids` event ids taken. On PostgreSQL in one statement: FOR UPDATE locks rows in its ORDER BY's order, so the
    global head is locked first, as one at a time would (the one lock order); a head missing (a chain's first
    event) is created, the global one first, and the heads read again. The ids are taken once."""
    keys = [GLOBAL, *chains]
    if cursor.db.vendor != "postgresql":
        return {key: list(_lock(cursor, key, now)) for key in keys}, []
    listed = ", ".join(["%s"] * len(keys))
    sql = f"SELECT key, length, head_hash, head_event_id{{}} FROM {_HEADS} WHERE key IN ({listed})"
    sql += " ORDER BY key <> %s, key FOR UPDATE"
    # raw SQL: one statement for every head, where one per head cost a statement per audited write (docs/benchmarks.md,
    # the protected benchmark's third round)
    cursor.execute(sql.format(_ids_sql(ids) if ids else ""), [*keys, GLOBAL])
    rows = cursor.fetchall()
    taken = sorted(rows[0][4]) if ids and rows else []
    heads = {row[0]: [int(row[1]), row[2], row[3]] for row in rows}
    if len(heads) < len(keys):
        # raw SQL, the same statements' first-event path (docs/benchmarks.md, the protected benchmark's third round)
        if GLOBAL not in heads:  # nothing is locked yet: the global head made and locked first (the one lock order)
            _lock(cursor, GLOBAL, now)
        for key in chains:
            if key not in heads:
                cursor.execute(_CREATE_HEAD, [key, now])
        cursor.execute(sql.format(""), [*keys, GLOBAL])
        heads = {row[0]: [int(row[1]), row[2], row[3]] for row in cursor.fetchall()}
        if ids and not taken:  # the global head itself was missing: its first run returned no row to carry them
            cursor.execute(f"SELECT 1{_ids_sql(ids)}")
            taken = sorted(cursor.fetchone()[1])
    return heads, taken


# Per database alias, the queue of the appends_at_commit() block open (None outside any such block).
_QUEUED: ContextVar[dict[str, Queue] | None] = ContextVar("recovery_audit_queued", default=None)


def append_event(
    *,
    action: str,
    actor: Actor,
    task_id: int | None = None,
    call_id: int | None = None,
    from_state: str = "",
    to_state: str = "",
    reason: str = "",
    evidence: dict | None = None,
    using: str = "default",
) -> AuditEvent | None:
    """Append one event to its task's chain. Must run inside the transaction whose change it records.

    Inside appends_at_commit() the event is queued, stamped now, and appended when that block ends: None then.
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        raise RuntimeError("append_event() must run inside transaction.atomic(), with the change it records")
    fields = dict(
        task_id=task_id,
        call_id=call_id,
        actor_kind=str(actor.kind),
        actor_label=actor.label,
        actor_user_id=actor.user_id,
        actor_token_id=actor.token_id,
        action=action,
        from_state=str(from_state),
        to_state=str(to_state),
        reason=reason,
        evidence=normalize(evidence or {}),
        created_at=timezone.now(),
    )
    queue = (_QUEUED.get() or {}).get(using)
    if queue is not None:
        queue.add(fields)
        return None
    return _append(using, fields)


def _append(using: str, fields: dict) -> AuditEvent:
    return _append_all(using, [fields])[-1]


def _append_all(using: str, queued: list[dict]) -> list[AuditEvent]:
    """Append `queued` (append_event's fields, in order) in one go: the global head, then each chain's head, locked
    once (the one lock order: global first), every event inserted, then every head moved to its last event in one
    UPDATE. On PostgreSQL that is 3 statements in 2 round trips, whatever the number of events and chains (the heads
    locked in one, the ids taken with them, so one INSERT carries every event, each linking to the one before; the
    INSERT and the UPDATE leave together in psycopg's pipeline, their answers awaited once)."""
    connection = connections[using]
    now, keyring = queued[-1]["created_at"], Keyring.from_settings()
    chains = [chain_key(fields["task_id"]) for fields in queued]
    reserved = connection.vendor == "postgresql"  # the events' ids taken with the heads' lock
    with connection.cursor() as cursor:
        heads, ids = _lock_heads(cursor, list(dict.fromkeys(chains)), now, ids=len(queued) if reserved else 0)
        length = heads.pop(GLOBAL)[0]
        tails = heads
        events = []
        for position, (fields, chain) in enumerate(zip(queued, chains, strict=True)):
            tail = tails[chain]
            fields = dict(fields, seq=length + position + 1, chain=chain, chain_seq=tail[0] + 1, prev_hash=tail[1])
            digest = event_hash(**fields)
            event = AuditEvent(
                prev_id=tail[2], hash=digest, key_id=keyring.signing_id, hmac=keyring.sign(digest), **fields
            )
            if reserved:
                event.pk = ids[position]
            else:  # one at a time: the next event of the chain links to this one's id
                _insert(cursor, [event], using)
            tail[:] = [fields["chain_seq"], digest, event.pk]
            events.append(event)
        moved = {chain: (number, digest, pk) for chain, (number, digest, pk) in tails.items()}
        moved[GLOBAL] = (length + len(events), events[-1].hash, events[-1].pk)
        with pipeline(connection) if reserved else nullcontext():
            if reserved:
                _insert(cursor, events, using)
            # raw SQL: every head moved in one UPDATE (docs/benchmarks.md, the protected benchmark's third round)
            cursor.execute(*_move_heads(moved, now))
    return events


def _move_heads(moved: dict[str, tuple[int, str, int]], now: datetime) -> tuple[str, list]:
    """One UPDATE setting each head's length, hash and event (the trigger refuses a head past its events)."""
    keys = list(moved)
    cases = {column: " ".join(["WHEN %s THEN %s"] * len(keys)) for column in ("length", "head_hash", "head_event_id")}
    sql = (
        f"UPDATE {_HEADS} SET length = CASE key {cases['length']} END, head_hash = CASE key {cases['head_hash']} END, "
        f"head_event_id = CASE key {cases['head_event_id']} END, updated_at = %s "
        f"WHERE key IN ({', '.join(['%s'] * len(keys))})"
    )
    params: list = []
    for column in range(3):
        for key in keys:
            params += [key, moved[key][column]]
    return sql, [*params, now, *keys]


_EVENT_FIELDS = tuple(field for field in AuditEvent._meta.concrete_fields if not field.primary_key)
_COLUMNS = ", ".join(field.column for field in _EVENT_FIELDS)


def _insert(cursor, events: list[AuditEvent], using: str) -> None:
    """`events`' INSERT, each value prepared by its field as the ORM does: one statement for all of them when their
    ids were taken already, else one event with its id returned. Through the ORM when someone listens to saves."""
    connection = connections[using]
    if signals.pre_save.has_listeners(AuditEvent) or signals.post_save.has_listeners(AuditEvent):
        for event in events:
            event.save(using=using, force_insert=True)  # someone listens: go through the ORM
        return
    with_ids = events[0].pk is not None
    fields = ((AuditEvent._meta.pk,) if with_ids else ()) + _EVENT_FIELDS
    row = f"({', '.join(['%s'] * len(fields))})"
    sql = f"INSERT INTO {_EVENTS} ({'id, ' if with_ids else ''}{_COLUMNS}) VALUES {', '.join([row] * len(events))}"
    values = [value for event in events for value in prepared(event, fields, connection, pre_save=False)]
    if with_ids:
        cursor.execute(sql, values)
    elif connection.features.can_return_columns_from_insert:
        cursor.execute(sql + " RETURNING id", values)
        (events[0].pk,) = cursor.fetchone()
    else:
        cursor.execute(sql, values)
        events[0].pk = connection.ops.last_insert_id(cursor, _EVENTS, "id")
    for event in events:
        event._state.adding, event._state.db = False, using


@contextmanager
def appends_at_commit(using: str = "default") -> Iterator[None]:
    """Queue the events appended inside this block and append them, in order, when it ends without an error.

    Appending locks the global head to the end of the transaction: open this right inside it (`with
    transaction.atomic(), appends_at_commit():`) so the heads are held for the appends and the commit only. Sequence
    and chain numbers are taken at the end, after the rows the work changed (the one lock order); each event keeps
    the time it was appended at. A nested block leaves the appending to the outermost; append_event() answers None.

    The rule: an event is appended only with its change. Should code inside catch an error that rolled back a
    savepoint holding queued events and go on, the block raises RuntimeError instead (the transaction rolls back).
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        raise RuntimeError("appends_at_commit() must run inside transaction.atomic()")
    queued = _QUEUED.get() or {}
    if using in queued:
        yield
        return
    queue = Queue()
    reset = _QUEUED.set({**queued, using: queue})
    try:
        with connection.execute_wrapper(queue.watch):
            yield
    finally:
        _QUEUED.reset(reset)
    if undone := queue.undone():
        raise RuntimeError(
            f"appends_at_commit(): {undone} audit event(s) were queued in a savepoint that was rolled back, and the "
            "error was caught inside the block: their change is undone, so nothing is appended (let it propagate)"
        )
    if queue.events:
        _append_all(using, queue.events)


@contextmanager
def audit_maintenance(
    *, reason: str, actor: Actor, evidence: dict | None = None, using: str = "default"
) -> Iterator[None]:
    """The documented maintenance switch: lets this transaction UPDATE or DELETE audit rows (retention, tests).

    Its use is recorded as an `audit.maintenance` event before the switch turns on, in the same transaction, so
    the record cannot be skipped and is itself chained. Removing rows by hand leaves gaps verify_audit reports;
    retention goes through `audit_purge_chains`, whose record names what it removed.
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        raise RuntimeError("audit_maintenance() must run inside transaction.atomic()")
    if not reason.strip():
        raise ValueError("audit_maintenance() needs a reason")
    append_event(action=AuditAction.AUDIT_MAINTENANCE, actor=actor, reason=reason, evidence=evidence, using=using)
    dbguards.set_maintenance(connection, True, local=True)
    try:
        yield
    finally:
        dbguards.set_maintenance(connection, False, local=True)


def _ranges(numbers: list[int]) -> list[list[int]]:
    ranges: list[list[int]] = []
    for n in sorted(numbers):
        if ranges and ranges[-1][1] == n - 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    return ranges


def audit_purge_chains(*, chains: list[str], reason: str, actor: Actor, using: str = "default") -> int:
    """Retention: remove whole chains (events and heads) under the maintenance switch; returns events removed. The
    maintenance record (in the system chain, never purged) lists what went, so verify_audit tells it from tampering."""
    if SYSTEM_CHAIN in chains or GLOBAL in chains:
        raise ValueError("the system chain and the global sequence are never purged")
    events = AuditEvent.objects.using(using).filter(chain__in=chains)
    seqs = list(events.values_list("seq", flat=True))
    evidence = {"purged_chains": sorted(chains), "purged_seqs": _ranges(seqs)}
    with audit_maintenance(reason=reason, actor=actor, evidence=evidence, using=using):
        AuditChainHead.objects.using(using).filter(key__in=chains).delete()
        events._raw_delete(using)  # one DELETE; Collector-based delete would trip over the self-referencing FK
    return len(seqs)


def _purge_records(using: str):
    return AuditEvent.objects.using(using).filter(action=AuditAction.AUDIT_MAINTENANCE, evidence__has_key="purged_seqs")


def purged_ranges(using: str = "default") -> list[tuple[int, int]]:
    """The global sequence numbers recorded purges removed, as sorted (first, last) ranges."""
    evidences = _purge_records(using).values_list("evidence", flat=True)
    return sorted((start, end) for evidence in evidences for start, end in evidence["purged_seqs"])


def purged_chains(using: str = "default") -> set[str]:
    """The chains recorded purges removed whole."""
    evidences = _purge_records(using).values_list("evidence", flat=True)
    return {chain for evidence in evidences for chain in evidence.get("purged_chains", [])}


def _covered(start: int, end: int, purged: list[tuple[int, int]]) -> bool:
    """Is every number in [start, end] inside a recorded purge?"""
    position = start
    for low, high in purged:
        if low <= position <= high:
            position = high + 1
        if position > end:
            return True
    return position > end


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    events: int
    chains: int
    problem: str | None
    unkeyed: int = 0  # events written before RECOVERY_AUDIT_KEYS existed: hash-chained, not keyed

    @property
    def ok(self) -> bool:
        return self.problem is None


def keyset_pages(rows: QuerySet, after: Callable[[Any], Q], *, size: int) -> Iterator[Any]:
    """The rows of an ordered queryset, `size` at a time, each page its own query past the last row (`after(row)`):
    no server-side cursor held across pages (PgBouncer's transaction pooling cannot carry one), no whole result."""
    page = rows
    while True:
        chunk = list(page[:size])
        yield from chunk
        if len(chunk) < size:
            return
        page = rows.filter(after(chunk[-1]))


def _verify_global(using: str) -> tuple[int, str | None]:
    head = AuditChainHead.objects.using(using).filter(key=GLOBAL).first()
    purged = purged_ranges(using)
    count = last_seq = 0
    last_hash, first_keyed = "", None
    rows = AuditEvent.objects.using(using).order_by("seq").values_list("seq", "hash", "hmac")
    for seq, hash_, mac in keyset_pages(rows, lambda row: Q(seq__gt=row[0]), size=5000):
        count += 1
        if seq != last_seq + 1 and not _covered(last_seq + 1, seq - 1, purged):
            return count, f"global sequence gap: event #{last_seq + 1} is missing (next present is #{seq})"
        if mac:
            first_keyed = first_keyed or seq
        elif first_keyed is not None:
            # Keys, once configured, sign every event: an unkeyed one after a keyed one had its HMAC stripped.
            return count, f"event #{seq} carries no HMAC although event #{first_keyed} before it does: stripped"
        last_seq, last_hash = seq, hash_
    length = head.length if head else 0
    if length != last_seq and not _covered(last_seq + 1, length, purged):
        return count, f"global sequence ends at #{last_seq} but the head says #{length}: the tail was removed"
    if head and length == last_seq and head.head_hash != last_hash:
        return count, f"the last event #{last_seq} is not the one the global head recorded"
    return count, None


def _check_heads(batch: list[tuple[str, int, str, int]], using: str) -> str | None:
    heads = {h.key: h for h in AuditChainHead.objects.using(using).filter(key__in=[chain for chain, *_ in batch])}
    for chain, length, last_hash, last_id in batch:
        head = heads.get(chain)
        if head is None:
            return f"chain {chain} has events but no head"
        if head.length != length:
            return f"chain {chain} ends at #{length} but its head says #{head.length}: the tail was removed"
        if head.head_hash != last_hash or head.head_event_id != last_id:
            return f"chain {chain}: the last event #{length} is not the one its head recorded"
    return None


def _chain_problem(event: AuditEvent, expected_seq: int, prev: AuditEvent | None, keyring: Keyring) -> str | None:
    where = f"chain {event.chain} event #{event.chain_seq} (seq {event.seq})"
    if event.chain_seq != expected_seq:
        return f"chain {event.chain}: event #{expected_seq} is missing (next present is #{event.chain_seq})"
    if event.prev_hash != (prev.hash if prev else "") or event.prev_id != (prev.pk if prev else None):
        return f"{where} does not link to the event before it"
    if hash_of(event) != event.hash:
        return f"{where} does not match its hash: its content was edited"
    if not event.hmac:
        if prev is not None and prev.hmac:
            return f"{where} carries no HMAC although the event before it does: its key was stripped"
        return None
    signed = keyring.check(event.hash, event.key_id, event.hmac)
    if signed is None:
        return f"{where} is signed with audit key {event.key_id!r}, which RECOVERY_AUDIT_KEYS does not hold"
    if not signed:
        return f"{where} does not match its HMAC (key {event.key_id!r}): rewritten by someone without the audit key"
    return None


def verify_events(events, using: str = "default") -> tuple[int, int, str | None, int]:
    """Walk events ordered by (chain, chain_seq); compare each finished chain with its head. Returns (events,
    chains, the first problem or None, how many events were unkeyed)."""
    count = chains = unkeyed = 0
    keyring = Keyring.from_settings()
    prev: AuditEvent | None = None
    batch: list[tuple[str, int, str, int]] = []
    for event in events:
        count += 1
        unkeyed += not event.hmac
        if prev is None or event.chain != prev.chain:
            if prev is not None:
                batch.append((prev.chain, prev.chain_seq, prev.hash, prev.pk))
            chains += 1
            prev = None
        problem = _chain_problem(event, (prev.chain_seq + 1) if prev else 1, prev, keyring)
        if problem:
            return count, chains, problem, unkeyed
        prev = event
        if len(batch) >= 500:
            problem = _check_heads(batch, using)
            if problem:
                return count, chains, problem, unkeyed
            batch = []
    if prev is not None:
        batch.append((prev.chain, prev.chain_seq, prev.hash, prev.pk))
    return count, chains, _check_heads(batch, using) if batch else None, unkeyed


def verify_chain(key: str, using: str = "default", *, events: list[AuditEvent] | None = None) -> AuditReport:
    """One chain; `events`: the chain's events already read in order (a page that shows them verifies what it
    shows, with one more statement for the head instead of a second read)."""
    if events is None:
        chain = AuditEvent.objects.using(using).filter(chain=key).order_by("chain_seq")
        events = keyset_pages(chain, lambda event: Q(chain_seq__gt=event.chain_seq), size=2000)
    count, chains, problem, unkeyed = verify_events(events, using)
    if problem is None and count == 0 and AuditChainHead.objects.using(using).filter(key=key, length__gt=0).exists():
        problem = f"chain {key} has a head but no events: they were removed"
    return AuditReport(events=count, chains=chains, problem=problem, unkeyed=unkeyed)


def verify_all(using: str = "default") -> AuditReport:
    total, problem = _verify_global(using)
    if problem:
        return AuditReport(events=total, chains=0, problem=problem)
    events = keyset_pages(
        AuditEvent.objects.using(using).order_by("chain", "chain_seq"),
        lambda e: Q(chain__gt=e.chain) | Q(chain=e.chain, chain_seq__gt=e.chain_seq),
        size=5000,
    )
    count, chains, problem, unkeyed = verify_events(events, using)
    if problem is None:
        orphan = (
            AuditChainHead.objects.using(using)
            .exclude(key=GLOBAL)
            .filter(length__gt=0)
            .exclude(Exists(AuditEvent.objects.using(using).filter(chain=OuterRef("key"))))
            .first()
        )
        if orphan:
            problem = f"chain {orphan.key} has a head but no events: they were removed"
    return AuditReport(events=count, chains=chains, problem=problem, unkeyed=unkeyed)


def verify_in_one_snapshot(scope: str, using: str = "default") -> AuditReport:
    """verify_all() (scope "all") or verify_chain(scope) on one snapshot of the database.

    The check reads the events, then the chain heads, in separate statements. Under PostgreSQL's default READ
    COMMITTED each statement sees the latest commits, so an event appended between the two reads would show as a
    head ahead of its chain — "the tail was removed" on a healthy, busy trail. REPEATABLE READ (raw SQL: the ORM has
    no word for it) makes every statement see the snapshot of the first one. Only at the outermost level: inside a
    caller's transaction the isolation is already fixed, and the caller sees its own consistent state.
    """
    connection = connections[using]
    outermost = not connection.in_atomic_block
    with transaction.atomic(using=using):
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return verify_all(using) if scope == "all" else verify_chain(scope, using)

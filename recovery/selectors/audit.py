"""Reads of the audit trail (docs/design/audit.md): a search page by keyset on `seq`, and an export's rows as a stream.
Every filter is an equality, a range or a left-anchored LIKE on one column, so one of AuditEvent's indexes serves it;
a page is one statement of at most 51 rows that counts nothing and never uses OFFSET.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet

from recovery.models import AuditEvent

PAGE_SIZE = 50
EXPORT_CHUNK = 2000

# What a search page shows of each event (a flat dict per row: no model instances, no lookups after the statement).
PAGE_COLUMNS = (
    "seq", "created_at", "actor_kind", "actor_label", "action", "from_state", "to_state", "task_id", "call_id",
    "reason", "evidence", "call__tool__name", "call__idempotency_key", "task__external_id", "task__agent",
    "actor_user__username", "actor_token__name",
)  # fmt: skip
# Everything an auditor needs to recompute each event's hash (recovery.audit.chain.event_hash covers every field from
# `seq` on, `prev_hash` included) and to check the links (`prev_id` names the row before it in its chain).
EXPORT_COLUMNS = (
    "seq", "chain", "chain_seq", "id", "prev_id", "prev_hash", "hash", "task_id", "call_id", "actor_kind",
    "actor_label", "actor_user_id", "actor_token_id", "action", "from_state", "to_state", "reason", "evidence",
    "created_at",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Match:
    """A text filter: the whole value, or (prefix=True) every value that starts with it."""

    text: str
    prefix: bool = False


def match_of(raw: str, *, dot_is_prefix: bool = False) -> Match | None:
    """A filter as typed: a trailing "*" asks for a prefix ("user:a*"), and so, for actions, does a trailing "."
    ("call." — no action ends with a dot). None for nothing to filter by (an empty value, or "*" alone)."""
    text = raw.strip()
    prefix = text.endswith("*") or (dot_is_prefix and text.endswith("."))
    text = text.rstrip("*") if text.endswith("*") else text
    if not text:
        return None
    return Match(text=text, prefix=prefix)


@dataclass(frozen=True, kw_only=True)
class AuditFilters:
    """What a search shows, as the URL says it. Every field is optional; set ones all apply (AND)."""

    actor: Match | None = None
    actor_kind: str = ""
    action: Match | None = None
    task_id: int | None = None
    call_id: int | None = None
    since: datetime | None = None  # created_at >= since
    until: datetime | None = None  # created_at < until
    before: int | None = None  # keyset cursor: the `seq` of the last row on the previous (newer) page
    after: int | None = None  # keyset cursor the other way: the `seq` of the first row on the next (older) page

    @property
    def any(self) -> bool:
        return any((self.actor, self.actor_kind, self.action, self.task_id, self.call_id, self.since, self.until))


@dataclass(frozen=True, kw_only=True)
class AuditPage:
    rows: list[dict]  # newest first, whichever way the page was read
    older: int | None  # the cursor of the next (older) page, or None on the last page
    newer: int | None = None  # the cursor of the previous (newer) page, or None on the newest one


def _text(events: QuerySet, column: str, match: Match | None) -> QuerySet:
    if match is None:
        return events
    return events.filter(**{f"{column}__startswith" if match.prefix else column: match.text})


def _filtered(filters: AuditFilters) -> QuerySet:
    events = AuditEvent.objects.all()
    if filters.task_id is not None:
        events = events.filter(task_id=filters.task_id)
    if filters.call_id is not None:
        events = events.filter(call_id=filters.call_id)
    events = _text(events, "action", filters.action)
    events = _text(events, "actor_label", filters.actor)
    if filters.actor_kind:
        events = events.filter(actor_kind=filters.actor_kind)
    if filters.since is not None:
        events = events.filter(created_at__gte=filters.since)
    if filters.until is not None:
        events = events.filter(created_at__lt=filters.until)
    return events


def audit_page(filters: AuditFilters, *, size: int = PAGE_SIZE) -> AuditPage:
    """One page of matching events, newest first: one statement, the same on the first page and the thousandth.

    `before` reads down from its cursor and `after` up from its own. A page reached by a cursor has a neighbour on
    the cursor's side, since the cursor is a matching row's `seq`: the row it names is there (a hand-made cursor
    may name nothing, and then the page is empty and offers "Newest")."""
    events = _filtered(filters)
    if filters.after is not None:
        rows = list(events.filter(seq__gt=filters.after).order_by("seq").values(*PAGE_COLUMNS)[: size + 1])
        more = len(rows) > size
        rows = rows[:size][::-1]
        return AuditPage(rows=rows, older=rows[-1]["seq"] if rows else None, newer=rows[0]["seq"] if more else None)
    if filters.before is not None:
        events = events.filter(seq__lt=filters.before)
    rows = list(events.order_by("-seq").values(*PAGE_COLUMNS)[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return AuditPage(
        rows=rows,
        older=rows[-1]["seq"] if more else None,
        newer=rows[0]["seq"] if rows and filters.before is not None else None,
    )


def audit_export_rows(filters: AuditFilters, *, chunk_size: int = EXPORT_CHUNK) -> Iterator[dict]:
    """Every matching event, oldest first (`before` is ignored: an export is the whole match, not one page).

    Oldest first because that is how a trail is read and re-verified: a task's export is its chain in order, each
    row's `prev_hash` the `hash` of the row above it. Rows come `chunk_size` at a time, each chunk its own short
    keyset query (seq > the last one sent) rather than one cursor held open while a slow client downloads: no
    transaction or snapshot stays open for the length of the download. Nothing is skipped or repeated meanwhile —
    events are never changed, and a `seq` becomes visible only after every smaller one has committed or rolled
    back (appending holds the global counter's lock to commit) — and events committed during the download that
    match are included at the end.
    """
    events = _filtered(filters).order_by("seq").values(*EXPORT_COLUMNS)
    last = 0
    while True:
        chunk = list(events.filter(seq__gt=last)[:chunk_size])
        yield from chunk
        if len(chunk) < chunk_size:
            return
        last = chunk[-1]["seq"]

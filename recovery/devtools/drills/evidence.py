"""Reading what a drill left behind: the sandbox's request log times and the database's attempts, compensation
entries and audit trail."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from recovery.audit.actions import REQUEST_EVENTS, AuditAction
from recovery.models import Attempt, AuditEvent, CompensationEntry, Decision, GateDecision


def at(entry: dict) -> datetime:
    """A sandbox log entry's time (ISO 8601, UTC)."""
    return datetime.fromisoformat(entry["at"].replace("Z", "+00:00"))


def attempts(call_id: int | None) -> list[Attempt]:
    return list(Attempt.objects.filter(call_id=call_id).order_by("number"))


def chunks(ids: list[int], size: int = 500) -> Iterator[list[int]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def call_paths(ids: list[int]) -> dict[int, tuple[str, ...]]:
    """Each call's states after READY, in order, from its audit trail (the transitions, not the call row; its
    compensation entries' transitions, on the same call, are not the call's)."""
    paths: dict[int, list[str]] = {}
    for chunk in chunks(ids):
        events = (
            AuditEvent.objects.filter(call_id__in=chunk, action=AuditAction.CALL_TRANSITION)
            .exclude(from_state="")
            .exclude(to_state="")
            .order_by("seq")
            .values_list("call_id", "to_state")
        )
        for call_id, state in events:
            paths.setdefault(call_id, []).append(state)
    return {call_id: tuple(path) for call_id, path in paths.items()}


@dataclass(frozen=True, kw_only=True)
class EntryPath:
    """One compensation entry of a call: its number, its own key, and its states after pending, from the audit
    trail (the transitions, not the entry row)."""

    call_id: int
    number: int
    key: str
    path: tuple[str, ...]


def entry_paths(ids: list[int]) -> dict[int, list[EntryPath]]:
    """Each call's compensation entries, by number (an empty list for a call that has none)."""
    found: dict[int, list[EntryPath]] = {call_id: [] for call_id in ids}
    for chunk in chunks(ids):
        entries = CompensationEntry.objects.filter(call_id__in=chunk).order_by("call_id", "number")
        rows = list(entries.values_list("pk", "call_id", "number", "idempotency_key"))
        states: dict[int, list[str]] = {pk: [] for pk, *_ in rows}
        events = AuditEvent.objects.filter(call_id__in=chunk, action=AuditAction.COMPENSATION_TRANSITION)
        for evidence, state in events.order_by("seq").values_list("evidence", "to_state"):
            entry = evidence.get("compensation") if isinstance(evidence, dict) else None
            if entry in states:
                states[entry].append(state)
        for pk, call_id, number, key in rows:
            found[call_id].append(EntryPath(call_id=call_id, number=number, key=key, path=tuple(states[pk])))
    return found


def last_word(ids: list[int]) -> dict[int, str]:
    """What the console last told the runtime about each call: its latest admission answer ("admitted", or the
    denial's required_next action, e.g. "degrade") or decision card (its required_next action), whichever came last.
    Dry-run gate answers are left out: they are never acted on."""
    latest: dict[int, tuple[datetime, int, str]] = {}

    def heard(call_id: int, when: datetime, rank: int, said: str) -> None:
        # At the same instant a decision card (rank 1) follows the admission (rank 0) it answers.
        if call_id not in latest or (when, rank) >= latest[call_id][:2]:
            latest[call_id] = (when, rank, said)

    for chunk in chunks(ids):
        gates = GateDecision.objects.filter(call_id__in=chunk, dry_run=False).order_by("id")
        for call_id, when, allowed, required_next, reason in gates.values_list(
            "call_id", "created_at", "allowed", "required_next", "reason"
        ):
            heard(call_id, when, 0, "admitted" if allowed else (required_next or {}).get("action") or reason)
        cards = Decision.objects.filter(call_id__in=chunk).order_by("id")
        for call_id, when, required_next, route in cards.values_list("call_id", "created_at", "required_next", "route"):
            heard(call_id, when, 1, (required_next or {}).get("action") or route)
    return {call_id: word[2] for call_id, word in latest.items()}


def action_events(call_ids: list[int]) -> dict[int, list[str]]:
    """Each call's action events (action.previewed, action.approved, ...), in order, from the audit trail."""
    events: dict[int, list[str]] = {call_id: [] for call_id in call_ids}
    for chunk in chunks(call_ids):
        rows = AuditEvent.objects.filter(call_id__in=chunk, action__in=REQUEST_EVENTS).order_by("seq")
        for call_id, action in rows.values_list("call_id", "action"):
            events[call_id].append(action)
    return events

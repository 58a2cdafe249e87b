"""Reads of a call's compensation chain for the call and task pages (docs/compensation.md, docs/console.md).
A fixed number of statements, run even when there is nothing to read; `effect_story` never says "never created" of
an effect that was undone.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.engine.compensation_states import FINAL, EntryState
from recovery.engine.states import CallState
from recovery.models import CompensationAttempt, CompensationEntry, CompensationReceipt

S, E = CallState, EntryState


@dataclass(frozen=True, kw_only=True)
class ChainEntry:
    """One compensation entry with its attempts (by number) and receipts (oldest first)."""

    entry: CompensationEntry
    attempts: list[CompensationAttempt]
    receipts: list[CompensationReceipt]


@dataclass(frozen=True, kw_only=True)
class EffectStory:
    headline: str  # "created, then cancelled"
    detail: str  # "order.create O-1 created, then undone by order.cancel (compensation 1: committed)"


def call_compensations(call_id: int) -> list[ChainEntry]:
    """The call's entries (with their tools), attempts and receipts: three statements."""
    entries = list(CompensationEntry.objects.filter(call_id=call_id).select_related("tool").order_by("number"))
    attempts: dict[int, list[CompensationAttempt]] = {entry.pk: [] for entry in entries}
    receipts: dict[int, list[CompensationReceipt]] = {entry.pk: [] for entry in entries}
    for attempt in CompensationAttempt.objects.filter(entry__call_id=call_id).order_by("entry_id", "number"):
        attempts.setdefault(attempt.entry_id, []).append(attempt)
    for receipt in CompensationReceipt.objects.filter(entry__call_id=call_id).order_by("entry_id", "checked_at", "pk"):
        receipts.setdefault(receipt.entry_id, []).append(receipt)
    return [ChainEntry(entry=e, attempts=attempts[e.pk], receipts=receipts[e.pk]) for e in entries]


def task_compensations(task_id: int) -> dict[int, list[CompensationEntry]]:
    """Every entry of the task's calls (with its tool), by call id, each call's by number: one statement."""
    found: dict[int, list[CompensationEntry]] = {}
    entries = CompensationEntry.objects.filter(call__task_id=task_id).select_related("tool")
    for entry in entries.order_by("call_id", "number"):
        found.setdefault(entry.call_id, []).append(entry)
    return found


# --- the story ----------------------------------------------------------------------------------------------------

# Past participles a tool's verb (the last part of its name) does not make by the regular rule.
_IRREGULAR = {
    "cancel": "cancelled",
    "send": "sent",
    "pay": "paid",
    "stop": "stopped",
    "ship": "shipped",
    "set": "set",
    "put": "put",
    "make": "made",
    "give": "given",
    "take": "taken",
    "withdraw": "withdrawn",
}


def past(tool_name: str) -> str:
    """What a tool's effect is called once it happened, from the verb its name ends in ("order.create": "created");
    "" when the name does not end in a word."""
    verb = tool_name.rpartition(".")[2].lower()
    if not verb.isalpha() or not verb.isascii():
        return ""
    if verb in _IRREGULAR:
        return _IRREGULAR[verb]
    if verb.endswith("e"):
        return f"{verb}d"
    if verb.endswith("y") and len(verb) > 1 and verb[-2] not in "aeiou":
        return f"{verb[:-1]}ied"
    return f"{verb}ed"


def undo_word(tool_name: str) -> str:
    """What an undo is called once done: its verb's past ("order.cancel": "cancelled"), or, for a tool that creates
    the undo ("refund.create": a refund), the thing it creates ("refunded")."""
    service, _, verb = tool_name.rpartition(".")
    if verb == "create" and service:
        return past(service) or "undone"
    return past(tool_name) or "undone"


def effect_story(
    *, call_state: str, forward_tool: str, target: str, entries: list[CompensationEntry]
) -> EffectStory | None:
    """What became of the call's effect after its compensation: None when nothing was ever undone or tried.

    Read from the call's state while it is in a compensation state, else (the call moved on, to HUMAN_REVIEW) from
    its latest entry. `target` names the effect (the call's provider reference, or its key); `entries` are the
    call's, by number."""
    if not entries:
        return None
    latest = entries[-1]
    done = past(forward_tool) or "committed"
    undo_tool = latest.tool.name
    undone = undo_word(undo_tool)
    where = f"{forward_tool} {target}".strip()
    entry = f"compensation {latest.number}: {latest.state}{f', {latest.outcome}' if latest.outcome else ''}"
    state = call_state
    if state not in (S.COMPENSATING, S.COMPENSATED, S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED):
        state = _state_of(latest)
    if state == S.COMPENSATED:
        return EffectStory(
            headline=f"{done}, then {undone}", detail=f"{where} {done}, then undone by {undo_tool} ({entry})"
        )
    if state == S.PARTIAL_COMPENSATED:
        seen = f"{latest.effects_observed} of {latest.expected_effects}" if latest.effects_observed is not None else ""
        return EffectStory(
            headline=f"{done}, then partly {undone}",
            detail=f"{where} {done}, then only partly undone by {undo_tool}"
            f" ({entry}{f'; effects observed {seen}' if seen else ''}): less than expected was undone",
        )
    if state == S.COMPENSATION_FAILED:
        return EffectStory(
            headline=f"{done}, not {undone}: the undo failed",
            detail=f"{where} {done}; undoing it by {undo_tool} failed ({entry}): the effect still stands",
        )
    return EffectStory(
        headline=f"{done}; being undone", detail=f"{where} {done}; being undone by {undo_tool} ({entry})"
    )


def _state_of(latest: CompensationEntry) -> str:
    """The call's compensation as its latest entry says it, for a call that left the compensation states."""
    if latest.state not in FINAL:
        return S.COMPENSATING
    if latest.state == E.COMMITTED:
        partial = latest.effects_observed is not None and latest.effects_observed < latest.expected_effects
        return S.PARTIAL_COMPENSATED if partial else S.COMPENSATED
    return S.COMPENSATION_FAILED

"""The states of a compensation ledger entry and the only edges between them (docs/compensation.md), as data — like
recovery/engine/states.py for calls: `transitions.transition_entry` checks it and a migration generates the database
trigger from it (`dbguards.entry_guard_sql()`), so changing it needs a new migration (tests/test_compensations.py).
"""

from enum import StrEnum


class EntryState(StrEnum):
    PENDING = "pending"  # made, not sent yet: a worker sends it
    SENT = "sent"  # the compensation's request is in flight
    UNKNOWN = "unknown"  # sent, and no one knows yet whether it took effect: reconciled by its status query
    NOT_COMMITTED = "not_committed"  # the provider proved nothing happened: it may be sent again with its own key
    COMMITTED = "committed"  # the provider confirmed the undo (a reply, a receipt or an operator's evidence)
    FAILED = "failed"  # it did not and will not execute (refused, or no attempt left): nothing was undone
    REVIEW = "review"  # code cannot settle it: a person decides with the evidence


E = EntryState

_EDGES: dict[EntryState, dict[EntryState, str]] = {
    E.PENDING: {E.SENT: "sent by a worker", E.FAILED: "could not be sent (its request or budget)"},
    E.SENT: {
        E.COMMITTED: "reply: committed",
        E.UNKNOWN: "reply lost or ambiguous after sending",
        E.NOT_COMMITTED: "reply: nothing executed",
        E.FAILED: "reply: refused (a refusal code or a permanent rejection)",
        E.REVIEW: "reply needs a person (authorization, hard stop)",
    },
    E.UNKNOWN: {
        E.COMMITTED: "receipt: committed",
        E.NOT_COMMITTED: "receipt: not committed",
        E.FAILED: "receipt: the provider gave up on it",
        E.REVIEW: "no status API, poll budget or deadline",
    },
    E.NOT_COMMITTED: {E.SENT: "sent again with its own key", E.FAILED: "no attempt left"},
    E.REVIEW: {
        E.COMMITTED: "an operator's evidence: committed",
        E.FAILED: "an operator's evidence: not executed",
    },
    E.COMMITTED: {},
    E.FAILED: {},
}

EDGES: dict[EntryState, dict[EntryState, str]] = _EDGES

ALLOWED_PAIRS: tuple[tuple[str, str], ...] = tuple(
    sorted((str(src), str(dst)) for src, targets in EDGES.items() for dst in targets)
)

# An entry in one of these is over: the partial unique index allows one entry per call outside them.
FINAL = frozenset({E.COMMITTED, E.FAILED})
OPEN = frozenset(set(E) - FINAL)
# Entries the reconciliation jobs check with the provider.
RECONCILABLE = frozenset({E.UNKNOWN})
# Entries a worker sends.
SENDABLE = frozenset({E.PENDING, E.NOT_COMMITTED})


def is_allowed(src: str, dst: str) -> bool:
    return EntryState(dst) in EDGES[EntryState(src)]


def choices() -> list[tuple[str, str]]:
    return [(state.value, state.value) for state in EntryState]

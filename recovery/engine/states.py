"""The call states and the only edges between them (docs/design/state-machine.md), as data: the one table that
`transitions.py` checks, the model's choices come from and a migration generates the database trigger from, so
changing it needs a new migration installing the guards again (docs/architecture.md; tests/test_states.py).
"""

from enum import StrEnum


class CallState(StrEnum):
    READY = "READY"  # registered, no attempt admitted yet
    SENT = "SENT"  # an attempt was admitted and is in flight
    RETRYABLE = "RETRYABLE"  # failed in a way that proves a new attempt may help (and is allowed)
    ACCEPTED = "ACCEPTED"  # the provider answered 202: in progress, checked like UNKNOWN
    UNKNOWN = "UNKNOWN"  # a write may or may not have happened: reconcile, never blind-replay
    STILL_UNKNOWN = "STILL_UNKNOWN"  # a status check failed or was ambiguous; still being reconciled
    NOT_COMMITTED = "NOT_COMMITTED"  # the provider confirmed nothing happened: a same-key retry is safe
    COMMITTED = "COMMITTED"  # the effect exists, confirmed by a reply, receipt or callback; never admitted again
    FAILED_PERMANENT = "FAILED_PERMANENT"  # will not be attempted again (budget, rejection, abandoned)
    HUMAN_REVIEW = "HUMAN_REVIEW"  # code cannot settle it: a person decides with the evidence
    COMPENSATING = "COMPENSATING"  # a saga compensation of a committed effect is under way
    COMPENSATED = "COMPENSATED"  # the compensation committed: created, then cancelled
    PARTIAL_COMPENSATED = "PARTIAL_COMPENSATED"  # the compensation undid only part of the effect
    COMPENSATION_FAILED = "COMPENSATION_FAILED"  # the compensation failed; the effect still stands


S = CallState

# state -> {allowed next state: why that edge exists}
_EDGES: dict[CallState, dict[CallState, str]] = {
    S.READY: {S.SENT: "admitted", S.FAILED_PERMANENT: "abandoned or task closed"},
    S.SENT: {
        S.COMMITTED: "outcome: committed",
        S.RETRYABLE: "outcome: retryable failure, or no outcome from a read within its timeout",
        S.UNKNOWN: "outcome: effect unknown, or no outcome from a write within its timeout",
        S.ACCEPTED: "outcome: accepted (202)",
        S.FAILED_PERMANENT: "outcome: permanent failure or retries exhausted",
        S.HUMAN_REVIEW: "outcome: hard stop or approvable authorization",
    },
    S.RETRYABLE: {
        S.SENT: "admitted",
        S.FAILED_PERMANENT: "budget exhausted or abandoned",
        S.HUMAN_REVIEW: "policy",
    },
    S.ACCEPTED: {
        S.COMMITTED: "receipt or callback: committed",
        S.FAILED_PERMANENT: "receipt: the provider gave up",
        S.UNKNOWN: "failed check, poll budget or deadline",
        S.HUMAN_REVIEW: "receipt reports a duplicate effect",
    },
    S.UNKNOWN: {
        S.COMMITTED: "receipt: committed",
        S.NOT_COMMITTED: "receipt: not committed",
        S.STILL_UNKNOWN: "receipt: check failed or ambiguous",
        S.HUMAN_REVIEW: "no status API, deadline, escalated or duplicate effect",
        S.SENT: "approved same-key replay",
    },
    S.STILL_UNKNOWN: {
        S.COMMITTED: "later receipt: committed",
        S.NOT_COMMITTED: "later receipt: not committed",
        S.HUMAN_REVIEW: "poll budget or deadline",
        S.SENT: "approved same-key replay",
    },
    S.NOT_COMMITTED: {S.RETRYABLE: "same-key retry allowed", S.FAILED_PERMANENT: "no budget left or abandoned"},
    S.HUMAN_REVIEW: {
        S.COMMITTED: "approved action with evidence",
        S.NOT_COMMITTED: "approved action with evidence",
        S.FAILED_PERMANENT: "approved action with evidence",
        S.RETRYABLE: "approval granted",
        S.SENT: "approved same-key replay",
    },
    S.COMMITTED: {S.COMPENSATING: "saga compensation started"},
    S.COMPENSATING: {
        S.COMPENSATED: "compensation committed",
        S.PARTIAL_COMPENSATED: "compensation partly committed",
        S.COMPENSATION_FAILED: "compensation failed",
    },
    S.PARTIAL_COMPENSATED: {S.COMPENSATING: "approved new compensation"},
    S.COMPENSATION_FAILED: {S.COMPENSATING: "approved new compensation"},
    S.FAILED_PERMANENT: {},
    S.COMPENSATED: {},
}

# "any other state -> HUMAN_REVIEW when a write's execution is reported that admission would have refused"
# (a policy-bypassing single shot: a possible duplicate effect). COMMITTED -> HUMAN_REVIEW is the same edge.
for _state, _targets in _EDGES.items():
    if _state != S.HUMAN_REVIEW:
        _targets.setdefault(S.HUMAN_REVIEW, "execution reported that admission would have refused")

EDGES: dict[CallState, dict[CallState, str]] = _EDGES

# Every allowed (from, to) pair, sorted so generated SQL is stable.
ALLOWED_PAIRS: tuple[tuple[str, str], ...] = tuple(
    sorted((str(src), str(dst)) for src, targets in EDGES.items() for dst in targets)
)

# Calls the reconciliation jobs check against the provider.
RECONCILABLE = frozenset({S.UNKNOWN, S.STILL_UNKNOWN, S.ACCEPTED})
# The UNKNOWN review queue: outcomes that are not settled yet (ACCEPTED is "in progress", not unknown).
UNSETTLED = frozenset({S.UNKNOWN, S.STILL_UNKNOWN})
# States no automatic process moves a call out of.
FINAL = frozenset({S.FAILED_PERMANENT, S.COMPENSATED})


def is_allowed(src: str, dst: str) -> bool:
    return CallState(dst) in EDGES[CallState(src)]

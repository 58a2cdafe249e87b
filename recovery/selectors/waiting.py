"""Why a queue item waits for a person, in words (docs/console.md: a queue says why each item is there): from the call's
state, its outcome and, for HUMAN_REVIEW, what its latest decision card asked for — one statement for a page."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Count

from recovery.engine.states import CallState as S
from recovery.models import AuditEvent, Decision

OUTCOMES = {
    "poll_budget_exhausted": "status checks used up without an answer",
    "retry_exhausted": "retries used up",
    "deadline_exceeded": "past its deadline",
    "human_review_required": "the recovery engine asks a person",
    "degraded_read_only": "degraded to read-only",
    "no_budget": "the task's budget ran out",
    "abandoned": "abandoned",
}
UNDOING = {  # a compensation state: what its undo waits for (the compensation problems queue names the entry)
    S.COMPENSATING: "its undo is being sent or confirmed",
    S.PARTIAL_COMPENSATED: "its undo undid less than expected: a person decides",
    S.COMPENSATION_FAILED: "its undo failed: a person decides",
}
ASKED = {  # a decision card's required_next action, for a HUMAN_REVIEW call
    "request_approval": "the provider needs an approval before it may run again",
    "request_permission": "the provider refused for want of a permission",
    "human_review": "the recovery engine asks a person",
}


def required_action(required_next) -> str:
    """The action a decision card's required_next names ("" when none)."""
    return required_next.get("action", "") if isinstance(required_next, dict) else ""


def asked_for(call_ids: Iterable[int]) -> dict[int, str]:
    """Each call's latest decision card's required_next action (one statement; none for no ids)."""
    ids = list(call_ids)
    latest: dict[int, tuple] = {}
    if not ids:
        return {}
    for call_id, required, created in Decision.objects.filter(call_id__in=ids).values_list(
        "call_id", "required_next", "created_at"
    ):
        if call_id not in latest or created >= latest[call_id][1]:
            latest[call_id] = (required_action(required), created)
    return {call_id: action for call_id, (action, _) in latest.items()}


def why_waiting(state: str, outcome: str, checks_made: int, asked: str = "") -> str:
    """One line: why a call in `state` waits (empty for a state nothing waits in: a settled call's outcome is how it
    got to a person before, not why it waits now). The compensation problems queue says why by its latest entry."""
    if state == S.UNKNOWN:
        return f"outcome unknown: {checks_made} status check{'s' if checks_made != 1 else ''} so far, more to come"
    if state == S.STILL_UNKNOWN:
        return OUTCOMES.get(outcome) or "outcome still unknown after every status check"
    if state == S.HUMAN_REVIEW:
        if outcome == "poll_budget_exhausted":
            return OUTCOMES[outcome]
        return ASKED.get(asked) or OUTCOMES.get(outcome) or "sent to a person"
    return UNDOING.get(state, "")


UNKNOWN_QUEUE = (S.UNKNOWN, S.STILL_UNKNOWN)


def left_unknown_since(since: datetime) -> dict[str, int]:
    """How many calls left the Unknown outcome queue since `since`, by the state each went to (one statement, on the
    audit trail's partial index of the unknown flow, audit_unknown_flow_idx): what an empty queue says happened."""
    moved = (
        AuditEvent.objects.filter(created_at__gte=since, from_state__in=UNKNOWN_QUEUE)
        .exclude(to_state__in=UNKNOWN_QUEUE)
        .exclude(to_state="")
        .values_list("to_state")
        .annotate(n=Count("id"))
        .order_by("-n", "to_state")
    )
    return dict(moved)

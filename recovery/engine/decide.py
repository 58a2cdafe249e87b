"""The recovery decision card (docs/design/decisions.md): what to do next, what is forbidden, how long to wait.
decide() takes classify()'s Outcome and applies what the table alone cannot know (the budgets, the deadline, the
tool's breaker), in the order of that page's "How a card is decided".
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime

from recovery.engine import messages
from recovery.engine.budgets import backoff_delay, fits_deadline, tighter
from recovery.engine.states import CallState as S
from recovery.engine.types import (
    AUTHENTICATION,
    AUTHORIZATION,
    CAPABILITY_MISSING,
    DEGRADED_READ_ONLY,
    FORCED_OPEN,
    HUMAN_REVIEW_REQUIRED,
    INVALID_ARGUMENTS,
    INVALID_RESULT,
    OPEN,
    RETRY_EXHAUSTED,
    TRANSIENT,
    UNRECOVERABLE,
    BreakerView,
    Budgets,
    BudgetView,
    CallView,
    Decision,
    Failure,
    Outcome,
    RequiredNext,
    TaskView,
    ToolPolicy,
)

RETRYABLE, FAILED_PERMANENT, HUMAN_REVIEW = S.RETRYABLE, S.FAILED_PERMANENT, S.HUMAN_REVIEW


def _budget_view(call: CallView, task: TaskView, budgets: Budgets, now: datetime) -> BudgetView:
    deadline_in = (budgets.deadline - now).total_seconds() if budgets.deadline else None
    return BudgetView(
        attempt=call.attempts_made,
        max_attempts=budgets.max_attempts,
        task_rounds=task.rounds_used,
        max_rounds=budgets.max_rounds,
        deadline_in_s=round(deadline_in, 3) if deadline_in is not None else None,
        tokens_used=task.tokens_used,
        token_budget=budgets.token_budget,
    )


def _exhausted_limit(call: CallView, task: TaskView, tool: ToolPolicy, budgets: Budgets) -> str | None:
    """Which limit leaves no further attempt, if any (the attempt just reported is already counted)."""
    if budgets.max_attempts is not None and call.attempts_made >= budgets.max_attempts:
        return "max_attempts"
    if budgets.max_rounds is not None and task.rounds_used >= budgets.max_rounds:
        return "max_rounds"
    if budgets.token_budget is not None and task.tokens_used >= budgets.token_budget:
        return "token_budget"
    if tool.is_write and budgets.write_retry is not None and task.write_retries_used >= budgets.write_retry:
        return "write_retry"
    return None


def _forbidden(outcome: Outcome, tool: ToolPolicy) -> tuple[str, ...]:
    noun = messages.effect_noun(tool.name).replace(" ", "_")
    if tool.is_write and outcome.side_effect == "unknown":
        return ("blind_replay", f"duplicate_{noun}", "new_idempotency_key")
    cls = outcome.failure.failure_class if outcome.failure else ""
    if cls == INVALID_ARGUMENTS:
        return ("same_call_same_arguments",)
    if cls == AUTHENTICATION:
        return ("same_call_same_credentials",)
    if cls == AUTHORIZATION:
        return ("same_call_without_approval",)
    if cls == INVALID_RESULT:
        return ("treating_result_as_fact",)
    if cls == TRANSIENT:
        return ("unbounded_retry", "retry_before_delay")
    if cls in (UNRECOVERABLE, CAPABILITY_MISSING):
        return ("same_call",)
    return ()


@dataclass(frozen=True)
class _Cards:
    """The cards one outcome can get: what they share (the classification, what is forbidden, the budget as it
    stands, the breaker) made once, the route and what follows it given by each step."""

    outcome: Outcome
    tool: ToolPolicy
    breaker: BreakerView
    budget: BudgetView

    @property
    def breaker_open(self) -> bool:
        return self.breaker.state in (OPEN, FORCED_OPEN)

    def card(self, route, state, action, *, delay=0, message="", next_=(), result="", detail=None, fallback=""):
        outcome, tool = self.outcome, self.tool
        # docs/design/decisions.md: while a dependency keeps failing, a write is never switched at once to a backup
        # write tool.
        degraded_write = ("switch_to_backup_write_tool",) if tool.is_write and self.breaker_open else ()
        return Decision(
            route=route,
            call_state=state,
            outcome=result,
            error=outcome.error,
            phase=outcome.phase,
            stage=outcome.stage,
            side_effect=outcome.side_effect,
            delay_ms=delay,
            next=tuple(next_),
            forbidden=_forbidden(outcome, tool) + degraded_write,
            public_message=message or (outcome.failure.public_message if outcome.failure else ""),
            required_next=RequiredNext(action=action, after_ms=delay, detail=detail or {}),
            budget=self.budget,
            fallback=fallback,
            breaker_state=self.breaker.state,
        )

    def exhausted(self, limit: str) -> Decision:
        """The explicit exhaustion: a RETRYABLE row with nothing left to spend stops, or goes to a person."""
        tool = self.tool
        if tool.exhausted_to_review:
            return self.card(
                "escalate",
                HUMAN_REVIEW,
                "request_approval",
                message=messages.exhausted_message(tool, HUMAN_REVIEW_REQUIRED),
                next_=("human_review",),
                result=HUMAN_REVIEW_REQUIRED,
                detail={"exhausted": limit},
            )
        return self.card(
            "stop",
            FAILED_PERMANENT,
            "stop",
            message=messages.exhausted_message(tool, RETRY_EXHAUSTED),
            next_=("report_not_executed",),
            result=RETRY_EXHAUSTED,
            detail={"exhausted": limit},
        )


def decide(
    outcome: Outcome,
    *,
    call: CallView,
    task: TaskView,
    tool: ToolPolicy,
    breaker: BreakerView,
    now: datetime,
    rng: random.Random | None = None,
    call_estimate_ms: int = 1_000,
) -> Decision | None:
    """The card for a failed or accepted attempt; None for COMMITTED (nothing to recover). The steps of
    docs/design/decisions.md ("How a card is decided"), in its order: the first that answers makes the card."""
    if outcome.state == "COMMITTED":  # 1
        return None
    budgets = tighter(tool.budgets, task.budgets, Budgets(max_attempts=call.max_attempts))
    cards = _Cards(outcome, tool, breaker, _budget_view(call, task, budgets, now))
    if settling := _settling(cards):  # 2-4
        return settling
    failure = outcome.failure
    assert failure is not None, "only COMMITTED and ACCEPTED outcomes carry no failure"
    return (
        _final_row(cards)  # 5-6
        or _out_of_budget(cards, call, task, budgets)  # 7
        or _degraded(cards, failure)  # 8
        or _repair_or_reauth(cards, failure)  # 9-10
        or _retry(cards, failure, call, budgets, now=now, rng=rng or random.Random(), estimate_ms=call_estimate_ms)
    )


def _settling(cards: _Cards) -> Decision | None:
    """2-4: the effect may exist. Reconcile by key (ACCEPTED, UNKNOWN); a person decides what code cannot (a hard
    stop)."""
    outcome, tool = cards.outcome, cards.tool
    if outcome.state == "ACCEPTED":
        return cards.card(
            "reconcile",
            "ACCEPTED",
            "wait_for_reconcile",
            delay=tool.reconcile.first_check_s * 1000,
            message=messages.accepted_message(tool),
            next_=("query_provider_status", "if_unknown:human_review"),
        )
    if outcome.state == "UNKNOWN":
        return cards.card(
            "reconcile",
            "UNKNOWN",
            "wait_for_reconcile",
            delay=tool.reconcile.first_check_s * 1000,
            next_=("query_provider_status", "if_unknown:human_review"),
        )
    if outcome.hard_stop:
        return cards.card(
            "escalate",
            HUMAN_REVIEW,
            "request_approval",
            message=messages.hard_stop_message(tool, outcome.hard_stop),
            next_=("human_review",),
            detail={"hard_stop": outcome.hard_stop},
        )
    return None


def _final_row(cards: _Cards) -> Decision | None:
    """5-6: the row itself ends the retrying."""
    if cards.outcome.state == HUMAN_REVIEW:  # an authorization an approval can grant (row 6)
        return cards.card("escalate", HUMAN_REVIEW, "request_approval", next_=("request_permission", "human_review"))
    if cards.outcome.state == FAILED_PERMANENT:
        # A 403 that no approval can grant stops too: "approve or stop", never replan around it
        # (docs/design/classification.md row 6; `reject` is the route for an unusable result).
        return cards.card("stop", FAILED_PERMANENT, "stop", next_=("report_not_executed",))
    return None


def _out_of_budget(cards: _Cards, call: CallView, task: TaskView, budgets: Budgets) -> Decision | None:
    """7: the row says RETRYABLE, but what may be retried still needs budget."""
    limit = _exhausted_limit(call, task, cards.tool, budgets)
    return cards.exhausted(limit) if limit else None


def _degraded(cards: _Cards, failure: Failure) -> Decision | None:
    """8: while the tool's breaker is open, a retry becomes a degrade that names the fallback."""
    if not (cards.breaker_open and failure.failure_class in (TRANSIENT, INVALID_RESULT)):
        return None
    fallback = cards.tool.fallback
    return cards.card(
        "degrade",
        RETRYABLE,
        "degrade",
        delay=cards.breaker.retry_in_ms,
        message=messages.degraded_message(cards.tool, fallback),
        next_=("use_fallback", "human_review") if fallback else ("human_review",),
        result=DEGRADED_READ_ONLY if fallback else "",
        detail={"fallback": fallback},
        fallback=fallback,
    )


def _repair_or_reauth(cards: _Cards, failure: Failure) -> Decision | None:
    """9-10: a change the runtime makes before the same call goes again: its arguments, its credentials."""
    if failure.failure_class == INVALID_ARGUMENTS:
        errors = [{"field": e.field, "expected": e.expected, "suggestion": e.suggestion} for e in failure.field_errors]
        return cards.card(
            "repair", RETRYABLE, "repair_args", next_=("repair_arguments",), detail={"field_errors": errors}
        )
    if failure.failure_class == AUTHENTICATION:
        return cards.card("reauth", RETRYABLE, "refresh_credentials", next_=("refresh_credentials",))
    return None


def _retry(
    cards: _Cards,
    failure: Failure,
    call: CallView,
    budgets: Budgets,
    *,
    now: datetime,
    rng: random.Random,
    estimate_ms: int,
) -> Decision:
    """11: transient, or a read's invalid result: wait, then the same call again (time_elapsed at admission), if the
    wait plus one call still fits before the deadline."""
    delay = backoff_delay(call.attempts_made, cards.tool.backoff, retry_after_ms=failure.retry_after_ms, rng=rng)
    if not fits_deadline(now=now, deadline=budgets.deadline, wait_ms=delay, call_estimate_ms=estimate_ms):
        return cards.exhausted("deadline")
    route = "reject" if failure.failure_class == INVALID_RESULT else "retry"
    return cards.card(route, RETRYABLE, "retry_after", delay=delay, next_=("retry_same_call",))

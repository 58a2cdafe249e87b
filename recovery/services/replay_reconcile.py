"""Replay reconciliation (docs/replay.md, "Replay reconciliation"): settling an unknown write of a probe-proven,
replay-safe tool by exactly one same-key replay when its status query cannot answer: admitted through the real gate
(recovery.services.attempts.replay_admit), sent with no transaction open, and its reply recorded as an
`idempotent_replay` receipt mapped onto UNKNOWN's own edges.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from recovery.audit.chain import Actor, appends_at_commit
from recovery.engine.gate import NOTHING_EXECUTED
from recovery.engine.reconcile import Observation
from recovery.engine.states import UNSETTLED, CallState
from recovery.models import Attempt, Call, Receipt, ReceiptSource
from recovery.providers.requests import TemplateError, send, tool_request
from recovery.providers.status import StatusAnswer
from recovery.registry.policy import reconcile_policy
from recovery.services.attempts import replay_admit
from recovery.services.outcomes import Sent, facts_of, judge, store_facts

S = CallState
logger = logging.getLogger("recovery.reconcile")
ACTOR = Actor.job("replay-reconcile")
# What a status answer says when the status query could not answer at all (not "pending", not an unmapped status).
CANNOT_ANSWER = frozenset({Observation.FAILED, Observation.UNREACHABLE})


def replayable(call: Call) -> bool:
    """Whether the registry lets reconciliation try a replay of this call at all (no query): the gate judges the
    rest — the retry path a probe proved, the key's age, budgets, the breaker — and its denial is stored (once per
    reason) on the call's timeline, so a person sees why an unprobed or unsafe tool was not replayed."""
    tool = call.tool
    return (
        call.side_effect == "write"
        and call.state in UNSETTLED
        and call.replay_reconciled_at is None
        and tool.replay_safe
        and tool.key_retention_declared
        and reconcile_policy(tool).replay_when_status_down
    )


def status_unavailable(call: Call, answer: StatusAnswer) -> bool:
    """The status query cannot answer: it failed, its breaker is open, or the tool declares no status API (or one of
    kind "replay": the provider answers a same-key re-send with the original outcome, docs/providers.md)."""
    return answer.observed in CANNOT_ANSWER or not queries_status(call.tool)


def queries_status(tool) -> bool:
    """Whether the tool has a status query to send (by key or by listing), not only a replay to make."""
    query = tool.status_query
    return bool(query) and query.get("kind") != "replay"


def _rejected(status: int | None) -> bool:
    """A validation rejection: a 4xx other than a conflict (409: a request with the key is in flight or differs)
    or a rate limit (429). A 5xx or no reply proves nothing about what the provider stored."""
    return status is not None and 400 <= status < 500 and status not in (409, 429)


def replay(call: Call, *, worker: str, apply: Callable[..., Receipt]) -> bool:
    """Settle `call` by its one same-key replay, if the gate admits it; whether a replay was sent. `apply` records
    the replay's answer as a receipt (recovery.services.reconcile.apply_answer, which calls this)."""
    now = timezone.now()
    gate, attempt = replay_admit(call=call, actor=ACTOR, now=now)
    if attempt is None:
        if not gate.allowed:
            logger.info("replay reconciliation of call %s refused: %s", call.pk, gate.reason)
        return False
    try:
        outgoing = tool_request(call.tool, call)
    except TemplateError as exc:
        wire = {"sent": False, "connection_opened": False, "error": {"kind": "client_exception", "message": str(exc)}}
        outgoing = None
    else:
        wire = send(outgoing)
    facts = facts_of(wire)
    judgement = judge(call, facts, Sent.of(attempt), now=timezone.now())
    outcome = judgement.outcome
    result = wire.get("result") if isinstance(wire.get("result"), dict) else {}
    if outcome.state == S.COMMITTED:
        observed, effects = Observation.COMMITTED, 1
    elif _rejected(facts.http_status) and outcome.side_effect in NOTHING_EXECUTED:
        observed, effects = Observation.NOT_COMMITTED, None
    else:
        observed, effects = Observation.AMBIGUOUS, None
    ref_field = call.tool.provider_ref_field
    provider_ref = str(result.get(ref_field) or "")[:255] if ref_field else ""
    seen = f"HTTP {facts.http_status}" if facts.http_status is not None else (wire.get("error") or {}).get("kind")
    answer = StatusAnswer(
        observed=observed,
        provider_status=f"replay {seen}"[:64],
        provider_ref=provider_ref or outcome.provider_ref or "",
        effects=effects,
        http_status=facts.http_status,
        request={k: v for k, v in outgoing.shown().items() if k != "body"} if outgoing else {},
        response={"status": facts.http_status, "body": result or None, "classified": outcome.error or "ok"},
        error="" if observed != Observation.AMBIGUOUS else f"the replay was answered {seen}: nothing proves it",
    )
    with transaction.atomic(), appends_at_commit():
        locked = Call.objects.select_for_update(of=("self",)).get(pk=call.pk)
        store_facts(Attempt.objects.get(pk=attempt.pk), facts, outcome, call=locked, now=timezone.now())
    receipt = apply(call.pk, answer, worker=worker, source=ReceiptSource.IDEMPOTENT_REPLAY)
    logger.info("replay reconciliation of call %s: %s → %s", call.pk, seen, receipt.local_state_after)
    return True

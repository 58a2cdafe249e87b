"""Reconciliation (docs/reconciliation.md, docs/design/state-machine.md): settle writes whose outcome is unknown from
the provider's own records. The rules live here: claiming due calls (a check lease, `FOR UPDATE SKIP LOCKED`), the
status query with no transaction open, and applying its answer in one short transaction that locks the call; the
threads that run them are recovery.services.reconcile_runner's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event, appends_at_commit
from recovery.engine.reconcile import Observation, ReceiptView, Settlement, next_check, settle
from recovery.engine.states import RECONCILABLE, UNSETTLED, CallState
from recovery.models import Call, Receipt, ReceiptSource, Tool
from recovery.providers.listing import fetch_lookup
from recovery.providers.status import Reply, StatusAnswer, read_status
from recovery.registry.policy import reconcile_policy
from recovery.services import replay_reconcile
from recovery.services.reconcile_runner import run_checks
from recovery.services.status_breakers import PROBE, SKIP, StatusBreakerGate
from recovery.statemachine.hot_path import insert
from recovery.statemachine.transitions import transition_call

S = CallState
O = Observation  # noqa: E741  (the receipt's observation, as docs/reconciliation.md names it)
_RECONCILABLE = sorted(RECONCILABLE)
logger = logging.getLogger("recovery.reconcile")
APPLY_BATCH = 20  # answers applied per transaction, at most


def _lease_s() -> int:
    return settings.RECOVERY_CHECK_LEASE_S


def _in_flight() -> int:
    return settings.RECOVERY_CHECKS_IN_FLIGHT


# --- claiming ------------------------------------------------------------------------------------------------------


def _claim_sql(limit: int) -> tuple[str, list]:
    states = ", ".join(["%s"] * len(_RECONCILABLE))
    lock = " FOR UPDATE SKIP LOCKED" if connection.vendor == "postgresql" else ""
    due = (
        f"SELECT id FROM {Call._meta.db_table} WHERE state IN ({states}) AND next_check_at <= %s "
        f"AND (check_lease_until IS NULL OR check_lease_until < %s) ORDER BY next_check_at LIMIT {int(limit)}{lock}"
    )
    sql = (
        f"UPDATE {Call._meta.db_table} SET check_lease_owner = %s, check_lease_until = %s "
        f"WHERE id IN ({due}) RETURNING id"
    )
    return sql, _RECONCILABLE


def claim_due(*, worker: str, limit: int, now: datetime | None = None) -> list[int]:
    """Take the check lease of up to `limit` due calls, oldest due first; their ids.

    One statement: rows another worker is claiming at the same moment are skipped, not waited for (PostgreSQL), and
    SQLite runs writers one at a time. The lease (check_lease_*) is separate from a reviewer's claim.
    """
    now = now or timezone.now()
    until = now + timedelta(seconds=_lease_s())
    sql, states = _claim_sql(limit)
    params = [worker[:100], _stamp(until), *states, _stamp(now), _stamp(now)]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [pk for (pk,) in cursor.fetchall()]


def claim_one(call_id: int, *, worker: str, now: datetime | None = None) -> bool:
    """Take the check lease of one call for an immediate check; False when it is not reconcilable or leased."""
    now = now or timezone.now()
    until = now + timedelta(seconds=_lease_s())
    lease_free = Q(check_lease_until__isnull=True) | Q(check_lease_until__lt=now)
    free = Call.objects.filter(lease_free, pk=call_id, state__in=_RECONCILABLE)
    return bool(free.update(check_lease_owner=worker[:100], check_lease_until=until))


def _stamp(value: datetime):
    return connection.ops.adapt_datetimefield_value(value)


# --- checking ------------------------------------------------------------------------------------------------------


def reconcile_due(*, worker: str, limit: int = 1000, in_flight: int | None = None) -> int:
    """Check up to `limit` due calls with their providers, `in_flight` status queries at a time; how many were
    checked. Calls are claimed a few at a time as query slots free up, and answers applied as they arrive while the
    next queries are in flight (recovery.services.reconcile_runner). A check that failed on our side (not the
    provider's) is logged and raised after the others are done; its call's lease expires and it is checked again."""
    in_flight = in_flight or _in_flight()
    breakers = StatusBreakerGate()

    def ask(call: Call) -> tuple[Call, Reply | StatusAnswer] | None:
        reply = _ask(call, breakers)
        return None if _settled_by_replay(call, reply, worker=worker) else (call, reply)

    def apply(pairs: list) -> list[Exception]:
        return apply_answers([(call, read_status(call.tool, reply)) for call, reply in pairs], worker=worker)

    try:
        due = _due_calls(worker=worker, limit=limit, claim=in_flight * 4)
        checked, errors = run_checks(due, ask, apply, in_flight=in_flight, apply_batch=APPLY_BATCH)
    finally:
        breakers.flush()
    if errors:
        raise errors[0]
    return checked


def _due_calls(*, worker: str, limit: int, claim: int) -> Iterator[Call]:
    """Up to `limit` due calls, claimed `claim` at a time as they are drawn, each once: one checked in this run and
    due again is left to the next run (its lease given back)."""
    checked, seen = 0, set()
    while checked < limit:
        claimed = claim_due(worker=worker, limit=min(claim, limit - checked))
        ids = [pk for pk in claimed if pk not in seen]
        if again := [pk for pk in claimed if pk in seen]:
            Call.objects.filter(pk__in=again, check_lease_owner=worker[:100]).update(
                check_lease_owner="", check_lease_until=None
            )
        if not ids:
            return
        seen.update(ids)
        checked += len(ids)
        yield from _load(ids)


def reconcile_call(call_id: int, *, worker: str) -> Receipt | None:
    """An immediate check of one call (POST .../reconcile); None when another worker holds it or it is settled."""
    if not claim_one(call_id, worker=worker):
        return None
    (call,) = _load([call_id])
    breakers = StatusBreakerGate()
    reply = _ask(call, breakers)
    breakers.flush()
    if _settled_by_replay(call, reply, worker=worker):
        return call.receipts.order_by("-pk").first()
    return apply_answer(call.pk, read_status(call.tool, reply), worker=worker)


def _settled_by_replay(call: Call, reply: Reply | StatusAnswer, *, worker: str) -> bool:
    """Replay reconciliation (docs/replay.md, recovery.services.replay_reconcile) when the status query cannot answer
    for a tool a probe proved safe: the failed check's receipt first (it counts toward the poll budget, and may
    itself send the call to a person), then the one same-key replay. Whether this took the answer over."""
    if not replay_reconcile.replayable(call):
        return False
    answer = read_status(call.tool, reply)
    if not replay_reconcile.status_unavailable(call, answer):
        return False
    if replay_reconcile.queries_status(call.tool):
        apply_answer(call.pk, answer, worker=worker)
        (call,) = _load([call.pk])
        if call.state in UNSETTLED:
            replay_reconcile.replay(call, worker=worker, apply=apply_answer)
        return True
    if not replay_reconcile.replay(call, worker=worker, apply=apply_answer):
        apply_answer(call.pk, answer, worker=worker)  # no status API and no replay: a person settles it
    return True


def _load(ids: list[int]) -> list[Call]:
    """The claimed calls, each with its tool and provider: the few tools of a batch read once, not once per call
    (a tool row is its whole registry entry, JSON decoded), so the calls of a tool share one instance."""
    calls = list(Call.objects.filter(pk__in=ids).order_by("next_check_at", "pk"))
    tools = Tool.objects.select_related("provider").in_bulk({call.tool_id for call in calls})
    for call in calls:
        call.tool = tools[call.tool_id]
    return calls


def _ask(call: Call, breakers: StatusBreakerGate) -> Reply | StatusAnswer:
    """The status query for one call (its reply unread), or the reason none was sent. No transaction is open here,
    and nothing is done here that can wait: this thread goes on to the next query as soon as the reply is in."""
    tool, now = call.tool, timezone.now()
    if tool.mcp.get("status_tool"):
        return _ask_mcp(call, breakers)
    if not replay_reconcile.queries_status(tool):
        return StatusAnswer(observed=O.AMBIGUOUS, error="the tool has no status query: a replay or a person settles it")
    verdict = breakers.ask(tool.provider, now)
    if verdict == SKIP:
        return StatusAnswer(observed=O.UNREACHABLE, error="skipped: the provider's status endpoint breaker is open")
    reply = fetch_lookup(tool, call)
    breakers.record(tool.provider, failed=reply.endpoint_failed, probe=verdict == PROBE)
    return reply


def _ask_mcp(call: Call, breakers: StatusBreakerGate) -> StatusAnswer:
    """An MCP tool's status tool, on a connection of its own, behind the same status breaker (docs/mcp-gateway.md)."""
    from recovery.providers.mcp import query_mcp_status  # the MCP SDK is loaded by the processes that need it

    verdict = breakers.ask(call.tool.provider, timezone.now())
    if verdict == SKIP:
        return StatusAnswer(observed=O.UNREACHABLE, error="skipped: the provider's status endpoint breaker is open")
    answer = query_mcp_status(call.tool, call)
    breakers.record(call.tool.provider, failed=answer.endpoint_failed, probe=verdict == PROBE)
    return answer


# --- applying ------------------------------------------------------------------------------------------------------


def _settlement(call: Call, answer: StatusAnswer, *, checks: int, now: datetime, source: str) -> Settlement:
    """The engine's reading of this receipt for this call (recovery.engine.reconcile.settle)."""
    tool = call.tool
    receipt = ReceiptView(
        state=S(call.state),
        observed=Observation(answer.observed),
        effects=answer.effects,
        from_callback=source == ReceiptSource.CALLBACK,
        checks=checks,
        attempts_made=call.attempts_count,
        max_attempts=call.max_attempts,
        max_effects=(tool.budgets or {}).get("max_business_effects"),
        has_status_api=bool(tool.status_query or tool.mcp.get("status_tool")),
        started_at=call.sent_at or call.state_changed_at,
        now=now,
    )
    return settle(receipt, reconcile_policy(tool))


def apply_answer(
    call_id: int,
    answer: StatusAnswer,
    *,
    worker: str | None = None,
    source: str = ReceiptSource.POLL,
    actor: Actor | None = None,
    event_id: str = "",
) -> Receipt:
    """Record what the provider said about a call and move it as docs/reconciliation.md says, in one transaction."""
    with transaction.atomic(), appends_at_commit():
        return _apply(call_id, answer, worker=worker, source=source, actor=actor, event_id=event_id)


def apply_answers(answers: list[tuple[Call, StatusAnswer]], *, worker: str) -> list[Exception]:
    """Apply several polls' answers in one transaction: one commit and one turn at the audit log's head for the
    lot, the calls locked by one statement in id order (two appliers never deadlock). Should anything fail, the
    batch is rolled back and each answer applied alone, so one bad call cannot hold back the others. Its errors."""
    try:
        with transaction.atomic(), appends_at_commit():
            locked = {call.pk: call for call in _lock([call.pk for call, _ in answers])}
            for loaded, answer in answers:
                call = locked[loaded.pk]
                call.tool = loaded.tool  # with its provider, as the check loaded it
                _apply_to(call, answer, worker=worker)
        return []
    except Exception:
        logger.warning("reconciliation: a batch of %d answers failed; applying them one by one", len(answers))
    errors: list[Exception] = []
    for loaded, answer in answers:
        try:
            apply_answer(loaded.pk, answer, worker=worker)
        except Exception as exc:
            logger.exception("reconciliation: applying the answer for call %s failed", loaded.pk)
            errors.append(exc)
    return errors


def _lock(ids: list[int]) -> list[Call]:
    return list(Call.objects.select_for_update().filter(pk__in=ids).order_by("pk"))


def _apply(call_id, answer: StatusAnswer, *, worker, source=ReceiptSource.POLL, actor=None, event_id="") -> Receipt:
    call = Call.objects.select_for_update(of=("self",)).select_related("tool__provider").get(pk=call_id)
    return _apply_to(call, answer, worker=worker, source=source, actor=actor, event_id=event_id)


def _apply_to(call: Call, answer, *, worker, source=ReceiptSource.POLL, actor=None, event_id="") -> Receipt:
    """The receipt, counters and transitions for one answer; `call` read under its row lock in this transaction."""
    actor = actor or Actor.job("reconcile")
    now = timezone.now()
    before = call.state
    counted = source == ReceiptSource.POLL
    checks = call.checks_made + int(counted)
    decided = _settlement(call, answer, checks=checks, now=now, source=source)
    final = decided.steps[-1] if decided.steps else before
    changes = _counters(call, answer, checks, final, now, decided, worker=worker)
    receipt = _receipt(call, answer, source, before, final, bool(decided.steps), event_id, now)
    evidence = {"receipt": receipt.pk, "observed": answer.observed, "provider_status": answer.provider_status}
    if decided.steps:
        reason = _reason(answer, decided, source)
        for index, target in enumerate(decided.steps):
            # The first step carries the receipt's source: the metrics count one check per receipt, not per step.
            first = index == 0
            transition_call(
                call,
                target,
                actor=actor,
                reason=reason,
                evidence={**evidence, "source": source} if first else evidence,
                changes=changes if first else {},
            )
    else:
        Call.objects.filter(pk=call.pk).update(**changes)
    if not decided.steps and before in RECONCILABLE:
        # A check of an unsettled call that moved nothing is still a check: its event is how the metrics fold counts
        # it, in commit order. (A late callback for a call settled already is kept as a receipt, and is no check.)
        append_event(
            action=AuditAction.CALL_CHECKED,
            actor=actor,
            task_id=call.task_id,
            call_id=call.pk,
            from_state=before,
            to_state=before,
            reason=_reason(answer, decided, source),
            evidence={**evidence, "source": source},
        )
    return receipt


def _counters(call: Call, answer: StatusAnswer, checks: int, final: str, now, decided: Settlement, *, worker) -> dict:
    started = call.sent_at or call.state_changed_at
    due = next_check(reconcile_policy(call.tool), checks=checks, now=now, started_at=started)
    changes: dict = {
        "checks_made": checks,
        "last_receipt_at": now,
        "last_receipt_status": answer.observed,
        "next_check_at": due if final in RECONCILABLE else None,
    }
    if answer.provider_ref and not call.provider_ref:
        changes["provider_ref"] = answer.provider_ref
    if answer.effects is not None:
        changes["effects_observed"] = answer.effects
    if decided.outcome == "duplicate_effect":
        changes["duplicate_effect"] = True
    if decided.outcome:
        changes["outcome"] = decided.outcome
    if worker is not None and call.check_lease_owner == worker[:100]:
        changes["check_lease_owner"], changes["check_lease_until"] = "", None
    return changes


def _receipt(call, answer: StatusAnswer, source, before, final, applied, event_id, now) -> Receipt:
    unsettled = final in RECONCILABLE
    forbidden = ["blind_replay", f"duplicate_{call.tool.name.split('.')[0]}"] if call.side_effect == "write" else []
    if final in (S.COMMITTED, S.HUMAN_REVIEW):
        next_actions = ["human_review"] if final == S.HUMAN_REVIEW else []
    elif final == S.RETRYABLE:
        next_actions = ["retry_same_key_with_state_verified"]
    elif unsettled:
        next_actions = ["wait_for_callback", "next_check", "if_deadline_exceeded:human_review"]
    else:
        next_actions = []
    response = dict(answer.response)
    if answer.error:
        response["error"] = answer.error
    return insert(
        Receipt(
            call=call,
            provider=call.tool.provider,
            source=source,
            observed=answer.observed,
            provider_status=answer.provider_status,
            provider_ref=answer.provider_ref,
            effects_observed=answer.effects,
            request=answer.request,
            response=response,
            http_status=answer.http_status,
            local_state_before=before,
            local_state_after=final,
            applied=applied,
            forbidden=forbidden if final not in (S.COMMITTED,) else [],
            next_actions=next_actions,
            evidence=[f"callback:{event_id}"] if event_id else _request_evidence(answer, source),
            event_id=event_id,
            checked_at=now,
        )
    )


def _request_evidence(answer: StatusAnswer, source: str = ReceiptSource.POLL) -> list[str]:
    request = answer.request
    what = "idempotent_replay" if source == ReceiptSource.IDEMPOTENT_REPLAY else "status_query"
    return [f"{what}:{request['method']} {request['url']}"] if request else []


def _reason(answer: StatusAnswer, decided: Settlement, source: str) -> str:
    said = f"provider status {answer.provider_status!r}" if answer.provider_status else answer.error or "no answer"
    base = f"{source} receipt: {said} ({answer.observed})"
    return f"{base}; {decided.why}" if decided.why else base

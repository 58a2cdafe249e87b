"""Duplicate probes (docs/replay.md) and the retry path they decide.
A probe is a receipt of its own (DuplicateProbe), never an attempt: it moves no call. No transaction is open while a
request is out.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event, appends_at_commit
from recovery.engine import probe as judgement
from recovery.engine.reconcile import Observation
from recovery.models import ActionRequest, Call, DuplicateProbe, RetryPath, Tool
from recovery.providers.listing import fetch_lookup
from recovery.providers.requests import send, tool_request
from recovery.providers.status import read_status

_PATH = {judgement.SAFE: RetryPath.SAFE, judgement.UNSAFE: RetryPath.UNSAFE}
_ANSWERED = frozenset({Observation.COMMITTED, Observation.NOT_COMMITTED, Observation.PENDING})


def key_age_s(call: Call, now) -> int:
    """How old the call's key is: since its first attempt was admitted (the call's creation when it had none)."""
    return max(0, int((now - call.key_since(call.first_sent_at())).total_seconds()))


def probe_call(call: Call, *, actor: Actor, action: ActionRequest | None = None) -> DuplicateProbe:
    """Replay `call` once with its key, read the provider's ledger, store the probe and set the retry path."""
    tool = call.tool
    outgoing = tool_request(tool, call)
    facts = send(outgoing)
    answer = read_status(tool, fetch_lookup(tool, call)) if tool.status_query else None  # the ledger, or a listing
    now = timezone.now()
    result = facts.get("result") if isinstance(facts.get("result"), dict) else {}
    second_ref = result.get(tool.provider_ref_field) if tool.provider_ref_field else None
    expected = int((tool.budgets or {}).get("max_business_effects") or 1)
    verdict = _verdict(call, facts, answer, second_ref, expected)
    shown = outgoing.shown()
    request = {"replay": {k: shown[k] for k in ("method", "url", "body")}}
    response = {"replay": {"http_status": facts.get("http_status"), "result": result or None}}
    if answer is not None:
        request["ledger"], response["ledger"] = answer.request, {**answer.response, "observed": answer.observed}
    with transaction.atomic(), appends_at_commit():
        probe = DuplicateProbe.objects.create(
            call=call,
            tool=tool,
            action=action,
            idempotency_key=call.idempotency_key,
            key_age_s=key_age_s(call, now),
            provider_base_url=tool.provider.base_url,
            first=call.state,
            second=verdict.second,
            http_status=facts.get("http_status"),
            first_business_id=call.provider_ref,
            second_business_id=str(second_ref or "")[:255],
            expected_effects=expected,
            observed_effects=answer.effects if answer is not None else None,
            downstream_audit=verdict.downstream_audit,
            decision=verdict.decision,
            detail=verdict.detail,
            request=request,
            response=response,
            created_at=now,
        )
        append_event(
            action=AuditAction.PROBE_RECORDED,
            actor=actor,
            task_id=call.task_id,
            call_id=call.pk,
            reason=f"duplicate probe of {call.idempotency_key}: {verdict.decision} ({verdict.detail})",
            evidence={"probe": probe.pk, "decision": verdict.decision, "observed_effects": probe.observed_effects},
        )
        if verdict.decision in _PATH:
            set_retry_path(
                tool,
                _PATH[verdict.decision],
                actor=actor,
                reason=f"duplicate probe #{probe.pk}: {verdict.detail}",
                probe=probe,
                now=now,
            )
    return probe


def _verdict(call: Call, facts: dict, answer, second_ref, expected: int) -> judgement.ProbeVerdict:
    """The engine's judgement of the replay (its answer `facts`) and of the ledger read after it (`answer`)."""
    query = call.tool.status_query or {}
    # A provider with no ledger is read from the tool's listing lookup: the effects it matched for the key.
    counts = bool(query.get("effects_field")) or query.get("kind") == "list"
    ledger_read = counts and answer is not None and answer.observed in _ANSWERED
    return judgement.judge(
        judgement.ProbeFacts(
            http_status=facts.get("http_status"),
            first_business_id=call.provider_ref,
            second_business_id=str(second_ref) if second_ref is not None else "",
            ledger_read=ledger_read,
            key_known=answer is not None and answer.observed != Observation.NOT_COMMITTED,
            observed_effects=answer.effects if answer is not None else None,
            expected_effects=expected,
        )
    )


def set_retry_path(
    tool: Tool,
    path: str,
    *,
    actor: Actor,
    reason: str,
    probe: DuplicateProbe | None = None,
    key_age_s: int | None = None,
    now=None,
) -> None:
    """Set the tool's retry path, in the caller's transaction, with its audit event. A safe path covers keys as
    old as the probe's (or `key_age_s`, for an approved action)."""
    now = now or timezone.now()
    before = Tool.objects.filter(pk=tool.pk).values_list("retry_path", flat=True).first()
    covered = probe.key_age_s if probe is not None else key_age_s
    Tool.objects.filter(pk=tool.pk).update(
        retry_path=path,
        retry_path_probe=probe,
        retry_path_key_age_s=covered if path == RetryPath.SAFE else None,
        retry_path_base_url=tool.provider.base_url,
        retry_path_reason=reason[:2000],
        retry_path_changed_at=now,
    )
    tool.retry_path, tool.retry_path_key_age_s = path, covered if path == RetryPath.SAFE else None
    append_event(
        action=AuditAction.RETRY_PATH_CHANGED,
        actor=actor,
        from_state=before or "",
        to_state=path,
        reason=f"{tool.name}: retry path {before} → {path}: {reason}"[:2000],
        evidence={"tool": tool.name, "probe": probe.pk if probe else None, "key_age_s": covered},
    )

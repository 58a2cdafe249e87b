"""A compensation entry sent by the runtime itself (docs/compensation.md, `executor: runtime`): admit, then report.
The reply is read like any attempt's; an entry never reported is swept to unknown and checked by its key, never sent
again blind. Admitting and reporting are idempotent by the runtime's attempt id.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.engine.compensation_states import SENDABLE, EntryState
from recovery.engine.redact import redact_data
from recovery.models import Call, CompensationAttempt, CompensationEntry
from recovery.providers.requests import TemplateError, tool_request
from recovery.services.compensations import read_reply
from recovery.services.errors import Refusal
from recovery.statemachine.transitions import transition_entry

E = EntryState
PREFIX = "comp-"


def entry_of(compensation_id: str, tenant_ids) -> CompensationEntry | None:
    """The entry named `comp-<call id>-<number>` in one of these tenants, with what its answers read."""
    call_id, _, number = compensation_id.removeprefix(PREFIX).partition("-")
    if not compensation_id.startswith(PREFIX) or not call_id.isdigit() or not number.isdigit():
        return None
    return (
        CompensationEntry.objects.select_related("tool__provider", "call__step", "call__task")
        .filter(call_id=int(call_id), number=int(number), call__tenant_id__in=tenant_ids)
        .first()
    )


def attempt_json(entry: CompensationEntry, attempt: CompensationAttempt) -> dict:
    return {
        "compensation_id": entry.compensation_id,
        "attempt_id": attempt.attempt_id,
        "attempt_number": attempt.number,
        "state": attempt.state_after or entry.state,
        "call_id": entry.call_id,
        "call_state": Call.objects.values_list("state", flat=True).get(pk=entry.call_id),
        "tool": entry.tool.name,
        "arguments": entry.arguments,
        "idempotency_key": entry.idempotency_key,
        "http_status": attempt.http_status,
        "row": attempt.row,
        "label": attempt.label,
    }


def _refuse(entry: CompensationEntry, why: str) -> Refusal:
    return Refusal(
        "not_admitted", why, status=409, detail={"compensation_id": entry.compensation_id, "state": entry.state}
    )


def compensation_admit(entry: CompensationEntry, *, attempt_id: str, actor: Actor) -> tuple[int, dict]:
    """Admit the runtime's attempt of an entry it executes: (201, the attempt), or (200, the same) for a repeat."""
    with transaction.atomic():
        entry = (
            CompensationEntry.objects.select_for_update(of=("self",)).select_related("tool__provider").get(pk=entry.pk)
        )
        stored = entry.attempts.filter(attempt_id=attempt_id).first()
        if stored is not None:
            return 200, attempt_json(entry, stored)
        if entry.executor != "runtime":
            raise _refuse(entry, "the console's worker sends this compensation: the runtime does not")
        if entry.state not in SENDABLE:
            why = {
                E.SENT: "an attempt of this compensation is in flight: report its outcome first",
                E.UNKNOWN: "its outcome is unknown: it is being reconciled by its own key, never sent blind",
                E.REVIEW: "it waits for a person's review",
            }.get(entry.state, f"the compensation is {entry.state}: it is not sent again")
            raise _refuse(entry, why)
        if not entry.has_attempts_left():
            raise _refuse(entry, f"all {entry.max_attempts} attempts of this compensation are used")
        try:
            shown = tool_request(entry.tool, entry).shown()
        except TemplateError as exc:
            raise _refuse(entry, f"its request cannot be built: {exc}") from None
        number = entry.attempts_count + 1
        now = timezone.now()
        transition_entry(
            entry,
            E.SENT,
            actor=actor,
            reason=f"attempt {number} admitted for the runtime ({attempt_id}), with the entry's own key",
            evidence={"attempt": number, "attempt_id": attempt_id, "idempotency_key": entry.idempotency_key},
            changes={
                "attempts_count": number,
                "send_at": None,
                "lease_owner": f"runtime:{attempt_id}"[:100],
                "lease_until": now + timedelta(seconds=entry.tool.outcome_timeout_s),
            },
        )
        attempt = CompensationAttempt.objects.create(
            entry=entry, number=number, attempt_id=attempt_id, request=shown, sent_at=now
        )
    return 201, attempt_json(entry, attempt)


def compensation_report(entry: CompensationEntry, *, attempt_id: str, wire: dict, actor: Actor) -> dict:
    """The runtime's outcome of its attempt: read as the worker reads its own; a repeat answers what was stored."""
    attempt = entry.attempts.filter(attempt_id=attempt_id).first()
    if attempt is None:
        raise Refusal("not_found", "no such attempt of this compensation", status=404)
    if attempt.finished_at is not None:
        return attempt_json(entry, attempt)
    entry.refresh_from_db()
    if entry.state != E.SENT or entry.attempts_count != attempt.number:
        # The entry moved on (swept to unknown after the outcome timeout): the facts are kept, its receipts decide.
        attempt.facts, attempt.http_status = redact_data(wire), wire.get("http_status")
        attempt.label, attempt.state_after, attempt.finished_at = "late", entry.state, timezone.now()
        attempt.save(update_fields=["facts", "http_status", "label", "state_after", "finished_at"])
        return attempt_json(entry, attempt)
    read_reply(entry, attempt, wire, actor=actor)
    attempt.refresh_from_db()
    entry.refresh_from_db()
    return attempt_json(entry, attempt)

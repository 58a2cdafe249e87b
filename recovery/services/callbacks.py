"""Signed provider callbacks (docs/reconciliation.md): a provider tells us what became of a call; it becomes a receipt.
A bad signature, a stale timestamp or no secret is 401 and stores nothing; a signed one whose fields do not validate (a
status its tool's status_map does not name, effects that are not a count) is 400 `invalid_callback` and stores nothing
either; a valid one is stored once per event id and applied like a poll's answer, not counting toward the poll budget.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from dataclasses import dataclass

from django.db import IntegrityError
from django.db.models import Q

from recovery.audit.chain import Actor
from recovery.engine.redact import echo_received, redact_data
from recovery.engine.storable import check_storable, loads
from recovery.engine.types import FieldError
from recovery.engine.validation import MISSING, resolve
from recovery.models import Call, CompensationEntry, Provider, Receipt, ReceiptSource, Tool
from recovery.providers.status import StatusAnswer
from recovery.services.compensations import compensation_check_soon
from recovery.services.errors import Refusal
from recovery.services.reconcile import apply_answer

WINDOW_S = 300
MAX_EFFECTS = 2_147_483_647  # the receipt's column, 32-bit on PostgreSQL
MAX_NAMED = 20  # the statuses a refusal lists, at most


@dataclass(frozen=True)
class CallbackResult:
    receipt: Receipt
    duplicate: bool


@dataclass(frozen=True)
class CompensationCallback:
    """A callback about a compensation's own request: not stored as the call's receipt; it brings the entry's
    status check forward when the entry waits for one, and that check records the provider's answer."""

    entry: CompensationEntry
    check_brought_forward: bool


def signature_valid(secret: str, header: str, raw: bytes, *, now: float | None = None) -> bool:
    """Whether `header` signs `raw` with `secret` within the time window. Constant-time comparison."""
    parts = dict(item.strip().split("=", 1) for item in header.split(",") if "=" in item)
    try:
        stamp = int(parts.get("t", ""))
    except ValueError:
        return False
    if abs((now if now is not None else time.time()) - stamp) > WINDOW_S:
        return False
    expected = hmac.new(secret.encode(), f"{stamp}.".encode() + raw, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts.get("v1", ""))


def sign(secret: str, raw: bytes, *, now: float | None = None) -> str:
    """The header a provider sends (used by tests and the drills to act as a provider would)."""
    stamp = int(now if now is not None else time.time())
    digest = hmac.new(secret.encode(), f"{stamp}.".encode() + raw, hashlib.sha256).hexdigest()
    return f"t={stamp},v1={digest}"


def _refused() -> Refusal:
    return Refusal("bad_signature", "the callback's signature is missing, wrong or outside the time window", status=401)


def callback_receive(*, provider_name: str, raw: bytes, signature: str) -> CallbackResult | CompensationCallback:
    provider = Provider.objects.filter(name=provider_name).first()
    secret = os.environ.get(provider.callback_secret_env, "") if provider and provider.callback_secret_env else ""
    if provider is None or not secret or not signature_valid(secret, signature, raw):
        raise _refused()  # an unknown provider answers like a bad signature: nothing to probe with
    body = _parse(raw)
    call = _match(provider, body)
    answer = _answer(call.tool, body)  # every field checked before anything is looked up by event id or stored
    if isinstance(call, CompensationEntry):
        return CompensationCallback(call, check_brought_forward=compensation_check_soon(call.pk))
    event_id = body["event_id"]
    seen = Receipt.objects.filter(provider=provider, event_id=event_id).first()
    if seen is not None:
        return CallbackResult(seen, duplicate=True)
    try:
        receipt = apply_answer(
            call.pk,
            answer,
            source=ReceiptSource.CALLBACK,
            actor=Actor.system(f"callback:{provider.name}"),
            event_id=event_id,
        )
    except IntegrityError:  # the same event delivered concurrently: the other delivery stored it
        return CallbackResult(Receipt.objects.get(provider=provider, event_id=event_id), duplicate=True)
    return CallbackResult(receipt, duplicate=False)


def _bad(field: str, expected: str, received) -> Refusal:
    echoed = echo_received(received, field)
    error = FieldError(field=field, expected=expected, received=echoed, suggestion=f"Send {field} as {expected}.")
    return Refusal("invalid_callback", f"{field}: expected {expected}", status=400, field_errors=[error])


def _parse(raw: bytes) -> dict:
    try:
        body = loads(raw)
    except ValueError as exc:  # not JSON, or nested too deep to walk (never a RecursionError)
        raise _bad("body", f"a JSON object ({exc})", None) from None
    if not isinstance(body, dict):
        raise _bad("body", "a JSON object", None)
    try:
        check_storable(body)  # the body is kept in the receipt: nothing a database would refuse
    except ValueError as exc:
        raise _bad("body", f"JSON the receipt can store: {exc}", None) from None
    event_id = body.get("event_id")
    if not isinstance(event_id, str) or not 1 <= len(event_id) <= 200:
        raise _bad("event_id", "a string of 1 to 200 characters", event_id)
    for name in ("idempotency_key", "provider_ref"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise _bad(name, "a string", body[name])
    if not isinstance(body.get("idempotency_key"), str) and not isinstance(body.get("provider_ref"), str):
        raise _bad("idempotency_key", "the call's idempotency key (or provider_ref)", None)
    if not isinstance(body.get("status"), str):
        raise _bad("status", "the provider's status string", body.get("status"))
    effects = body.get("effects")
    if effects is not None and (
        isinstance(effects, bool) or not isinstance(effects, int) or not 0 <= effects <= MAX_EFFECTS
    ):
        raise _bad("effects", f"the number of effects the provider made, an integer from 0 to {MAX_EFFECTS}", effects)
    return body


def _match(provider: Provider, body: dict) -> Call | CompensationEntry:
    """The call the callback's key (or provider ref) names; else the compensation whose own request carried the key
    (a provider tells of an undo as of any write)."""
    key, ref = body.get("idempotency_key"), body.get("provider_ref")
    by = Q(idempotency_key=key) if isinstance(key, str) and key else Q(provider_ref=ref)
    calls = list(Call.objects.filter(by, tool__provider=provider).select_related("tool")[:2])
    if not calls and isinstance(key, str) and key:
        entries = CompensationEntry.objects.filter(idempotency_key=key, tool__provider=provider)
        entry = entries.select_related("tool").order_by("-pk").first()
        if entry is not None:
            return entry
    if len(calls) != 1:
        what = "no call" if not calls else "more than one call"
        raise Refusal("unknown_call", f"{what} of this provider matches the callback", status=404 if not calls else 409)
    return calls[0]


def _answer(tool: Tool, body: dict) -> StatusAnswer:
    """What the callback says, read through the tool's status_map: a status the map does not name is refused (400),
    as a poll's answer outside it is not guessed at either (providers.status)."""
    status_map = (tool.status_query or {}).get("status_map") or {}
    status = body["status"]
    if status not in status_map:
        named = ", ".join(sorted(status_map)[:MAX_NAMED]) or "none: the tool has no status_map"
        raise _bad("status", f"a status the tool {tool.name}'s status_map names ({named})", status)
    observed = status_map[status]
    effects = body.get("effects")
    ref_field = tool.provider_ref_field
    ref = body.get("provider_ref") or (resolve(body, ref_field) if ref_field else MISSING)
    return StatusAnswer(
        observed=observed,
        provider_status=status,
        provider_ref=ref[:255] if isinstance(ref, str) else "",
        effects=effects,
        response={"body": redact_data(body)},
    )

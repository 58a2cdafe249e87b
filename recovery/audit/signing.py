"""What makes an audit event tamper-evident (docs/design/audit.md): its hash over every field, in canonical JSON, and
the HMAC of that hash under RECOVERY_AUDIT_KEYS, kept outside the database."""

from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from recovery.engine.canonical import canonical_json
from recovery.models import AuditEvent


def _timestamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def event_hash(
    *,
    seq: int,
    chain: str,
    chain_seq: int,
    prev_hash: str,
    task_id: int | None,
    call_id: int | None,
    actor_kind: str,
    actor_label: str,
    actor_user_id: int | None,
    actor_token_id: int | None,
    action: str,
    from_state: str,
    to_state: str,
    reason: str,
    evidence: Any,
    created_at: datetime,
) -> str:
    payload = canonical_json(
        {
            "seq": seq,
            "chain": chain,
            "chain_seq": chain_seq,
            "prev_hash": prev_hash,
            "task_id": task_id,
            "call_id": call_id,
            "actor_kind": actor_kind,
            "actor_label": actor_label,
            "actor_user_id": actor_user_id,
            "actor_token_id": actor_token_id,
            "action": action,
            "from_state": from_state,
            "to_state": to_state,
            "reason": reason,
            "evidence": evidence,
            "created_at": _timestamp(created_at),
        }
    )
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class Keyring:
    """RECOVERY_AUDIT_KEYS: the first key signs; every key verifies what it signed (rotation keeps old ones)."""

    signing_id: str
    keys: dict[str, bytes]

    @classmethod
    def from_settings(cls) -> Keyring:
        return _keyring(tuple(settings.RECOVERY_AUDIT_KEYS))

    def sign(self, text: str, key_id: str | None = None) -> str:
        key_id = key_id or self.signing_id
        return hmac.new(self.keys[key_id], f"{key_id}:{text}".encode(), hashlib.sha256).hexdigest()

    def check(self, text: str, key_id: str, mac: str) -> bool | None:
        """Whether `mac` signs `text` under `key_id`; None when the keyring does not hold that key."""
        if key_id not in self.keys:
            return None
        return hmac.compare_digest(self.sign(text, key_id), mac)


@functools.cache
def _keyring(pairs: tuple[tuple[str, str], ...]) -> Keyring:
    return Keyring(signing_id=pairs[0][0], keys={key_id: secret.encode() for key_id, secret in pairs})


def hash_of(event: AuditEvent) -> str:
    return event_hash(
        seq=event.seq,
        chain=event.chain,
        chain_seq=event.chain_seq,
        prev_hash=event.prev_hash,
        task_id=event.task_id,
        call_id=event.call_id,
        actor_kind=event.actor_kind,
        actor_label=event.actor_label,
        actor_user_id=event.actor_user_id,
        actor_token_id=event.actor_token_id,
        action=event.action,
        from_state=event.from_state,
        to_state=event.to_state,
        reason=event.reason,
        evidence=event.evidence,
        created_at=event.created_at,
    )

"""How long a provider still deduplicates an idempotency key (docs/design/idempotency.md): pure functions, no Django.

A provider keeps a key for `retention_s` from when it first saw it (the call's first attempt, or the call's
creation when nothing was sent yet). Once that has passed, a replay with the same key is a new request to the
provider: the gate denies it (`key_expired`) and the console offers no same-key replay.
"""

from __future__ import annotations

from datetime import datetime, timedelta


def key_expires_at(since: datetime, retention_s: int) -> datetime:
    """When the provider forgets a key it first saw at `since`."""
    return since + timedelta(seconds=retention_s)


def key_expired(since: datetime, retention_s: int, now: datetime) -> bool:
    """Whether a key first seen at `since` is forgotten at `now` (at the instant of expiry it already is)."""
    return now >= key_expires_at(since, retention_s)

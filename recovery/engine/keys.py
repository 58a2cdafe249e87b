"""How long a provider still deduplicates an idempotency key (docs/design/idempotency.md, "The provider's key
retention"): once that has passed since the key was first sent, a same-key replay is a new request to the provider.
"""

from __future__ import annotations

from datetime import datetime, timedelta


def key_expires_at(since: datetime, retention_s: int) -> datetime:
    """When the provider forgets a key it first saw at `since`."""
    return since + timedelta(seconds=retention_s)


def key_expired(since: datetime, retention_s: int, now: datetime) -> bool:
    """Whether a key first seen at `since` is forgotten at `now` (at the instant of expiry it already is)."""
    return now >= key_expires_at(since, retention_s)

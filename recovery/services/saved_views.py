"""Saved views (docs/notifications.md#saved-views): a user names a queue with its filters as they stand in the URL, and
the navigation lists their views with live counts. A view is the user's own: saving a name again replaces it."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from recovery.models import SavedView
from recovery.services.errors import Refusal

NAME_MAX = 60
VIEWS_MAX = 20  # per user: each is counted on every page


def saved_view_save(*, user, name: str, queue: str, query: str, queues: set[str], keys: set[str]) -> SavedView:
    """Save (or replace) the user's view `name` of `queue` with the filters of `query` that are in `keys` (a page
    position is never saved)."""
    name = (name or "").strip()
    if not name or len(name) > NAME_MAX:
        raise Refusal("name", f"Name the view (at most {NAME_MAX} characters).", field="name")
    if queue not in queues:
        raise Refusal("queue", "Not a queue of this console.", field="queue")
    kept = urlencode([(key, value) for key, value in parse_qsl(query or "") if key in keys and value])
    if len(kept) > 500:
        raise Refusal("query", "These filters are too long to save.", field="query")
    existing = SavedView.objects.filter(user=user).exclude(name=name).count()
    if existing >= VIEWS_MAX:
        raise Refusal("name", f"You have {VIEWS_MAX} saved views: delete one first.", field="name")
    view, _ = SavedView.objects.update_or_create(user=user, name=name, defaults={"queue": queue, "query": kept})
    return view


def saved_view_delete(*, user, view_id: int) -> bool:
    """Delete one of the user's views; False when they have no such view."""
    deleted, _ = SavedView.objects.filter(user=user, pk=view_id).delete()
    return bool(deleted)

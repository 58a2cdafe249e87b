"""Reads of assignments and saved views (docs/notifications.md): who owns each of a page's items, in one statement;
a user's saved views."""

from __future__ import annotations

from collections.abc import Iterable

from recovery.models import Assignment, SavedView


def assignees(call_ids: Iterable[int]) -> dict[int, str]:
    """call id -> the username it is assigned to, for the given calls (one statement, none for no ids)."""
    ids = list(call_ids)
    if not ids:
        return {}
    return dict(Assignment.objects.filter(call_id__in=ids).values_list("call_id", "assignee__username"))


def saved_views(user_id: int) -> list[SavedView]:
    return list(SavedView.objects.filter(user_id=user_id).order_by("name"))

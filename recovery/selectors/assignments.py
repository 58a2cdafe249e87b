"""Reads of assignments and saved views (docs/notifications.md): who owns each of a page's items, in one statement;
a user's saved views."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth import get_user_model
from django.db.models import Q

from recovery.engine.actions import REVIEW_PERMISSION
from recovery.models import Assignment, SavedView


def assignees(call_ids: Iterable[int]) -> dict[int, str]:
    """call id -> the username it is assigned to, for the given calls (one statement, none for no ids)."""
    ids = list(call_ids)
    if not ids:
        return {}
    return dict(Assignment.objects.filter(call_id__in=ids).values_list("call_id", "assignee__username"))


def saved_views(user_id: int) -> list[SavedView]:
    return list(SavedView.objects.filter(user_id=user_id).order_by("name"))


def reviewer_names() -> list[str]:
    """The active users who may be assigned an item (the reviewer's permission, through a role or directly)."""
    app, codename = REVIEW_PERMISSION.split(".")
    perm = Q(groups__permissions__codename=codename, groups__permissions__content_type__app_label=app)
    direct = Q(user_permissions__codename=codename, user_permissions__content_type__app_label=app)
    users = get_user_model().objects.filter(perm | direct | Q(is_superuser=True), is_active=True)
    return list(users.order_by("username").values_list("username", flat=True).distinct())

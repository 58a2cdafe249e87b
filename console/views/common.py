"""What every console page shares: the roles a page needs, the layout's navigation counts, rendering a page or its
htmx partial, and how ages and row links are written."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import wraps

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from console.forms import QueueFilterForm
from recovery.engine.due import due_times
from recovery.selectors.assignments import saved_views
from recovery.selectors.queues import COUNT_CAP, QUEUES, queue_count, queue_counts, queue_options
from recovery.statemachine.notices import NEEDS_PERSON

VIEW = "recovery.view_call"  # every role
REVIEW = "recovery.review_call"  # reviewers: claims, previews, action requests
DIAGNOSTIC = "recovery.view_diagnostic"  # reviewers, approvers, admins: the redacted raw failure detail
APPROVE = "recovery.approve_action"
EXPORT = "recovery.export_audit"
VERIFY = "recovery.verify_audit"  # admins


def requires(permission: str):
    """The view needs `permission`; without it, 403 — raised with the permission's name, so the 403 page can say
    which roles have it (console/views/errors.py)."""

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not request.user.has_perm(permission):
                raise PermissionDenied(permission)
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


def shown_count(n: int) -> str:
    return f"{COUNT_CAP:,}+" if n > COUNT_CAP else str(n)


def nav_counts(request: HttpRequest | None = None) -> dict:
    """The navigation's queue sizes as shown: exact up to COUNT_CAP, then "1,000+"; and the user's saved views with
    theirs (read only when their session says they have some: console/views/saved_views.py keeps it)."""
    counts: dict = {name: shown_count(n) for name, n in queue_counts().items()}
    if request is not None and request.session.get(SAVED_VIEWS_KEY):
        counts["views"] = view_counts(request.user)
    return counts


SAVED_VIEWS_KEY = "saved_views"  # the session's note that its user has saved views (how many)


def render_page(request: HttpRequest, template: str, context: dict, *, partial: str = "", status: int = 200):
    """The full page (with the layout's navigation counts), or only `partial` of it for htmx (a live refresh swaps
    the same markup in place)."""
    if partial and request.htmx:
        return render(request, f"{template}#{partial}", context, status=status)
    return render(request, template, context | {"counts": nav_counts(request)}, status=status)


def place_refusal(form, refused) -> str:
    """Put a service's refusal (its `field`, its `message`) next to the form field it names; otherwise return it for
    the top of the page (the form it came from may no longer be drawn: a request that went stale or expired offers
    no decision)."""
    if refused.field in form.fields:
        form.add_error(refused.field, refused.message)
        return ""
    return refused.message


def url_pattern(name: str) -> str:
    """A URL with a placeholder for one integer id, reversed once: rows fill it in without a reverse() each."""
    return reverse(name, args=[0]).replace("/0/", "/{}/")


def age_text(delta: timedelta) -> str:
    """A duration as a reviewer reads it: "3 d 4 h", "12 min", "40 s" (two units at most)."""
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            whole, rest = divmod(seconds, size)
            smaller = {"d": ("h", 3600), "h": ("min", 60)}.get(unit)
            if smaller and rest >= smaller[1]:
                return f"{whole} {unit} {rest // smaller[1]} {smaller[0]}"
            return f"{whole} {unit}"
    return f"{seconds} s"


def by_reason(pairs) -> list[dict]:
    """(reason, item) pairs grouped by reason, in their order: each sentence once, with every item it stands for
    (the call page's forbidden actions, a preview's) instead of the same sentence under each of them."""
    groups: dict[str, list] = {}
    for reason, item in pairs:
        groups.setdefault(reason, []).append(item)
    return [{"reason": reason, "members": members} for reason, members in groups.items()]


def due_text(state: str, risk: str, entered_at: datetime, now: datetime, *, held: bool) -> tuple[str, bool]:
    """When an item is due, as a row and the call page say it (docs/notifications.md#due-times): its first claim's
    due time while nobody holds it, else its resolution's; ("", False) for a state nobody waits on."""
    if state not in NEEDS_PERSON:
        return "", False
    due = due_times(entered_at, risk, state=state, sla=settings.RECOVERY_SLA_S, claim=settings.RECOVERY_CLAIM_DUE_S)
    at = due.next_due(claimed=held)
    what = "resolution" if held or at == due.resolve_by else "claim"
    if at <= now:
        return f"{what} overdue {age_text(now - at)}", True
    return f"{what} due in {age_text(at - now)}", False


def view_counts(user) -> list[dict]:
    """The user's saved views as the navigation lists them: name, link and live count (capped like the queues'): one
    statement for the views, one for the filters' choices, one count per view."""
    views = saved_views(user.pk)
    if not views:
        return []
    tools, tenants = queue_options()
    now, shown = timezone.now(), []
    for view in views:
        queue = QUEUES.get(view.queue)
        if queue is None:
            continue
        form = QueueFilterForm(QueryDict(view.query), queue=queue, tools=tools, tenants=tenants, user_id=user.pk)
        count = shown_count(queue_count(form.filters(), now=now)) if form.is_valid() else "?"
        url = reverse("console:queue", args=[view.queue]) + (f"?{view.query}" if view.query else "")
        shown.append({"id": view.pk, "name": view.name, "url": url, "count": count})
    return shown

"""Notifications in the console (docs/notifications.md): the delivery log — every delivery with its rule, channel,
items and tries, the receiver's answers — and saving and deleting a queue view (the navigation lists the user's
views with live counts)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_POST

from console.views.common import SAVED_VIEWS_KEY, VIEW, render_page, requires
from console.views.queues import BULK_FILTERS
from recovery.models import SavedView
from recovery.selectors.notifications import delivery_log
from recovery.selectors.queues import QUEUES
from recovery.services.errors import Refusal
from recovery.services.saved_views import saved_view_delete, saved_view_save

VIEW_KEYS = set(BULK_FILTERS)  # the filters a view keeps: the queue page's, never its page position


@require_GET
@login_required
@requires(VIEW)
def deliveries(request: HttpRequest) -> HttpResponse:
    return render_page(request, "console/notifications.html", {"deliveries": delivery_log()})


def _note_views(request: HttpRequest) -> None:
    request.session[SAVED_VIEWS_KEY] = SavedView.objects.filter(user=request.user).count()


@require_POST
@login_required
@requires(VIEW)
def save_view(request: HttpRequest) -> HttpResponse:
    queue = request.POST.get("queue", "")
    query = request.POST.get("query", "")
    back = reverse("console:queue", args=[queue]) if queue in QUEUES else reverse("console:overview")
    try:
        view = saved_view_save(
            user=request.user,
            name=request.POST.get("name", ""),
            queue=queue,
            query=query,
            queues=set(QUEUES),
            keys=VIEW_KEYS,
        )
    except Refusal as refused:
        messages.error(request, refused.message)
        return redirect(f"{back}?{query}" if query else back)
    _note_views(request)
    messages.success(request, f"Saved the view “{view.name}”: the navigation lists it with its count.")
    return redirect(f"{back}?{view.query}" if view.query else back)


@require_POST
@login_required
@requires(VIEW)
def delete_view(request: HttpRequest, view_id: int) -> HttpResponse:
    if saved_view_delete(user=request.user, view_id=view_id):
        messages.success(request, "The view is deleted.")
    _note_views(request)
    return redirect("console:overview")


urlpatterns = [
    path("notifications/", deliveries, name="deliveries"),
    path("views/", save_view, name="save-view"),
    path("views/<int:view_id>/delete/", delete_view, name="delete-view"),
]

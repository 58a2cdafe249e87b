"""The task page (docs/design/tasks.md, docs/console.md "Task"): steps and their dependencies, blocked steps, facts,
budget use and the task's whole audit trail with its chain verified. Every role reads it (`recovery.view_call`)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.views.common import VIEW, render_page, requires, url_pattern
from recovery.selectors.task_page import task_page


@require_GET
@login_required
@requires(VIEW)
def task(request: HttpRequest, task_id: int) -> HttpResponse:
    page = task_page(task_id, now=timezone.now())
    if page is None:
        raise Http404("No such task.")
    # One reverse() for every call link: calls show in their step, their fact group and the audit trail.
    call_url = url_pattern("console:call")
    for group in page.facts:
        for call in group.calls:
            call["url"] = call_url.format(call["call_id"])
    for event in page.events:
        event.call_url = call_url.format(event.call_id) if event.call_id else ""
    return render_page(request, "console/task.html", {"page": page, "task": page.task})


urlpatterns = [path("tasks/<int:task_id>/", task, name="task")]

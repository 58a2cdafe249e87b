"""The review queues (docs/console.md) and claims.

Every page needs a signed-in user with a role: the `recovery.view_call` permission every role holds, and
`recovery.review_call` (reviewers) for claims. A signed-out visitor is sent to sign-in; a signed-in user without
the permission gets 403. An htmx request gets the page's partial (the same markup the full page includes).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from console.forms import QueueFilterForm, cursor_param
from console.views.common import REVIEW, VIEW, age_text, nav_counts, render_page, requires
from console.views.queue_rows import decorate, row_html
from recovery.audit.chain import Actor
from recovery.selectors.queues import QUEUES, QueueFilters, call_row, queue_options, queue_page
from recovery.selectors.waiting import left_unknown_since
from recovery.services.action_plans import ACTION_BY_NAME
from recovery.services.bulk import BULK_ACTIONS, BULK_MAX
from recovery.services.claims import ClaimRefused, call_claim, call_release

REFRESH_S = 5
BULK_CHOICES = [(name, ACTION_BY_NAME[name].label) for name in BULK_ACTIONS]
BULK_FILTERS = ("state", "tool", "tenant", "risk", "age", "q", "sort")  # what a bulk of "every row matching" keeps


@require_GET
@login_required
@requires(VIEW)
def home(request: HttpRequest) -> HttpResponse:
    return redirect("console:overview")


@require_GET
@login_required
@requires(VIEW)
def queue(request: HttpRequest, slug: str) -> HttpResponse:
    current = QUEUES.get(slug)
    if current is None:
        raise Http404("No such queue.")
    tools, tenants = queue_options()
    form = QueueFilterForm(request.GET, queue=current, tools=tools, tenants=tenants)
    now = timezone.now()
    if form.is_valid():
        filters = form.filters()
        page = queue_page(filters, now=now)
        status = 200
    else:
        filters, page, status = QueueFilters(states=current.states, compensation=current.compensation), None, 400
    next_url = ""
    if page and page.next_cursor:
        query = request.GET.copy()
        query["after"] = cursor_param(page.next_cursor)
        next_url = f"{request.path}?{query.urlencode()}"
    first_query = request.GET.copy()
    first_query.pop("after", None)
    rows = page.rows if page else []
    can_review = request.user.has_perm(REVIEW)
    decorate(rows, now, request.user, can_review, tools=dict(tools), tenants=dict(tenants), queue=current)
    unfiltered = not (filters.q or filters.tool_id or filters.tenant_id or filters.risk or filters.older_than)
    left = {}
    if page is not None and not rows and unfiltered and not filters.after and current.slug == "unknown":
        left = left_unknown_since(now - timedelta(hours=1))  # an empty queue says what just happened to it
    context = {
        "left": left,
        "left_total": sum(left.values()),
        "queue": current,
        "queues": QUEUES,
        "form": form,
        "page": page,
        "rows": rows,
        "here": request.get_full_path(),
        "filters": filters,
        "now": now,
        "next_url": next_url,
        "first_url": f"{request.path}?{first_query.urlencode()}" if request.GET.get("after") else "",
        "refresh_s": REFRESH_S,
        "can_review": can_review,
        "bulk_actions": BULK_CHOICES,
        "bulk_max": BULK_MAX,
        "filter_query": [(name, request.GET[name]) for name in BULK_FILTERS if request.GET.get(name)],
        "stuck_after": age_text(timedelta(seconds=settings.RECOVERY_COMPENSATION_STUCK_S)),
    }
    return render_page(request, "console/queue.html", context, partial="rows", status=status)


@require_GET
@login_required
@requires(VIEW)
def counts(request: HttpRequest) -> HttpResponse:
    """The navigation's live queue counts (an htmx partial)."""
    return render(request, "console/base.html#counts", {"counts": nav_counts()})


@require_POST
@login_required
@requires(REVIEW)
def claim(request: HttpRequest, call_id: int) -> HttpResponse:
    try:
        taken = call_claim(call_id=call_id, user=request.user, actor=Actor.for_user(request.user))
    except ClaimRefused as refused:
        return _after_claim(request, call_id, str(refused), error=True)
    return _after_claim(request, call_id, f"You hold call {call_id} until {taken.until:%H:%M:%S} UTC.")


@require_POST
@login_required
@requires(REVIEW)
def release(request: HttpRequest, call_id: int) -> HttpResponse:
    if call_release(call_id=call_id, user=request.user, actor=Actor.for_user(request.user)):
        return _after_claim(request, call_id, f"Released call {call_id}.")
    return _after_claim(request, call_id, f"You do not hold call {call_id}.", error=True)


def _after_claim(request: HttpRequest, call_id: int, message: str, *, error: bool = False) -> HttpResponse:
    """htmx: the row again, as it now stands (with the message in its status cell); otherwise back to the queue."""
    if request.htmx:
        current = QUEUES.get(request.GET.get("queue", ""), QUEUES["unknown"])
        row = call_row(call_id, compensation=current.compensation)
        if row is None:
            raise Http404("No such call.")
        tools, tenants = queue_options()
        decorate([row], timezone.now(), request.user, True, tools=dict(tools), tenants=dict(tenants), queue=current)
        html = row_html(row, can_review=True, notice=message, notice_error=error)
        return HttpResponse(html, status=409 if error else 200)
    (messages.error if error else messages.success)(request, message)
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = reverse("console:queue", kwargs={"slug": "unknown"})
    return redirect(target)

"""Bulk actions in the console (docs/bulk.md): the preview that freezes a queue page's selection, the bulk's page —
every item with its checks and result, its progress refreshing itself (htmx) while a worker executes it — its
request, and the four-eyes decision (the shared parts: console/views/approvals.py). Every form works without
JavaScript."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRefresh

from console.forms import QueueFilterForm
from console.views.approvals import ReasonForm, RequestPage, decide, decision
from console.views.common import APPROVE, REVIEW, VIEW, place_refusal, render_page, requires
from console.views.queues import BULK_FILTERS
from recovery.audit.chain import Actor
from recovery.models import BulkAction, BulkItemStatus, BulkStatus
from recovery.selectors.bulk import bulk_page
from recovery.selectors.queues import QUEUES, queue_options
from recovery.services.action_plans import ACTION_BY_NAME
from recovery.services.bulk import BULK_ACTIONS, BULK_MAX, LIVE, bulk_approve, bulk_preview, bulk_reject, bulk_request
from recovery.services.errors import Refusal

REFRESH_S = 2
ACTION_CHOICES = [(name, ACTION_BY_NAME[name].label) for name in BULK_ACTIONS]
# How each item status reads on the page.
ITEM_LABELS = {
    BulkItemStatus.PENDING: "would run",
    BulkItemStatus.EXCLUDED: "excluded",
    BulkItemStatus.SKIPPED_CHECKS: "skipped",
    BulkItemStatus.EXECUTING: "executing",
    BulkItemStatus.EXECUTED: "executed",
    BulkItemStatus.SKIPPED_STALE: "skipped stale",
    BulkItemStatus.FAILED: "failed",
    BulkItemStatus.INTERRUPTED: "interrupted",
}


class BulkForm(forms.Form):
    """What the queue page's bulk bar posts: the action, which selection, the rows ticked (the filter's own fields
    travel alongside, as the page's URL had them)."""

    action = forms.ChoiceField(choices=ACTION_CHOICES, label="Bulk action")
    selection = forms.ChoiceField(choices=[("rows", "the rows selected"), ("matching", "every row matching")])

    def __init__(self, data):
        super().__init__(data)
        self.calls = data.getlist("call")

    def clean(self):
        # Any id may be sent: the service says which are calls (and refuses the rest by number).
        if any(not (value.isdigit() and len(value) < 19) for value in self.calls):
            raise forms.ValidationError("a selected row is not a call id: select rows on the queue page")
        self.cleaned_data["call"] = [int(value) for value in self.calls]
        return self.cleaned_data


class RequestForm(ReasonForm):
    selection_hash = forms.RegexField(regex=r"^[0-9a-f]{64}$", widget=forms.HiddenInput)


@require_POST
@login_required
@requires(REVIEW)
def preview(request: HttpRequest, slug: str) -> HttpResponse:
    queue = QUEUES.get(slug)
    if queue is None:
        raise Http404("No such queue.")
    back = reverse("console:queue", args=[slug])
    query = {name: request.POST[name] for name in BULK_FILTERS if request.POST.get(name)}
    back_url = f"{back}?{urlencode(query)}" if query else back
    form = BulkForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(f"{'' if k == '__all__' else k + ': '}{' '.join(v)}" for k, v in form.errors.items())
        return _back(request, back_url, errors)
    tools, tenants = queue_options()
    filter_form = QueueFilterForm(query, queue=queue, tools=tools, tenants=tenants, user_id=request.user.pk)
    if not filter_form.is_valid():
        return _back(request, back_url, "The queue's filter is not valid: fix it on the queue page first.")
    matching = form.cleaned_data["selection"] == "matching"
    try:
        made = bulk_preview(
            action=form.cleaned_data["action"],
            queue=queue,
            user=request.user,
            actor=Actor.for_user(request.user),
            call_ids=None if matching else form.cleaned_data["call"],
            filters=filter_form.filters() if matching else None,
            filter_query=query,
        )
    except Refusal as refused:
        return _back(request, back_url, refused.message)
    messages.success(request, "Selection frozen: nothing was done. Read every item, then request it with a reason.")
    return redirect("console:bulk", made.pk)


def _back(request: HttpRequest, url: str, message: str) -> HttpResponse:
    """A selection that cannot be frozen: back to the queue as it was filtered, the reason on top of the bulk bar."""
    messages.error(request, f"No bulk was made: {message}", extra_tags="bulk")
    return redirect(url)


@require_GET
@login_required
@requires(VIEW)
def bulk(request: HttpRequest, bulk_id: int) -> HttpResponse:
    if request.htmx:
        page = bulk_page(bulk_id)
        if page is None:
            raise Http404("No such bulk action.")
        if page.bulk.status not in LIVE:
            return HttpResponseClientRefresh()  # done: the whole page again (its forms and counts moved too)
        return render_page(request, "console/bulk.html", _context(request, page), partial="progress")
    return _render(request, bulk_id)


def _render(request: HttpRequest, bulk_id: int, *, status: int = 200, **forms_) -> HttpResponse:
    page = bulk_page(bulk_id)
    if page is None:
        raise Http404("No such bulk action.")
    return render_page(request, "console/bulk.html", _context(request, page, **forms_), status=status)


# Why an item's call is at another version than at the freeze, and how the page marks it: this bulk's own action moved
# it (what was asked for), it had moved before its turn (skipped: the one case to notice), or it moved afterwards.
MOVED = {
    BulkItemStatus.EXECUTED: ("by-this-bulk", "moved", "by this bulk's action"),
    BulkItemStatus.EXECUTING: ("by-this-bulk", "moved", "by this bulk's action"),
    BulkItemStatus.SKIPPED_STALE: ("stale", "bad", "moved before its turn: skipped"),
}


def _moved(item) -> tuple[str, str, str] | None:
    """(fact value, CSS class, words) for an item whose call's version changed since the freeze; None if it did not."""
    if item.call.version == item.call_version:
        return None
    return MOVED.get(item.status, ("since", "muted", "moved since"))


def _context(request, page, *, request_form=None, error="", **forms_) -> dict:
    bulk, user, now = page.bulk, request.user, timezone.now()
    four_eyes = decision(PAGE, request, bulk, now=now, **forms_)
    for item in page.items:
        item.label = ITEM_LABELS.get(item.status, item.status)
        item.failed = [c for c in item.checks if not c.get("passed")]
        item.moved = _moved(item)
    total = len(page.items)
    done = sum(n for status, n in page.counts.items() if status not in (BulkItemStatus.PENDING, "executing"))
    return {
        "bulk": bulk,
        "d": four_eyes,
        "items": page.items,
        "counts": page.counts,
        "count_rows": [(ITEM_LABELS.get(s, s), s, page.counts.get(s, 0)) for s in ITEM_LABELS if page.counts.get(s)],
        "total": total,
        "done": done if bulk.status not in (BulkStatus.PREVIEWED, BulkStatus.REQUESTED) else 0,
        "to_run": page.counts.get(BulkItemStatus.PENDING, 0),
        "action_label": ACTION_BY_NAME[bulk.action].label,
        "queue": QUEUES.get(bulk.queue),
        "filters": sorted(bulk.filters.items()) if isinstance(bulk.filters, dict) else [],
        "live": bulk.status in LIVE,
        "refresh_s": REFRESH_S,
        "can_request": bulk.status == BulkStatus.PREVIEWED and user.has_perm(REVIEW) and not four_eyes.expired,
        "request_form": request_form or RequestForm(initial={"selection_hash": bulk.selection_hash}),
        "error": error,
        "max": BULK_MAX,
        "now": now,
    }


@require_POST
@login_required
@requires(REVIEW)
def request_bulk(request: HttpRequest, bulk_id: int) -> HttpResponse:
    form = RequestForm(request.POST)
    if not form.is_valid():
        return _render(request, bulk_id, status=400, request_form=form)
    try:
        done = bulk_request(
            bulk_id=bulk_id,
            user=request.user,
            actor=Actor.for_user(request.user),
            reason=form.cleaned_data["reason"],
            selection_hash=form.cleaned_data["selection_hash"],
        )
    except Refusal as refused:
        error = place_refusal(form, refused)
        return _render(request, bulk_id, status=refused.status, request_form=form, error=error)
    except BulkAction.DoesNotExist:
        raise Http404("No such bulk action.") from None
    messages.success(request, "Requested: it waits for a second person with the approver role.")
    return redirect("console:bulk", done.pk)


PAGE = RequestPage(
    thing="bulk",
    id_name="bulk_id",
    missing=BulkAction.DoesNotExist,
    not_found="No such bulk action.",
    urls={"approve": "console:bulk-approve", "reject": "console:bulk-reject"},
    redraw=_render,
    after=lambda bulk: reverse("console:bulk", args=[bulk.pk]),
    approve_label="Approve bulk #{pk}",
    reject_label="Reject bulk #{pk}",
)


@require_POST
@login_required
@requires(APPROVE)
def approve(request: HttpRequest, bulk_id: int) -> HttpResponse:
    return decide(PAGE, request, bulk_id, "approve", bulk_approve, "Approved: a worker executes every item once.")


@require_POST
@login_required
@requires(APPROVE)
def reject(request: HttpRequest, bulk_id: int) -> HttpResponse:
    return decide(PAGE, request, bulk_id, "reject", bulk_reject, "Rejected: no item will run.")


urlpatterns = [
    path("queues/<slug:slug>/bulk/", preview, name="bulk-preview"),
    path("bulk/<int:bulk_id>/", bulk, name="bulk"),
    path("bulk/<int:bulk_id>/request/", request_bulk, name="bulk-request"),
    path("bulk/<int:bulk_id>/approve/", approve, name="bulk-approve"),
    path("bulk/<int:bulk_id>/reject/", reject, name="bulk-reject"),
]

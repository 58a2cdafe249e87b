"""Four eyes in the console (docs/actions.md#four-eyes): what the request pages of every kind share — who requested and
decided what and why, the decision forms drawn only for who may use them now, a refusal shown next to its field —
and the approvers' queue of every kind (recovery.selectors.approvals' registry). The services decide everything:
their Refusal is shown as is while nothing changes; success redirects with a message (POST/redirect/GET)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.views.common import APPROVE, age_text, place_refusal, render_page, requires
from recovery.audit.chain import Actor
from recovery.engine.actions import ACTIONS
from recovery.models.approvals import REQUESTED
from recovery.selectors.approvals import QUEUE_LIMIT, approvals_waiting, pending_approvals_count
from recovery.services.approvals import PREVIEWED
from recovery.services.errors import Refusal
from recovery.services.mcp_holds import pending_holds

REASON_MAX = 2000
OPEN = (PREVIEWED, REQUESTED)  # a kind's statuses that still wait for someone (a kind without previews: requested)
LABELS = {a.name: a.label for a in ACTIONS}


class ReasonForm(forms.Form):
    """A person's reason for a step (the service checks it again: required, at most REASON_MAX characters)."""

    reason = forms.CharField(label="Reason", max_length=REASON_MAX, strip=True)

    def __init__(self, *args, required: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        if required:
            self.fields["reason"].error_messages["required"] = required


@dataclass(frozen=True, kw_only=True)
class RequestPage:
    """One kind's request page, as its shared parts need it: its wording, its URLs, how it is drawn again."""

    thing: str  # what its requester asked for: "You requested this reset"
    id_name: str  # the services' keyword for the request's id
    missing: type[Exception]  # the model's DoesNotExist
    not_found: str  # the 404's words
    urls: dict[str, str]  # verb (approve, reject, withdraw) → its URL name, with the request's id as argument
    redraw: Callable[..., HttpResponse]  # redraw(request, pk, status=, error=, <verb>_form=): the page again
    after: Callable[[Any], str]  # where a decision sends the browser: a URL for the decided request
    approve_label: str = "Approve"  # may name the request: "Approve bulk #{pk}"
    reject_label: str = "Reject"
    hints: tuple[tuple[str, str], ...] = ()  # verb → the hint under its reason field
    approve_note: str = ""  # under the approve button
    reason_required: str = ""  # the reason's "required" message, when not Django's


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A four-eyes request as one person reads it now: its state for them and the forms they may use."""

    row: Any
    thing: str
    is_open: bool  # previewed or requested: someone still has to act
    pending: bool  # requested: a second person decides it
    expired: bool  # open past its expiry (the periodic sweep has not marked it yet)
    expires_in: str
    own_request: bool  # the person requested it: someone else decides
    can_decide: bool
    can_approve: bool
    can_withdraw: bool
    urls: dict[str, str]
    forms: dict[str, ReasonForm]
    approve_label: str
    reject_label: str
    hints: dict[str, str]
    approve_note: str


def decision(page: RequestPage, request: HttpRequest, row, *, now, stale: bool = False, **forms_) -> Decision:
    """The shared part of a request page's context (`forms_`: a bound form to draw again, by `<verb>_form`)."""
    user = request.user
    is_open, pending = row.status in OPEN, row.status == REQUESTED
    expired = is_open and row.past_expiry(now)
    approver, own = user.has_perm(APPROVE), row.requested_by_user(user)
    can_decide = pending and approver and not own and not expired
    verbs = ("approve", "reject", "withdraw")
    return Decision(
        row=row,
        thing=page.thing,
        is_open=is_open,
        pending=pending,
        expired=expired,
        expires_in=age_text(row.expires_at - now) if is_open and not expired else "",
        own_request=pending and own,
        can_decide=can_decide,
        can_approve=can_decide and not stale,
        can_withdraw="withdraw" in page.urls and pending and own and not expired,
        urls={verb: reverse(name, args=[row.pk]) for verb, name in page.urls.items()},
        forms={verb: forms_.get(f"{verb}_form") or _reason_form(page, verb) for verb in verbs},
        approve_label=page.approve_label.format(pk=row.pk),
        reject_label=page.reject_label.format(pk=row.pk),
        hints=dict(page.hints),
        approve_note=page.approve_note,
    )


def _reason_form(page: RequestPage, verb: str, data=None) -> ReasonForm:
    return ReasonForm(data, prefix=verb, required=page.reason_required)


def decide(page: RequestPage, request: HttpRequest, pk: int, verb: str, service, done: str) -> HttpResponse:
    """A decision (approve, reject, withdraw) with a reason: the service decides (four eyes, stale, expired); its
    refusal is shown on the request's page next to the form it came from, and nothing changed. `done` is the
    success message ({row} the decided request)."""
    form = _reason_form(page, verb, request.POST)
    if not form.is_valid():
        return page.redraw(request, pk, status=400, **{f"{verb}_form": form})
    try:
        decided = service(
            **{page.id_name: pk},
            user=request.user,
            actor=Actor.for_user(request.user),
            reason=form.cleaned_data["reason"],
        )
    except Refusal as refused:
        error = place_refusal(form, refused)
        return page.redraw(request, pk, status=refused.status, error=error, **{f"{verb}_form": form})
    except page.missing:
        raise Http404(page.not_found) from None
    messages.success(request, done.format(row=decided))
    return redirect(page.after(decided))


# --- the approvers' queue -------------------------------------------------------------------------------------------


@require_GET
@login_required
@requires(APPROVE)
def approvals(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    waiting = approvals_waiting(now=now)
    context = {
        "pending": pending_approvals_count(now=now),  # the navigation's and the overview's figure, every kind
        "rows": [_action_row(req, request.user, now) for req in waiting["action"]],
        "resets": waiting["breaker_reset"],
        "bulks": [(bulk, LABELS.get(bulk.action, bulk.action)) for bulk in waiting["bulk"]],
        "now": now,
        "limit": QUEUE_LIMIT,
        "holds": pending_holds(now=now),  # held MCP calls, grouped per task and tool (docs/mcp-gateway.md)
    }
    return render_page(request, "console/approvals.html", context)


def _action_row(req, user, now) -> dict:
    """An action request as the queue lists it: its plan's label, what it sends, its failed checks, its age."""
    plan = req.plan if isinstance(req.plan, dict) else {}
    checks = [c for c in plan.get("checks") or [] if isinstance(c, dict)]
    sends = [r for r in plan.get("requests") or [] if isinstance(r, dict)]
    return {
        "req": req,
        "label": plan.get("label") or LABELS.get(req.action, req.action),
        "sends": [f"{r.get('method', '')} {r.get('url', '')}" for r in sends],
        "failed": [c.get("check", "") for c in checks if not c.get("passed")],
        "checks": len(checks),
        "age": age_text(now - (req.requested_at or req.previewed_at)),
        "expires_in": age_text(req.expires_at - now),
        "stale": req.call.version != req.call_version,
        "own": req.requested_by_id == user.pk,
    }


urlpatterns = [path("approvals/", approvals, name="approvals")]

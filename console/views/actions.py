"""Operator actions in the console (docs/actions.md): the dry run, the request, the second person's decision, the queue.

Every action starts on the call page as a POST "Preview" (reviewers): the service builds the plan — the exact
provider request(s), the policy checks, the forbidden actions, the expected effects — sends nothing, and the
browser is sent to the request's page. Every role reads that page; each form on it is drawn only for who may use it
now: a reviewer requests the previewed action with a reason, a different person with the approver role approves or
rejects it with a reason. The services (recovery/services/actions.py) decide everything and refuse with
`Refusal`, whose message the page shows as is (next to its field when it names one) while nothing changes;
success redirects with a message (POST/redirect/GET). No JavaScript is needed; the request's status block
refreshes itself (htmx) while a worker executes it.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRefresh

from console.views.common import APPROVE, REVIEW, VIEW, age_text, by_reason, place_refusal, render_page, requires
from recovery.audit.chain import Actor
from recovery.engine.actions import ACTIONS
from recovery.models import ActionRequest, ActionStatus, Call
from recovery.selectors.approvals import (
    OPEN,
    QUEUE_LIMIT,
    action_request_page,
    pending_approvals,
    pending_breaker_resets,
)
from recovery.selectors.bulk import bulks_waiting
from recovery.selectors.facts import shown_facts
from recovery.services.action_plans import action_options
from recovery.services.actions import action_approve, action_preview, action_reject, action_request, action_withdraw
from recovery.services.errors import Refusal

LABELS = {a.name: a.label for a in ACTIONS}
# The actions that settle a call on a person's word: their preview carries the evidence (docs/actions.md).
EVIDENCE_ACTIONS = ("mark_committed", "mark_not_committed")
# What each provider request of a plan is, in the order the plan lists them (a duplicate probe sends two).
REQUEST_ROLES = {
    "probe_duplicate": (
        "the replay: this committed call sent again with its original idempotency key",
        "the provider's ledger for the key, read after the replay: how many business effects it holds",
    ),
    "replay_same_key": ("the replay, with the call's own idempotency key",),
    "reconcile_now": ("the status query by idempotency key",),
}
# While a worker holds the request, its status block refreshes itself every few seconds.
LIVE = (ActionStatus.APPROVED, ActionStatus.EXECUTING)
REFRESH_S = 3
REASON_MAX = 2000

# How a refusal answers: bad input is a 400 next to its field, a missing role a 403, and a request that cannot move
# as asked (forbidden now, four eyes, stale, expired, no longer pending) a 409 — the same page, nothing changed.


class EvidenceForm(forms.Form):
    """What a person settling a call by hand shows: at least one of these (the service decides what suffices, and
    checks the link; the form only keeps each value within the stored length)."""

    provider_ref = forms.CharField(label="Provider reference", required=False, max_length=255, strip=True)
    receipt_id = forms.CharField(label="Receipt id", required=False, max_length=255, strip=True)
    link = forms.CharField(label="Receipt or document link", required=False, max_length=2000, strip=True)

    def evidence(self) -> dict:
        return {name: value for name, value in self.cleaned_data.items() if value}


EVIDENCE_LABELS = {name: field.label for name, field in EvidenceForm.base_fields.items()}


class ReasonForm(forms.Form):
    reason = forms.CharField(label="Reason", max_length=REASON_MAX, strip=True)


class RequestForm(ReasonForm):
    # The plan the reviewer read: requesting it binds to this hash (the service refuses a plan that changed since).
    plan_hash = forms.RegexField(regex=r"^[0-9a-f]{64}$", widget=forms.HiddenInput)


# --- the dry run ---------------------------------------------------------------------------------------------------


@require_POST
@login_required
@requires(REVIEW)
def preview(request: HttpRequest, call_id: int, action: str) -> HttpResponse:
    if action not in LABELS:
        raise Http404("No such action.")
    call = Call.objects.select_related("tool").filter(pk=call_id).first()
    if call is None:
        raise Http404("No such call.")
    evidence_form = EvidenceForm(request.POST) if action in EVIDENCE_ACTIONS else None
    if evidence_form is not None and not evidence_form.is_valid():
        return _preview_refused(request, call, action, evidence_form, status=400)
    try:
        made = action_preview(
            call_id=call.pk,
            action=action,
            user=request.user,
            actor=Actor.for_user(request.user),
            evidence=evidence_form.evidence() if evidence_form is not None else None,
        )
    except Refusal as refused:
        error = place_refusal(evidence_form, refused) if evidence_form is not None else refused.message
        return _preview_refused(request, call, action, evidence_form, error=error, status=refused.status)
    messages.success(
        request, f"Dry run of “{LABELS[action]}” ready: nothing was sent. Read the plan, then request it with a reason."
    )
    return redirect("console:action", made.pk)


def _preview_refused(request, call: Call, action: str, evidence_form, *, error: str = "", status: int) -> HttpResponse:
    """The preview could not be made: why, and (for actions that need evidence) the form again with its errors."""
    context = {
        "mode": "refused",
        "call": call,
        "action_name": action,
        "action_label": LABELS[action],
        "refusal": error,
        "evidence_form": evidence_form,
        "preview_url": reverse("console:action-preview", args=[call.pk, action]),
    }
    return render_page(request, "console/action.html", context, status=status)


# --- one request -----------------------------------------------------------------------------------------------------


@require_GET
@login_required
@requires(VIEW)
def action_page(request: HttpRequest, request_id: int) -> HttpResponse:
    if request.htmx:
        # Only a page drawn while a worker held the request polls its status block: once the execution is over,
        # the whole page is drawn again (its history, its forms and the navigation's counts moved too).
        page = action_request_page(request_id)
        if page is None:
            raise Http404("No such action request.")
        if page.request.status not in LIVE:
            return HttpResponseClientRefresh()
        return render_page(request, "console/action.html", _context(request, page), partial="status")
    return _render(request, request_id)


def _render(request: HttpRequest, request_id: int, *, status: int = 200, **forms_) -> HttpResponse:
    page = action_request_page(request_id)
    if page is None:
        raise Http404("No such action request.")
    return render_page(request, "console/action.html", _context(request, page, **forms_), status=status)


def _context(
    request: HttpRequest, page, *, request_form=None, approve_form=None, reject_form=None, withdraw_form=None, error=""
) -> dict:
    req, now = page.request, timezone.now()
    user = request.user
    plan = req.plan if isinstance(req.plan, dict) else {}
    is_open = req.status in OPEN
    expired = is_open and req.expires_at <= now
    reviewer, approver = user.has_perm(REVIEW), user.has_perm(APPROVE)
    own = req.requested_by_id is not None and req.requested_by_id == user.pk
    can_request = req.status == ActionStatus.PREVIEWED and reviewer and not expired and not page.stale
    can_decide = req.status == ActionStatus.REQUESTED and approver and not own and not expired
    evidence = req.evidence if isinstance(req.evidence, dict) else {}
    return {
        "mode": "request",
        "req": req,
        "call": req.call,
        "plan": plan,
        "plan_requests": _shown_requests(req.action, plan.get("requests")),
        "checks": [c for c in plan.get("checks") or [] if isinstance(c, dict)],
        "failed_checks": sum(1 for c in plan.get("checks") or [] if isinstance(c, dict) and not c.get("passed")),
        "forbidden": by_reason(  # the plan's forbidden actions, each reason once
            (str(f.get("reason", "")), LABELS.get(f.get("action"), f.get("action", "")))
            for f in plan.get("forbidden") or []
            if isinstance(f, dict)
        ),
        "facts": shown_facts(req.call),
        "evidence": [(EVIDENCE_LABELS.get(k, k), v) for k, v in (evidence or plan.get("evidence") or {}).items()],
        "action_label": plan.get("label") or LABELS.get(req.action, req.action),
        "events": page.events,
        "stale": page.stale,
        "expired": expired,
        "expires_in": age_text(req.expires_at - now) if is_open and not expired else "",
        "is_open": is_open,
        "live": req.status in LIVE,
        "refresh_s": REFRESH_S,
        "status_url": reverse("console:action", args=[req.pk]),
        "can_request": can_request,
        "can_decide": can_decide,
        "can_approve": can_decide and not page.stale,
        "own_request": req.status == ActionStatus.REQUESTED and approver and own,
        "reviewer": reviewer,
        "approver": approver,
        "request_form": request_form or RequestForm(initial={"plan_hash": req.plan_hash}),
        "approve_form": approve_form or ReasonForm(prefix="approve"),
        "reject_form": reject_form or ReasonForm(prefix="reject"),
        "can_withdraw": req.status == ActionStatus.REQUESTED and own and not expired,
        "withdraw_form": withdraw_form or ReasonForm(prefix="withdraw"),
        "offer_again": _offer_again(req, user, reviewer=reviewer, done=page.stale or expired, now=now),
        "preview_url": reverse("console:action-preview", args=[req.call_id, req.action]),
        "preview_evidence": evidence if req.action in EVIDENCE_ACTIONS else {},
        "error": error,
        "now": now,
    }


def _offer_again(req, user, *, reviewer: bool, done: bool, now) -> bool:
    """A request that went stale or expired is done with: a reviewer starts again from a new preview — offered only
    when the catalogue allows the action on the call as it stands now (the page never offers what the service would
    refuse). Asked only on this rare path, so a live request's page keeps its fixed statements."""
    if not reviewer or not (done or req.status in (ActionStatus.STALE, ActionStatus.EXPIRED)):
        return False
    options = action_options(req.call, user=user, now=now)
    return any(option.name == req.action and option.allowed for option in options)


def _shown_requests(action: str, requests) -> list[dict]:
    roles = REQUEST_ROLES.get(action, ())
    sent = [r for r in requests or [] if isinstance(r, dict)]
    return [_shown_request(r, roles[i] if i < len(roles) else "") for i, r in enumerate(sent)]


def _shown_request(sent: dict, role: str = "") -> dict:
    """One provider request of the plan as the page lists it (headers as rows; their secrets were masked by the
    service when it built the plan, before it was stored), with what it is for."""
    headers = sent.get("headers") if isinstance(sent.get("headers"), dict) else {}
    return {
        "role": role,
        "method": sent.get("method", ""),
        "url": sent.get("url", ""),
        "headers": sorted(headers.items()),
        "body": sent.get("body"),
        "has_body": sent.get("body") not in (None, "", {}),
    }


# --- request, approve, reject ---------------------------------------------------------------------------------------


@require_POST
@login_required
@requires(REVIEW)
def request_action(request: HttpRequest, request_id: int) -> HttpResponse:
    form = RequestForm(request.POST)
    if not form.is_valid():
        return _render(request, request_id, status=400, request_form=form)
    try:
        done = action_request(
            request_id=request_id,
            user=request.user,
            actor=Actor.for_user(request.user),
            reason=form.cleaned_data["reason"],
            plan_hash=form.cleaned_data["plan_hash"],
        )
    except Refusal as refused:
        error = place_refusal(form, refused)
        return _render(request, request_id, status=refused.status, request_form=form, error=error)
    except ActionRequest.DoesNotExist:
        raise Http404("No such action request.") from None
    messages.success(request, _after_request(done))
    return redirect("console:action", done.pk)


def _after_request(done) -> str:
    if done.status == ActionStatus.STALE:
        return "The call moved since this preview: the request is stale. Preview it again from the call page."
    if done.status == ActionStatus.REQUESTED:
        return "Requested: it waits for a second person with the approver role."
    return f"Requested and confirmed: it is now {done.status}."


@require_POST
@login_required
@requires(APPROVE)
def approve(request: HttpRequest, request_id: int) -> HttpResponse:
    return _decide(
        request, request_id, "approve", action_approve, "Approved: a worker executes it once ({status} now)."
    )


@require_POST
@login_required
@requires(REVIEW)
def withdraw(request: HttpRequest, request_id: int) -> HttpResponse:
    return _decide(
        request,
        request_id,
        "withdraw",
        action_withdraw,
        "Withdrawn: nothing will run, and nobody can approve it any more.",
    )


@require_POST
@login_required
@requires(APPROVE)
def reject(request: HttpRequest, request_id: int) -> HttpResponse:
    return _decide(
        request,
        request_id,
        "reject",
        action_reject,
        "Rejected: nothing will run. The reviewer sees your reason on this page.",
    )


def _decide(request: HttpRequest, request_id: int, verb: str, service, done: str) -> HttpResponse:
    """Approve or reject with a reason: the service decides (four eyes, stale, expired); its refusal is shown on the
    request's page next to the form it came from, and nothing changed."""
    form = ReasonForm(request.POST, prefix=verb)
    if not form.is_valid():
        return _render(request, request_id, status=400, **{f"{verb}_form": form})
    try:
        decided = service(
            request_id=request_id,
            user=request.user,
            actor=Actor.for_user(request.user),
            reason=form.cleaned_data["reason"],
        )
    except Refusal as refused:
        error = place_refusal(form, refused)
        return _render(request, request_id, status=refused.status, error=error, **{f"{verb}_form": form})
    except ActionRequest.DoesNotExist:
        raise Http404("No such action request.") from None
    messages.success(request, done.format(status=decided.status))
    return redirect("console:action", decided.pk)


# --- the approvers' queue -------------------------------------------------------------------------------------------


@require_GET
@login_required
@requires(APPROVE)
def approvals(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    rows = []
    for req in pending_approvals(now=now):
        plan = req.plan if isinstance(req.plan, dict) else {}
        checks = [c for c in plan.get("checks") or [] if isinstance(c, dict)]
        sends = [r for r in plan.get("requests") or [] if isinstance(r, dict)]
        rows.append(
            {
                "req": req,
                "label": plan.get("label") or LABELS.get(req.action, req.action),
                "sends": [f"{r.get('method', '')} {r.get('url', '')}" for r in sends],
                "failed": [c.get("check", "") for c in checks if not c.get("passed")],
                "checks": len(checks),
                "age": age_text(now - (req.requested_at or req.previewed_at)),
                "expires_in": age_text(req.expires_at - now),
                "stale": req.call.version != req.call_version,
                "own": req.requested_by_id == request.user.pk,
            }
        )
    context = {
        "rows": rows,
        "now": now,
        "limit": QUEUE_LIMIT,
        "resets": pending_breaker_resets(now=now),
        "bulks": [(bulk, LABELS.get(bulk.action, bulk.action)) for bulk in bulks_waiting(now=now)],
    }
    return render_page(request, "console/approvals.html", context)


urlpatterns = [
    path("calls/<int:call_id>/actions/<slug:action>/preview/", preview, name="action-preview"),
    path("actions/<int:request_id>/", action_page, name="action"),
    path("actions/<int:request_id>/request/", request_action, name="action-request"),
    path("actions/<int:request_id>/approve/", approve, name="action-approve"),
    path("actions/<int:request_id>/reject/", reject, name="action-reject"),
    path("actions/<int:request_id>/withdraw/", withdraw, name="action-withdraw"),
    path("approvals/", approvals, name="approvals"),
]

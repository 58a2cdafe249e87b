"""Operator actions in the console (docs/actions.md): the dry run a reviewer previews from the call page, the request's
page — its plan, checks and forbidden actions — with the request and the four-eyes decisions (their shared parts:
console/views/approvals.py), and its status block, which refreshes itself (htmx) while a worker executes it."""

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

from console.views.approvals import LABELS, ReasonForm, RequestPage, decide, decision
from console.views.common import APPROVE, REVIEW, VIEW, by_reason, place_refusal, render_page, requires
from recovery.audit.chain import Actor
from recovery.models import ActionRequest, ActionStatus, Call
from recovery.selectors.approvals import action_request_page
from recovery.selectors.facts import shown_facts
from recovery.services.action_plans import action_options
from recovery.services.actions import action_approve, action_preview, action_reject, action_request, action_withdraw
from recovery.services.errors import Refusal

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


def _context(request: HttpRequest, page, *, request_form=None, error="", **forms_) -> dict:
    req, now, user = page.request, timezone.now(), request.user
    plan = req.plan if isinstance(req.plan, dict) else {}
    four_eyes = decision(PAGE, request, req, now=now, stale=page.stale, **forms_)
    reviewer = user.has_perm(REVIEW)
    evidence = req.evidence if isinstance(req.evidence, dict) else {}
    checks = [c for c in plan.get("checks") or [] if isinstance(c, dict)]
    return {
        "mode": "request",
        "req": req,
        "call": req.call,
        "plan": plan,
        "plan_requests": _shown_requests(req.action, plan.get("requests")),
        "checks": checks,
        "failed_checks": sum(1 for c in checks if not c.get("passed")),
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
        "d": four_eyes,
        "live": req.status in LIVE,
        "refresh_s": REFRESH_S,
        "status_url": reverse("console:action", args=[req.pk]),
        "can_request": req.status == ActionStatus.PREVIEWED and reviewer and not four_eyes.expired and not page.stale,
        "reviewer": reviewer,
        "approver": user.has_perm(APPROVE),
        "request_form": request_form or RequestForm(initial={"plan_hash": req.plan_hash}),
        "offer_again": _offer_again(req, user, reviewer=reviewer, done=page.stale or four_eyes.expired, now=now),
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
        "body_text": sent.get("body_text") or "",  # a body that is not JSON, as its very bytes (a form body)
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


PAGE = RequestPage(
    thing="action",
    id_name="request_id",
    missing=ActionRequest.DoesNotExist,
    not_found="No such action request.",
    urls={
        "approve": "console:action-approve",
        "reject": "console:action-reject",
        "withdraw": "console:action-withdraw",
    },
    redraw=_render,
    after=lambda req: reverse("console:action", args=[req.pk]),
    hints=(
        (
            "approve",
            "Why it is right to run it. Enter or the Approve button sends it once you confirm (key a jumps here).",
        ),
        ("reject", "Why it must not run. Enter or the Reject button sends it once you confirm (key r jumps here)."),
        ("withdraw", "Why you take it back (the approvers and the audit trail read it)."),
    ),
    approve_note="A worker then executes it exactly once.",
)


@require_POST
@login_required
@requires(APPROVE)
def approve(request: HttpRequest, request_id: int) -> HttpResponse:
    done = "Approved: a worker executes it once ({row.status} now)."
    return decide(PAGE, request, request_id, "approve", action_approve, done)


@require_POST
@login_required
@requires(REVIEW)
def withdraw(request: HttpRequest, request_id: int) -> HttpResponse:
    done = "Withdrawn: nothing will run, and nobody can approve it any more."
    return decide(PAGE, request, request_id, "withdraw", action_withdraw, done)


@require_POST
@login_required
@requires(APPROVE)
def reject(request: HttpRequest, request_id: int) -> HttpResponse:
    done = "Rejected: nothing will run. The reviewer sees your reason on this page."
    return decide(PAGE, request, request_id, "reject", action_reject, done)


urlpatterns = [
    path("calls/<int:call_id>/actions/<slug:action>/preview/", preview, name="action-preview"),
    path("actions/<int:request_id>/", action_page, name="action"),
    path("actions/<int:request_id>/request/", request_action, name="action-request"),
    path("actions/<int:request_id>/approve/", approve, name="action-approve"),
    path("actions/<int:request_id>/reject/", reject, name="action-reject"),
    path("actions/<int:request_id>/withdraw/", withdraw, name="action-withdraw"),
]

"""The review queues (docs/console.md) and claims.

Every page needs a signed-in user with a role: the `recovery.view_call` permission every role holds, and
`recovery.review_call` (reviewers) for claims. A signed-out visitor is sent to sign-in; a signed-in user without
the permission gets 403. An htmx request gets the page's partial (the same markup the full page includes).
"""

from __future__ import annotations

from datetime import timedelta
from html import escape
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.views.decorators.http import require_GET, require_POST

from console.forms import QueueFilterForm, cursor_param
from console.views.common import REVIEW, VIEW, age_text, due_text, nav_counts, render_page, requires, url_pattern
from recovery.audit.chain import Actor
from recovery.engine.states import CallState
from recovery.models import Call
from recovery.selectors.assignments import assignees
from recovery.selectors.facts import row_facts
from recovery.selectors.observed import admission_answers
from recovery.selectors.queues import QUEUES, Queue, QueueFilters, call_row, queue_options, queue_page
from recovery.selectors.waiting import asked_for, left_unknown_since, why_waiting
from recovery.services.action_plans import ACTION_BY_NAME
from recovery.services.assignments import call_assign, call_unassign
from recovery.services.bulk import BULK_ACTIONS, BULK_MAX
from recovery.services.claims import ClaimRefused, call_claim, call_release
from recovery.services.errors import Refusal

REFRESH_S = 5
BULK_CHOICES = [(name, ACTION_BY_NAME[name].label) for name in BULK_ACTIONS]
BULK_FILTERS = (
    "state",
    "tool",
    "tenant",
    "risk",
    "age",
    "q",
    "sort",
    "assigned",
)  # what a bulk of "every row matching" keeps


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
    form = QueueFilterForm(request.GET, queue=current, tools=tools, tenants=tenants, user_id=request.user.pk)
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
    _decorate(rows, now, request.user, can_review, tools=dict(tools), tenants=dict(tenants), queue=current)
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
        "view_query": urlencode([(name, request.GET[name]) for name in BULK_FILTERS if request.GET.get(name)]),
        "stuck_after": age_text(timedelta(seconds=settings.RECOVERY_COMPENSATION_STUCK_S)),
        # Named even when empty: a name missing from the context costs the template engine a caught exception per
        # lookup, once per row here (about a third of the rows' rendering time).
        "notice": "",
        "notice_error": False,
    }
    return render_page(request, "console/queue.html", context, partial="rows", status=status)


@require_GET
@login_required
@requires(VIEW)
def counts(request: HttpRequest) -> HttpResponse:
    """The navigation's live queue counts (an htmx partial)."""
    return render(request, "console/base.html#counts", {"counts": nav_counts(request)})


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


@require_POST
@login_required
@requires(REVIEW)
def assign(request: HttpRequest, call_id: int) -> HttpResponse:
    """Assign the call to the named reviewer (`assignee`; "me" or nothing: the signed-in user), or unassign it."""
    actor = Actor.for_user(request.user)
    if request.POST.get("unassign"):
        done = call_unassign(call_id=call_id, user=request.user, actor=actor)
        return _after_claim(request, call_id, f"Call {call_id} is unassigned." if done else "It was not assigned.")
    name = (request.POST.get("assignee") or "me").strip()
    name = request.user.get_username() if name == "me" else name
    try:
        call_assign(call_id=call_id, assignee=name, user=request.user, actor=actor)
    except Refusal as refused:
        return _after_claim(request, call_id, refused.message, error=True)
    return _after_claim(request, call_id, f"Call {call_id} is assigned to {name}.")


def _decorate(
    rows: list, now, user, can_review: bool, *, tools: dict[int, str], tenants: dict[int, str], queue: Queue
) -> None:
    """What each row's cells show, computed once in Python rather than by template tags per cell (the queue page
    renders 50 rows every 5 s for every reviewer): its link, its tool's and tenant's names, its age, its last
    receipt's age, whether it is held, the claim button the user gets (claim if free, release if theirs, none if
    a colleague holds it) and, in the compensation problems queue, its latest entry. The claim buttons name the
    queue, so the row drawn again after a claim has the same cells."""
    open_url, claim_url, release_url, task_url = (
        url_pattern(name) for name in ("console:call", "console:claim", "console:release", "console:task")
    )
    if queue.compensation:
        claim_url, release_url = (f"{url}?queue={queue.slug}" for url in (claim_url, release_url))
    answers = admission_answers(row["id"] for row in rows if row["observed"])  # one statement, if any is observed
    asked = asked_for(row["id"] for row in rows if row["state"] == CallState.HUMAN_REVIEW)  # one, if any
    owners = assignees(row["id"] for row in rows)  # one, if any row
    assign_url = url_pattern("console:assign")
    for row in rows:
        pk = row["id"]
        row["open_url"] = open_url.format(pk)
        row["task_url"] = task_url.format(row["task_id"])
        row["tool_name"], row["tenant_name"] = tools.get(row["tool_id"], ""), tenants.get(row["tenant_id"], "")
        row["age"] = age_text(now - row["state_changed_at"])
        row["since"] = f"{row['state_changed_at']:%Y-%m-%d %H:%M:%S} UTC"
        row["receipt_age"] = age_text(now - row["last_receipt_at"]) if row["last_receipt_at"] else ""
        row["held"] = held = Call.claim_live(row["claimed_by_id"], row["claim_until"], now)
        row["fact"] = row_facts(row).values  # the data-value of its state and last receipt, as every page's
        row["entry"] = _entry_text(row) if queue.compensation else ""
        row["why"] = row["entry"] or why_waiting(row["state"], row["outcome"], row["checks_made"], asked.get(pk, ""))
        answer = answers.get(pk)
        row["admission"] = answer.text if answer else ""
        row["button"] = row["button_url"] = row["button_label"] = ""
        row["due"], row["overdue"] = _due(row, now, held)
        row["assignee"] = owners.get(pk, "")
        row["assign_url"] = assign_url.format(pk) if can_review and row["assignee"] != user.get_username() else ""
        if can_review and not held:
            row["button"], row["button_label"], row["button_url"] = "claim", "Claim", claim_url.format(pk)
        elif can_review and row["claimed_by_id"] == user.pk:
            row["button"], row["button_label"], row["button_url"] = "release", "Release", release_url.format(pk)
        for name in _SHOWN:
            # Escaped here, once, and marked safe: the template engine's own escape per cell (its lazy-string checks
            # and all) was a quarter of the page's time. html.escape makes the same five replacements.
            value = row[name]
            if value is not None:
                row[name] = SafeString(escape(value if isinstance(value, str) else str(value)))


def _entry_text(row: dict) -> str:
    """Why a compensation problem is listed: its latest entry's number and state (and how it ended)."""
    if row.get("entry_number") is None:
        return "no entry"
    outcome = f" ({row['entry_outcome']})" if row.get("entry_outcome") else ""
    return f"compensation {row['entry_number']}: {row['entry_state']}{outcome}"


# What a row shows as text (agents' and providers' text among it: external ids, names, statuses).
_SHOWN = (
    "id", "open_url", "task_url", "task_external_id", "task_id", "step_index", "tool_name", "tenant_name", "risk",
    "state", "since", "age", "checks_made", "receipt_age", "last_receipt_status", "holder", "button", "button_url",
    "button_label", "entry", "admission", "why", "idempotency_key", "due", "assignee", "assign_url",
)  # fmt: skip


def _due(row: dict, now, held: bool) -> tuple[str, bool]:
    return due_text(row["state"], row["risk"], row["state_changed_at"], now, held=held)


def _after_claim(request: HttpRequest, call_id: int, message: str, *, error: bool = False) -> HttpResponse:
    """htmx: the row again, as it now stands (with the message in its status cell); otherwise back to the queue."""
    if request.htmx:
        current = QUEUES.get(request.GET.get("queue", ""), QUEUES["unknown"])
        row = call_row(call_id, compensation=current.compensation)
        if row is None:
            raise Http404("No such call.")
        tools, tenants = queue_options()
        _decorate([row], timezone.now(), request.user, True, tools=dict(tools), tenants=dict(tenants), queue=current)
        context = {"row": row, "notice": message, "notice_error": error, "can_review": True}
        return render(request, "console/queue.html#row", context, status=409 if error else 200)
    (messages.error if error else messages.success)(request, message)
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = reverse("console:queue", kwargs={"slug": "unknown"})
    return redirect(target)

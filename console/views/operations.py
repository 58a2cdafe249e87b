"""The operations pages for every role (docs/breakers.md, docs/replay.md, docs/drills.md): the breakers — those that
need attention first — with retry paths and latest probes, one tool's page, the fault drills' runs; and an operator's
force open or reset of a breaker from a dry run that changes nothing, a reset then decided on its own page (the shared
four-eyes parts: console/views/approvals.py). Names, logs and results are shown as text, escaped."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.views.approvals import RequestPage, decide, decision
from console.views.common import APPROVE, REVIEW, VIEW, age_text, place_refusal, render_page, requires, url_pattern
from recovery.audit.chain import Actor
from recovery.engine.types import CLOSED, FORCED_OPEN, HALF_OPEN, OPEN
from recovery.models import BreakerOperation, BreakerOperationKind, Tool
from recovery.selectors.facts import not_closed_value
from recovery.selectors.mcp_servers import mcp_servers
from recovery.selectors.observed import runtimes
from recovery.selectors.operations import (
    ToolBreaker,
    breaker_operation_page,
    breakers_page,
    drill_run,
    drill_runs,
    tool_page,
)
from recovery.services.breaker_operations import (
    REASON_MAX,
    breaker_approve_reset,
    breaker_force_open,
    breaker_preview,
    breaker_reject_reset,
    breaker_request_reset,
)
from recovery.services.errors import Refusal

KEY_ROWS = 50  # per drill, the key rows drawn: those that failed first, then the others up to this many


# A tool whose breaker an operator forced open or reset this recently keeps its row even when idle: the next shift
# reads who did it and why without opening the history.
RECENT_OPERATION = timedelta(days=1)
# The order a breaker that needs attention is listed in: the ones that deny calls first.
_URGENCY = {FORCED_OPEN: 0, OPEN: 1, HALF_OPEN: 2}


@require_GET
@login_required
@requires(VIEW)
def breakers(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    page = breakers_page(now=now)
    attention, calling, idle = _grouped(page.tools, now)
    endpoints = [p for p in page.providers if p.state != CLOSED or p.stored != CLOSED]
    not_closed = [("tool", t.tool) for t in attention if t.state != CLOSED]
    not_closed += [("status", p.provider) for p in endpoints]
    quiet = [tool.tool for tool in page.tools if not tool.history]
    windows = {tool.policy.window_s for tool in idle}
    context = {
        "page": page,
        "attention": attention,
        "calling": calling,
        "idle": idle,
        "endpoints": endpoints,  # status-endpoint breakers not closed
        "not_closed": not_closed_value(not_closed),
        # The idle tools' common window, when they share one ("idle in the last 1 min"); else each its own.
        "idle_window_s": windows.pop() if len(windows) == 1 else None,
        "runtimes": runtimes(),
        "mcp_servers": mcp_servers(),
        "now": now,
        "quiet": quiet,
        "reviewer": request.user.has_perm(REVIEW),
        "approver": request.user.has_perm(APPROVE),
    }
    return render_page(request, "console/breakers.html", context)


def _grouped(tools: list[ToolBreaker], now) -> tuple[list[ToolBreaker], list[ToolBreaker], list[ToolBreaker]]:
    """The tools as the page lists them: those that need attention (a breaker not closed, failures in the window, a
    reset waiting for its decision), most urgent first; the closed ones with calls in their window or a recent
    operator operation; and the idle ones (closed, no call in the window), which the page folds into one line."""
    attention, calling, idle = [], [], []
    for tool in tools:
        if _needs_attention(tool, now):
            attention.append(tool)
        elif tool.window.calls or _recently_operated(tool, now):
            calling.append(tool)
        else:
            idle.append(tool)
    attention.sort(key=lambda tool: (_URGENCY.get(tool.state, 3), -(tool.window.rate or 0), tool.tool))
    return attention, calling, idle


def _needs_attention(tool: ToolBreaker, now) -> bool:
    pending = tool.pending_reset is not None and tool.pending_reset.expires_at > now
    return tool.state != CLOSED or tool.stored != CLOSED or tool.window.failures > 0 or pending


def _recently_operated(tool: ToolBreaker, now) -> bool:
    done = tool.last_operation
    return done is not None and done.applied_at is not None and now - done.applied_at < RECENT_OPERATION


# --- force open and reset ------------------------------------------------------------------------------------------

# The operations as their URLs name them.
OPERATIONS = {"force-open": BreakerOperationKind.FORCE_OPEN, "reset": BreakerOperationKind.RESET}
# How a refusal answers: bad input is a 400 next to its field, a missing role a 403, and an operation that cannot be
# done as asked (already forced open, nothing to reset, four eyes, stale, expired, decided) a 409.


class OperationForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        max_length=REASON_MAX,
        strip=True,
        error_messages={"required": "Give a reason: it is recorded with the operation and shown on the breakers page."},
    )
    confirm = forms.BooleanField(
        label="I have read what this operation does",
        error_messages={"required": "Confirm that you have read what this operation does."},
    )
    # The breaker as the dry run showed it: a reset request binds to it (the service refuses one that moved since).
    seen = forms.CharField(widget=forms.HiddenInput, max_length=100, required=False)


@require_http_methods(["GET", "POST"])
@login_required
@requires(REVIEW)
def breaker_operation(request: HttpRequest, tool_id: int, operation: str) -> HttpResponse:
    """The dry run of a force open or a reset (GET, changes nothing) and its confirmation (POST)."""
    kind = OPERATIONS.get(operation)
    if kind is None:
        raise Http404("No such breaker operation.")
    if not Tool.objects.filter(pk=tool_id).exists():
        raise Http404("No such tool.")
    if request.method == "GET":
        return _dry_run(request, tool_id, kind)
    form = OperationForm(request.POST)
    if not form.is_valid():
        return _dry_run(request, tool_id, kind, form=form, status=400)
    actor, reason = Actor.for_user(request.user), form.cleaned_data["reason"]
    try:
        if kind == BreakerOperationKind.FORCE_OPEN:
            done = breaker_force_open(tool_id=tool_id, user=request.user, actor=actor, reason=reason)
            message = f"The breaker of {done.tool.name} is forced open: admission denies its calls until a reset."
        else:
            done = breaker_request_reset(
                tool_id=tool_id, user=request.user, actor=actor, reason=reason, seen=form.cleaned_data["seen"]
            )
            message = (
                f"Reset of {done.tool.name}'s breaker requested: it waits for a second person with the approver role."
            )
    except Refusal as refused:
        error = place_refusal(form, refused)
        return _dry_run(request, tool_id, kind, form=form, error=error, status=refused.status)
    messages.success(request, message)
    return redirect(f"{reverse('console:breakers')}#tool-{tool_id}")


def _dry_run(request, tool_id: int, kind: str, *, form=None, error: str = "", status: int = 200) -> HttpResponse:
    shown = breaker_preview(tool_id=tool_id, operation=kind)
    form = form or OperationForm(initial={"seen": shown.version})
    if form.is_bound and shown.operation == BreakerOperationKind.RESET and form.data.get("seen") != shown.version:
        # The dry run drawn now is what a new request binds to.
        form.data = form.data.copy()
        form.data["seen"] = shown.version
    context = {
        "mode": "preview",
        "shown": shown,
        "kind": kind,
        "form": form,
        "error": error,
        "ttl": age_text(timedelta(seconds=settings.RECOVERY_ACTION_TTL_S)),
        "post_url": reverse("console:breaker-operation", args=[tool_id, _slug(kind)]),
        "now": timezone.now(),
    }
    return render_page(request, "console/breaker_operation.html", context, status=status)


def _slug(kind: str) -> str:
    return next(slug for slug, value in OPERATIONS.items() if value == kind)


@require_GET
@login_required
@requires(VIEW)
def breaker_operation_detail(request: HttpRequest, operation_id: int) -> HttpResponse:
    return _detail(request, operation_id)


def _detail(request, operation_id: int, *, status: int = 200, error: str = "", **forms_) -> HttpResponse:
    page = breaker_operation_page(operation_id)
    if page is None:
        raise Http404("No such breaker operation.")
    op, now = page.operation, timezone.now()
    four_eyes = decision(PAGE, request, op, now=now, **forms_)
    shown = breaker_preview(tool_id=op.tool_id, operation=op.operation) if four_eyes.pending else None
    context = {
        "mode": "operation",
        "op": op,
        "d": four_eyes,
        "events": page.events,
        "figures": op.preview if isinstance(op.preview, dict) else {},
        # A pending reset: what approving it would let through now, and whether the breaker moved since the request
        # (approving would then apply nothing).
        "shown": shown,
        "moved": shown is not None and (shown.stored, shown.updated_at) != (op.breaker_state, op.breaker_updated_at),
        "error": error,
        "now": now,
    }
    return render_page(request, "console/breaker_operation.html", context, status=status)


PAGE = RequestPage(
    thing="reset",
    id_name="operation_id",
    missing=BreakerOperation.DoesNotExist,
    not_found="No such breaker operation.",
    urls={"approve": "console:breaker-op-approve", "reject": "console:breaker-op-reject"},
    redraw=_detail,
    after=lambda op: f"{reverse('console:breakers')}#tool-{op.tool_id}",
    approve_label="Approve reset",
    hints=(
        ("approve", "Why it is right to let the calls through again."),
        ("reject", "Why the breaker must stay as it is."),
    ),
    reason_required="Give a reason: the reviewer reads it on the breakers page.",
)


@require_POST
@login_required
@requires(APPROVE)
def breaker_reset_approve(request: HttpRequest, operation_id: int) -> HttpResponse:
    done = "Reset applied: {row.tool.name}'s breaker is closed."
    return decide(PAGE, request, operation_id, "approve", breaker_approve_reset, done)


@require_POST
@login_required
@requires(APPROVE)
def breaker_reset_reject(request: HttpRequest, operation_id: int) -> HttpResponse:
    done = "Reset rejected: {row.tool.name}'s breaker stays as it is."
    return decide(PAGE, request, operation_id, "reject", breaker_reject_reset, done)


@require_GET
@login_required
@requires(VIEW)
def tool(request: HttpRequest, tool_id: int) -> HttpResponse:
    page = tool_page(tool_id)
    if page is None:
        raise Http404("No such tool.")
    return render_page(request, "console/tool.html", {"page": page, "tool": page.tool, "now": timezone.now()})


class RunsForm(forms.Form):
    """The drill list's page position: the run id the next (older) page starts below."""

    before = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1, label="Older than run")


@require_GET
@login_required
@requires(VIEW)
def drills(request: HttpRequest) -> HttpResponse:
    form = RunsForm(request.GET)
    if form.is_valid():
        page, status = drill_runs(before=form.cleaned_data["before"]), 200
    else:
        page, status = None, 400
    rows = page.rows if page else []
    run_url = url_pattern("console:drill")
    for row in rows:
        row["url"] = run_url.format(row["id"])
        row["verdict"] = _verdict(row["finished_at"], row["passed"])
        row["duration"] = _duration(row["started_at"], row["finished_at"])
        row["options_text"] = _options(row["options"])
        row["drill_names"] = ", ".join(_names(row["drills"]))
    context = {
        "form": form,
        "rows": rows,
        "next_url": f"{request.path}?before={page.next_before}" if page and page.next_before else "",
        "first_url": request.path if request.GET.get("before") else "",
    }
    return render_page(request, "console/drills.html", context, status=status)


@require_GET
@login_required
@requires(VIEW)
def drill(request: HttpRequest, run_id: int) -> HttpResponse:
    run = drill_run(run_id)
    if run is None:
        raise Http404("No such drill run.")
    call_url = url_pattern("console:call")
    results = [_result(item, call_url) for item in (run.results if isinstance(run.results, list) else [])]
    context = {
        "run": run,
        "verdict": _verdict(run.finished_at, run.passed),
        "duration": _duration(run.started_at, run.finished_at),
        "options_text": _options(run.options),
        "results": results,
        "drills_passed": sum(1 for result in results if result["passed"]),
        "missing": [name for name in _names(run.drills) if name not in {result["name"] for result in results}],
    }
    return render_page(request, "console/drill.html", context)


def _duration(started_at, finished_at) -> str:
    """How long a run took, to the second under an hour ("1 min 35 s"), else as ages are written ("2 h 5 min")."""
    if finished_at is None:
        return ""
    seconds = max(0, int((finished_at - started_at).total_seconds()))
    if seconds >= 3600:
        return age_text(finished_at - started_at)
    minutes, rest = divmod(seconds, 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _verdict(finished_at, passed: bool) -> str:
    """passed / failed / unfinished (still running, or interrupted before it stored its end)."""
    if finished_at is None:
        return "unfinished"
    return "passed" if passed else "failed"


def _options(options) -> str:
    if not isinstance(options, dict):
        return ""
    # Sorted: PostgreSQL's jsonb keeps keys in its own order, so the stored order is not the command's anyway.
    return ", ".join(f"{key} {value}" for key, value in sorted(options.items()))


def _names(value) -> list[str]:
    return [str(name) for name in value] if isinstance(value, list) else []


def _text(value) -> str:
    return "" if value is None else str(value)


def _result(item, call_url: str) -> dict:
    """One drill's stored result (recovery.devtools.drills.results.DrillResult.as_json) as the page draws it. The stored
    JSON is read defensively: a run written by an older version may lack a field."""
    item = item if isinstance(item, dict) else {}
    keys = [key for key in item.get("keys") or [] if isinstance(key, dict)]
    failed = [key for key in keys if not key.get("passed")]
    shown = (failed + [key for key in keys if key.get("passed")])[:KEY_ROWS]
    rows = []
    for key in shown:
        call_id = key.get("call_id")
        rows.append(
            {
                "key": _text(key.get("key")),
                "call_id": call_id,
                "call_url": call_url.format(call_id) if isinstance(call_id, int) else "",
                "expected_end": _text(key.get("expected_end")),
                "observed_end": _text(key.get("observed_end")),
                "expected_effects": _text(key.get("expected_effects")),
                "observed_effects": _text(key.get("observed_effects")),
                "passed": bool(key.get("passed")),
            }
        )
    checks = [
        {
            "name": _text(check.get("name")),
            "expected": _text(check.get("expected")),
            "observed": _text(check.get("observed")),
            "passed": bool(check.get("passed")),
        }
        for check in item.get("checks") or []
        if isinstance(check, dict)
    ]
    return {
        "slug": _text(item.get("slug")),
        "name": _text(item.get("name")) or _text(item.get("slug")) or "(unnamed drill)",
        "injected": _text(item.get("injected")),
        "expected": _text(item.get("expected")),
        "observed": _text(item.get("observed")),
        "passed": bool(item.get("passed")),
        "seconds": item.get("seconds"),
        "error": _text(item.get("error")),
        "keys": rows,
        "keys_total": len(keys),
        "keys_failed": len(failed),
        "keys_hidden": len(keys) - len(rows),
        "checks": checks,
    }


urlpatterns = [
    path("operations/breakers/", breakers, name="breakers"),
    path("operations/breakers/<int:tool_id>/<slug:operation>/", breaker_operation, name="breaker-operation"),
    path("operations/breaker-operations/<int:operation_id>/", breaker_operation_detail, name="breaker-op"),
    path("operations/breaker-operations/<int:operation_id>/approve/", breaker_reset_approve, name="breaker-op-approve"),
    path("operations/breaker-operations/<int:operation_id>/reject/", breaker_reset_reject, name="breaker-op-reject"),
    path("operations/tools/<int:tool_id>/", tool, name="tool"),
    path("operations/drills/", drills, name="drills"),
    path("operations/drills/<int:run_id>/", drill, name="drill"),
]

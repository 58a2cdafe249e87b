"""The operations pages (SPEC §7, §11, §15.7, §18), for every role (`recovery.view_call`): every breaker's state,
window and history with every tool's retry-path safety and latest duplicate probe, one tool's page (its retry path,
why and since when, the changes of it and its latest probes), and the fault drills' stored runs with their results
and logs.

Drill logs and results, tool and provider names are shown as text: the templates escape them like anything else an
agent, a provider or a command wrote.
"""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required, permission_required
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.views.common import VIEW, age_text, render_page, url_pattern
from recovery.selectors.operations import breakers_page, drill_run, drill_runs, tool_page

KEY_ROWS = 50  # per drill, the key rows drawn: those that failed first, then the others up to this many


@require_GET
@login_required
@permission_required(VIEW, raise_exception=True)
def breakers(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    page = breakers_page(now=now)
    quiet = [tool.tool for tool in page.tools if not tool.history]
    return render_page(request, "console/breakers.html", {"page": page, "now": now, "quiet": quiet})


@require_GET
@login_required
@permission_required(VIEW, raise_exception=True)
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
@permission_required(VIEW, raise_exception=True)
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
@permission_required(VIEW, raise_exception=True)
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
    """One drill's stored result (recovery.drills.results.DrillResult.as_json) as the page draws it. The stored JSON
    is read defensively: a run written by an older version may lack a field."""
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
    path("operations/tools/<int:tool_id>/", tool, name="tool"),
    path("operations/drills/", drills, name="drills"),
    path("operations/drills/<int:run_id>/", drill, name="drill"),
]

"""The metrics page (docs/metrics.md): every figure over a window, for one tool or all and one tenant or all.
It reads the rollups (recovery.selectors.metrics), never the history, and never folds. A bad filter is a field error
(400) and only that filter falls back to its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.charts import Chart, bar_chart
from console.views.common import VIEW, age_text, render_page, requires
from recovery.engine.metrics import DAY, HOUR
from recovery.selectors.metrics import DEFAULT_WINDOW, WINDOWS, FigureValue, Window, metrics_report
from recovery.selectors.queues import queue_options

# The queues whose sizes the page shows: (title, console:queue's slug), by recovery.selectors.metrics' names. The
# metrics' "compensation" queue is its lasting states only (partly compensated, compensation failed): the console's
# compensation problems queue also lists a COMPENSATING call whose entry needs a person, so the tile says which.
QUEUES = {
    "unknown": ("Unknown outcome", "unknown"),
    "human_review": ("Human review", "human-review"),
    "compensation": ("Compensation failed or partial", "compensation-problems"),
}
QUEUE_NAMES = {"unknown": "UNKNOWN", "human_review": "HUMAN_REVIEW", "compensation": "compensation problems"}


class MetricsFilterForm(forms.Form):
    """The page's filters, all optional and all in the URL. Tools and tenants are chosen by name: a shared link
    reads as what it shows."""

    window = forms.ChoiceField(
        required=False,
        label="Window",
        choices=[(key, f"last {window.title}") for key, window in WINDOWS.items()],
        error_messages={"invalid_choice": "Choose a window of 24 hours, 7 days or 30 days."},
    )
    tool = forms.ChoiceField(
        required=False,
        label="Tool",
        error_messages={"invalid_choice": "No tool has that name: choose one from the list, or every tool."},
    )
    tenant = forms.ChoiceField(
        required=False,
        label="Tenant",
        error_messages={"invalid_choice": "No tenant has that name: choose one from the list, or every tenant."},
    )

    def __init__(self, data, *, tools: list[tuple[int, str]], tenants: list[tuple[int, str]]) -> None:
        super().__init__(data)
        self.fields["tool"].choices = [("", "every tool"), *((name, name) for _, name in tools)]
        self.fields["tenant"].choices = [("", "every tenant"), *((name, name) for _, name in tenants)]


@dataclass(frozen=True, kw_only=True)
class FigureView:
    """One figure as the page shows it: every text already written, the chart drawn."""

    key: str
    title: str
    kind: str
    value: str  # machine-readable (data-value): a count, a share 0..1, seconds (the p95 of quantiles); "" for none
    text: str  # the number as a reader reads it: "12.5 %", "median 4 s · p95 1 min", "3 min 20 s"
    detail: str  # beneath it: "3 of 24", "17 resolved", "opened 2 times"
    labels: tuple[tuple[str, str], ...]  # (label, its count or p95)
    doc: tuple[tuple[str, bool], ...]  # the definition, in pieces: (text, is it `code`)
    chart: Chart
    rows: tuple[tuple[datetime, str], ...]  # each point's start and its value, for the table


@require_GET
@login_required
@requires(VIEW)
def metrics(request: HttpRequest) -> HttpResponse:
    tools, tenants = queue_options()
    form = MetricsFilterForm(request.GET, tools=tools, tenants=tenants)
    valid = form.is_valid()
    # An invalid field is missing from cleaned_data: it alone falls back to its default.
    window = form.cleaned_data.get("window") or DEFAULT_WINDOW
    tool = form.cleaned_data.get("tool") or ""
    tenant = form.cleaned_data.get("tenant") or ""
    tool_id = {name: pk for pk, name in tools}.get(tool)
    tenant_id = {name: pk for pk, name in tenants}.get(tenant)
    report = metrics_report(
        now=timezone.now(), window=window, tool_id=tool_id, tenant_ids=(tenant_id,) if tenant_id else None
    )
    context = {
        "form": form,
        "report": report,
        "window": report.window,
        "step": step_text(report.window),
        "tool": tool,
        "tenant": tenant,
        "figures": [figure_view(value, report.window) for value in report.figures],
        "queues": _queues(report.queues, tool_id=tool_id, tenant_id=tenant_id),
        "lag": seconds_text(report.lag_s) if report.lag_s is not None else "",
        "fold_every": settings.RECOVERY_METRICS_FOLD_EVERY_S,
    }
    return render_page(request, "console/metrics.html", context, status=200 if valid else 400)


def _queues(sizes: dict[str, int], *, tool_id: int | None, tenant_id: int | None) -> list[dict]:
    """Each queue's size now, linking to the queue with the same filters (the queue pages filter by id)."""
    scope = urlencode({name: pk for name, pk in (("tool", tool_id), ("tenant", tenant_id)) if pk})
    return [
        {
            "name": name,
            "title": QUEUES[name][0],
            "open": n,
            "url": reverse("console:queue", args=[QUEUES[name][1]]) + (f"?{scope}" if scope else ""),
            # The same queue as the navigation's and the overview's count (the whole queue, unfiltered): its fact.
            "fact": QUEUES[name][1] if name != "compensation" and not scope else "",
        }
        for name, n in sizes.items()
    ]


# --- writing the numbers ---------------------------------------------------------------------------------------------


def count_text(value: float) -> str:
    return f"{round(value):,}"


def percent_text(share: float) -> str:
    """A share as a percentage to one decimal, without a trailing ".0": "12.5 %", "50 %"."""
    return f"{100 * share:.1f}".removesuffix(".0") + " %"


def ratio_text(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def seconds_text(seconds: float) -> str:
    """A duration as a reviewer reads it: "0.4 s", "12 s", "3 min 20 s", "2 h 5 min", "3 d 4 h"."""
    if round(seconds, 1) < 60:
        return f"{seconds:.1f}".removesuffix(".0") + " s"
    whole = round(seconds)
    if whole < HOUR:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    return age_text(timedelta(seconds=whole))


def _raw(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def figure_text(value: FigureValue) -> tuple[str, str]:
    """The figure's number and the line beneath it."""
    kind = value.figure.kind
    if kind == "rate":
        shown = percent_text(value.value) if value.value is not None else "—"
        return shown, f"{value.numerator:,} of {value.denominator:,}"
    if kind == "ratio":
        shown = ratio_text(value.value) if value.value is not None else "—"
        return shown, f"{value.numerator:,} over {value.denominator:,}"
    if kind == "quantiles":
        if value.value is None or value.median is None:
            return "—", "nothing decided" if value.figure.key == "approval_wait" else "nothing resolved"
        done = "decided" if value.figure.key == "approval_wait" else "resolved"
        return f"median {seconds_text(value.median)} · p95 {seconds_text(value.value)}", f"{value.count:,} {done}"
    if kind == "duration":
        times = "time" if value.count == 1 else "times"
        return seconds_text(value.value or 0), f"opened {value.count or 0:,} {times}"
    return count_text(value.value or 0), ""


def _label_text(value: FigureValue, n: float) -> str:
    return f"p95 {seconds_text(n)}" if value.figure.kind == "quantiles" else count_text(n)


def _point_text(kind: str):
    return {
        "rate": percent_text,
        "ratio": ratio_text,
        "quantiles": seconds_text,
        "duration": seconds_text,
    }.get(kind, count_text)


def step_text(window: Window) -> str:
    """What one point of the window covers: "hour", "6 hours", "day"."""
    return "hour" if window.step == HOUR else ("day" if window.step == DAY else f"{window.step // HOUR} hours")


def _tick_format(window: Window) -> str:
    if window.step == HOUR:
        return "%H:00"
    return "%a %H:00" if window.step < DAY else "%b %d"


def figure_view(value: FigureValue, window: Window) -> FigureView:
    figure, kind = value.figure, value.figure.kind
    text = _point_text(kind)
    shown, detail = figure_text(value)
    labels = value.by_label
    if kind == "quantiles":
        labels = tuple((QUEUE_NAMES.get(queue, queue), p95) for queue, p95 in labels)
    step = step_text(window)
    chart = bar_chart(
        id=f"chart-{figure.key}",
        css="metric-chart",
        title=f"{figure.title}, per {step}, last {window.title}",
        desc=f"{figure.title}: {shown}{f' ({detail})' if detail else ''} over the last {window.title}. "
        f"The table below has the value per {step}.",
        starts=[point.start for point in value.series],
        series=[("value", "", [point.value for point in value.series])],
        text=text,
        integer=kind == "count",
        seconds=kind in ("quantiles", "duration"),
        tick_format=_tick_format(window),
    )
    return FigureView(
        key=figure.key,
        title=figure.title,
        kind=kind,
        doc=tuple((part, i % 2 == 1) for i, part in enumerate(figure.doc.split("`")) if part),
        value=_raw(value.value),
        text=shown,
        detail=detail,
        labels=tuple((label, _label_text(value, n)) for label, n in labels),
        chart=chart,
        rows=tuple((point.start, text(point.value) if point.value is not None else "—") for point in value.series),
    )


urlpatterns = [path("overview/metrics/", metrics, name="metrics")]

"""The overview (docs/console.md, "The overview"): what needs attention now, for every role.
The day's figures are as fresh as the last metrics fold, which the page says; the chart is server-drawn SVG
(console/charts.py) with the same numbers in a table.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.charts import Chart, bar_chart
from console.views.common import VIEW, age_text, render_page, requires
from console.views.metrics import figure_text, seconds_text
from recovery.selectors.facts import not_closed_value
from recovery.selectors.job_processes import job_processes
from recovery.selectors.metrics import FigureValue
from recovery.selectors.overview import HourFlow
from recovery.selectors.overview import overview as read_overview

QUEUE_TITLES = {"unknown": "Unknown outcome", "human-review": "Human review"}  # the SLA table's columns
TILE_TITLES = QUEUE_TITLES | {"compensation-problems": "Compensation problems"}


@require_GET
@login_required
@requires(VIEW)
def overview(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    data = read_overview(now=now, sla=settings.RECOVERY_SLA_S)
    queues = [
        {
            "slug": load.slug,
            "title": TILE_TITLES[load.slug],
            "open": load.open,
            "url": reverse("console:queue", args=[load.slug]),
            "oldest_age": age_text(now - load.oldest_at) if load.oldest_at else "",
            "oldest_at": load.oldest_at,
            "overdue": load.overdue,
            "due_soon": load.due_soon,
        }
        for load in data.queues
    ]
    sla = [
        {
            "risk": row.risk,
            "sla": _duration(row.sla_s),
            "cells": [
                {
                    "title": QUEUE_TITLES[slug],
                    "open": row.open[slug],
                    "breaches": row.breaches[slug],
                    "url": f"{reverse('console:queue', args=[slug])}?risk={row.risk}",
                }
                for slug in QUEUE_TITLES
            ],
        }
        for row in data.sla
    ]
    failed = sum(n for _, n in data.failures)
    entered, settled = sum(hour.entered for hour in data.flow), sum(hour.settled for hour in data.flow)
    context = {
        "now": now,
        "queues": queues,
        "sla": sla,
        "breakers": data.breakers,
        "not_closed": not_closed_value((b.kind, b.name) for b in data.breakers),
        "failures": [{"name": name, "count": n, "share": _share(n, failed)} for name, n in data.failures],
        "failed": failed,
        "attempts": data.attempts,
        "chart": flow_chart(data.flow, entered=entered, settled=settled),
        "flow": data.flow,
        "entered": entered,
        "settled": settled,
        "pending_approvals": data.pending_approvals,
        "headlines": headlines(data.headlines),
        "gateway": gateway_traffic(data.gateway),
        "since": data.since,
        "folded_at": data.folded_at,
        "jobs": job_processes(),
    }
    return render_page(request, "console/overview.html", context)


def _duration(seconds: int) -> str:
    """An SLA as configured: "15 min", "4 h", "1 h 30 min"."""
    return age_text(timedelta(seconds=seconds))


def _share(n: int, total: int) -> str:
    return f"{100 * n / total:.0f} %" if total else ""


def flow_chart(flow: list[HourFlow], *, entered: int = 0, settled: int = 0) -> Chart:
    """The entered / settled bars per hour (console/charts.py), side by side; `entered` and `settled` (the day's
    totals) go into the chart's description."""
    return bar_chart(
        id="flow",
        css="flow-chart",
        title="Calls entering and leaving UNKNOWN per hour, last 24 hours",
        desc=f"{entered} calls entered UNKNOWN and {settled} left it in the last 24 hours. "
        "The table below has the numbers per hour.",
        starts=[hour.start for hour in flow],
        series=[
            ("entered", "entered", [hour.entered for hour in flow]),
            ("settled", "settled", [hour.settled for hour in flow]),
        ],
        tip_format="%H:00",
    )


def headlines(figures: tuple[FigureValue, ...]) -> list[dict]:
    """The overview's headline figures, written as the metrics page writes them, each linking to its section there.
    Time to resolution heads with its p95 (the median goes beneath)."""
    page = reverse("console:metrics")
    shown = []
    for value in figures:
        text, detail = figure_text(value)
        if value.figure.kind == "quantiles" and value.value is not None:
            text = f"p95 {seconds_text(value.value)}"
            done = "decided" if value.figure.key == "approval_wait" else "resolved"
            detail = f"median {seconds_text(value.median or 0)} · {value.count:,} {done}"
        key = value.figure.key
        shown.append({"key": key, "title": value.figure.title, "text": text, "detail": detail, "url": f"{page}#{key}"})
    return shown


def gateway_traffic(figures: tuple[FigureValue, ...]) -> dict:
    """The MCP gateway's day: its figures as the headlines write them, by server where they count by one, and the
    holds of the day still waiting for a decision."""
    by_key = {value.figure.key: value for value in figures}
    if not by_key:
        return {"figures": [], "servers": [], "waiting": 0}
    held, decided = by_key["mcp_holds"], by_key["approval_wait"]
    return {
        "figures": headlines(figures),
        "servers": [(server, int(n)) for server, n in by_key["gateway_calls"].by_label],
        "calls": int(by_key["gateway_calls"].value or 0),
        "waiting": int(held.value or 0) - int(decided.count or 0),
    }


urlpatterns = [path("overview/", overview, name="overview")]

"""The overview (SPEC §15.2): what needs attention now, for every role (`recovery.view_call`) — open items per queue
with the age of the oldest, SLA breaches per risk (settings.RECOVERY_SLA_S), open breakers, failures by class over
the last day, and a chart of calls entering and leaving UNKNOWN per hour.

The chart is inline SVG drawn on the server (no script, no style attribute: the bars' colours come from
static/console/overview.css through classes), with the same numbers in a table beside it for screen readers and
pages read without CSS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.views.common import VIEW, age_text, render_page
from recovery.selectors.overview import HourFlow
from recovery.selectors.overview import overview as read_overview

QUEUE_TITLES = {"unknown": "Unknown outcome", "human-review": "Human review"}

# The chart's drawing box, in SVG user units (it scales with the page: viewBox, width 100 %).
WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 12, 30


@require_GET
@login_required
@permission_required(VIEW, raise_exception=True)
def overview(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    data = read_overview(now=now, sla=settings.RECOVERY_SLA_S)
    queues = [
        {
            "slug": load.slug,
            "title": QUEUE_TITLES[load.slug],
            "open": load.open,
            "url": reverse("console:queue", args=[load.slug]),
            "oldest_age": age_text(now - load.oldest_at) if load.oldest_at else "",
            "oldest_at": load.oldest_at,
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
    context = {
        "now": now,
        "queues": queues,
        "sla": sla,
        "breakers": data.breakers,
        "failures": [{"name": name, "count": n, "share": _share(n, failed)} for name, n in data.failures],
        "failed": failed,
        "attempts": data.attempts,
        "chart": flow_chart(data.flow),
        "flow": data.flow,
        "entered": sum(hour.entered for hour in data.flow),
        "settled": sum(hour.settled for hour in data.flow),
        "pending_approvals": data.pending_approvals,
    }
    return render_page(request, "console/overview.html", context)


def _duration(seconds: int) -> str:
    """An SLA as configured: "15 min", "4 h", "1 h 30 min"."""
    return age_text(timedelta(seconds=seconds))


def _share(n: int, total: int) -> str:
    return f"{100 * n / total:.0f} %" if total else ""


@dataclass(frozen=True, kw_only=True)
class Bar:
    x: str
    y: str
    width: str
    height: str
    value: int
    label: str  # the bar's tooltip (an SVG <title>)


@dataclass(frozen=True, kw_only=True)
class Tick:
    x: str = ""
    y: str = ""
    label: str


def _nice_top(peak: int) -> int:
    """The y axis' top: the smallest 1, 2 or 5 times a power of ten at or above the peak (at least 1)."""
    if peak <= 1:
        return 1
    power = 10 ** math.floor(math.log10(peak))
    for step in (1, 2, 5, 10):
        if step * power >= peak:
            return step * power
    return 10 * power


def _num(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def flow_chart(flow: list[HourFlow]) -> dict:
    """The bars, axes and labels of the entered / settled chart, in SVG user units, as strings for the template."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = _nice_top(max([hour.entered for hour in flow] + [hour.settled for hour in flow] + [0]))
    slot = plot_w / max(len(flow), 1)
    bar_w = slot * 0.38
    base = TOP + plot_h
    entered, settled, hours = [], [], []
    for i, hour in enumerate(flow):
        x = LEFT + i * slot + slot * 0.1
        stamp = f"{hour.start:%H}:00"
        for bars, value, word, offset in (
            (entered, hour.entered, "entered", 0.0),
            (settled, hour.settled, "settled", bar_w + 1),
        ):
            height = plot_h * value / top
            bars.append(
                Bar(
                    x=_num(x + offset),
                    y=_num(base - height),
                    width=_num(bar_w),
                    height=_num(height),
                    value=value,
                    label=f"{stamp} UTC: {value} {word}",
                )
            )
        if i % 3 == 0 or i == len(flow) - 1:
            hours.append(Tick(x=_num(LEFT + i * slot + slot / 2), label=stamp))
    levels = sorted({0, top // 2, top}) if top > 1 else [0, 1]
    grid = [Tick(y=_num(base - plot_h * level / top), label=str(level)) for level in levels]
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "base": _num(base),
        "label_x": LEFT - 6,
        "label_y": HEIGHT - 10,
        "entered": entered,
        "settled": settled,
        "hours": hours,
        "grid": grid,
    }


urlpatterns = [path("overview/", overview, name="overview")]

"""Time-series bar charts drawn on the server as inline SVG, for the overview and the metrics page (docs/console.md).
Geometry and text only; the CSP allows no script and no style attribute, so colours come from each page's stylesheet
through the classes named here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

# The drawing box, in SVG user units (it scales with the page: viewBox, width 100 %).
WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 12, 30
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

# Axis tops for a chart of seconds: round durations (1 s ... 30 d) rather than round numbers of seconds, so the axis
# reads "0, 30 min, 1 h" and not "0, 5000, 10000".
SECONDS_TOPS: tuple[int, ...] = (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14_400, 28_800, 43_200, 86_400, 172_800,
    259_200, 604_800, 1_209_600, 2_592_000,
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Bar:
    x: str
    y: str
    width: str
    height: str
    value: float
    label: str  # the bar's tooltip (an SVG <title>)


@dataclass(frozen=True, kw_only=True)
class Tick:
    x: str = ""
    y: str = ""
    label: str
    anchor: str = "middle"  # the label's text-anchor: the last one on the time axis ends at the plot's edge


@dataclass(frozen=True, kw_only=True)
class Series:
    name: str  # its bars' CSS class
    bars: tuple[Bar, ...]  # a point with no value (None: nothing to divide) has no bar


@dataclass(frozen=True, kw_only=True)
class Chart:
    id: str  # prefix of the ids of the svg's <title> and <desc>
    css: str  # the svg's class
    title: str  # the svg's accessible name
    desc: str
    series: tuple[Series, ...]
    grid: tuple[Tick, ...]  # horizontal lines with their value
    ticks: tuple[Tick, ...]  # the time axis' labels
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    base: str = f"{TOP + PLOT_H}"
    label_x: int = LEFT - 6
    label_y: int = HEIGHT - 10

    def bars(self, name: str) -> tuple[Bar, ...]:
        return next(series.bars for series in self.series if series.name == name)


def nice_top(peak: float, *, integer: bool = True) -> float:
    """The y axis' top: the smallest 1, 2 or 5 times a power of ten at or above the peak (at least 1 for counts;
    for fractions, e.g. rates, as small as the peak needs, and 1 when there is none)."""
    if peak <= 0 or (integer and peak <= 1):
        return 1
    power = 10 ** math.floor(math.log10(peak))
    if integer:
        power = max(power, 1)
    for step in (1, 2, 5, 10):
        # A hair of tolerance: 0.3 / 0.1 is 2.9999999999999996 in floating point, and 3 must not top out at 5.
        if step * power >= peak * (1 - 1e-9):
            return step * power
    return 10 * power


def seconds_top(peak: float) -> float:
    """The y axis' top of a chart of seconds: the first round duration at or above the peak."""
    return next((top for top in SECONDS_TOPS if top >= peak), nice_top(peak))


def _num(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _count(value: float) -> str:
    return f"{value:,.0f}"


def bar_chart(
    *,
    id: str,
    css: str,
    title: str,
    desc: str,
    starts: Sequence[datetime],
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    text: Callable[[float], str] = _count,
    integer: bool = True,
    seconds: bool = False,
    tick_format: str = "%H:00",
    tip_format: str = "%Y-%m-%d %H:%M",
) -> Chart:
    """Bars for each point of `starts` and each (name, word, values) of `series`, side by side in the point's slot,
    scaled to a round top above the tallest. `text` writes a value (bars' tooltips and the axis), `word` follows it
    in the tooltip ("13:00 UTC: 7 entered"); `integer` keeps the axis on whole numbers, `seconds` on round
    durations; the time axis labels about eight points with `tick_format` (UTC)."""
    values = [v for _, _, points in series for v in points if v is not None]
    peak = max([*values, 0])
    top = seconds_top(peak) if seconds else nice_top(peak, integer=integer)
    count = max(len(starts), 1)
    slot = PLOT_W / count
    bar_w = slot * 0.76 / max(len(series), 1)
    base = TOP + PLOT_H
    drawn = []
    for index, (name, word, points) in enumerate(series):
        bars = []
        for i, (start, value) in enumerate(zip(starts, points, strict=True)):
            if value is None:
                continue
            height = PLOT_H * value / top
            tip = f"{start:{tip_format}} UTC: {text(value)} {word}".rstrip()
            x = LEFT + i * slot + slot * 0.1 + index * (bar_w + 1)
            bars.append(
                Bar(x=_num(x), y=_num(base - height), width=_num(bar_w), height=_num(height), value=value, label=tip)
            )
        drawn.append(Series(name=name, bars=tuple(bars)))
    every = max(1, math.ceil(count / 8))
    last = len(starts) - 1  # labelled too (unless it would crowd the label before it), ending at the plot's edge
    ticks = tuple(
        Tick(x=_num(WIDTH - RIGHT), label=f"{start:{tick_format}}", anchor="end")
        if i == last and i % every
        else Tick(x=_num(LEFT + i * slot + slot / 2), label=f"{start:{tick_format}}")
        for i, start in enumerate(starts)
        if i % every == 0 or (i == last and i % every >= every / 2)
    )
    half = top // 2 if integer and not seconds else top / 2
    levels = sorted({0, half, top}) if top > 1 or not integer else [0, 1]
    grid = tuple(Tick(y=_num(base - PLOT_H * level / top), label=text(level)) for level in levels)
    return Chart(id=id, css=css, title=title, desc=desc, series=tuple(drawn), grid=grid, ticks=ticks)

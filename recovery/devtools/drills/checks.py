"""A drill's checks, written once: the expected value and the observed value; the verdict and both texts follow, e.g.
`check("waited", expected={"seconds": at_least(2.0)}, observed={"seconds": 2.31})`. Values are plain data (a dict's
keys are the labels the texts show); dicts, lists and tuples match item by item, anything else by equality, and where
equality does not fit part of the expected value is a comparison that writes its own text: at_least, at_most, one_of,
including, in_order, each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

from recovery.devtools.drills.results import CheckRow

MISSES_SHOWN = 3  # items of an `each` that did not match, shown in its observed text


@dataclass(frozen=True)
class Comparison:
    """An expected value judged by `test` rather than by equality; `text` is what the expected text says."""

    text: str
    test: Callable[[Any], bool]

    def holds(self, observed: Any) -> bool:
        try:
            return bool(self.test(observed))
        except (TypeError, ValueError):  # None or text where a number or a time was due: it does not hold
            return False

    def show(self, observed: Any, *, nested: bool = False) -> str:
        return render(observed, nested=nested)


def at_least(bound: Any) -> Comparison:
    return Comparison(f"at least {render(bound)}", lambda seen: seen >= bound)


def at_most(bound: Any) -> Comparison:
    return Comparison(f"at most {render(bound)}", lambda seen: seen <= bound)


def one_of(*choices: Any) -> Comparison:
    return Comparison(" or ".join(render(choice) for choice in choices), lambda seen: seen in choices)


def including(*members: Any) -> Comparison:
    """A collection holding all of `members` (and perhaps more)."""
    return Comparison(f"including {render(list(members))}", lambda seen: all(member in seen for member in members))


def in_order(*labels: str) -> Comparison:
    """A dict of times (or numbers) under `labels`, each strictly before the next."""

    def ordered(seen: Mapping) -> bool:
        if not isinstance(seen, Mapping):
            return False
        moments = [seen.get(label) for label in labels]
        return None not in moments and all(earlier < later for earlier, later in pairwise(moments))

    return Comparison(" before ".join(labels), ordered)


@dataclass(frozen=True)
class Each(Comparison):
    """`of` items (a dict's values, or a list's items), every one matching `expected`; the observed text counts them
    and shows the first few that do not."""

    expected: Any = None
    of: int = 0
    unit: str = ""

    def show(self, observed: Any, *, nested: bool = False) -> str:
        items = list(observed.items() if isinstance(observed, Mapping) else enumerate(observed or [], 1))
        misses = [(label, value) for label, value in items if not matches(self.expected, value)]
        text = f"{len(items) - len(misses)} of {self.of} {self.unit}"
        if len(items) != self.of:
            text += f" ({len(items)} seen)"
        shown = [f"{label}: {show(self.expected, value, nested=True)}" for label, value in misses[:MISSES_SHOWN]]
        if len(misses) > MISSES_SHOWN:
            shown.append(f"{len(misses) - MISSES_SHOWN} more")
        return "; ".join([text, *shown])


def each(expected: Any, *, of: int, unit: str) -> Each:
    def every(seen: Any) -> bool:
        values = list(seen.values() if isinstance(seen, Mapping) else seen)
        return len(values) == of and all(matches(expected, value) for value in values)

    return Each(f"{of} {unit}, each: {render(expected, nested=True)}", every, expected=expected, of=of, unit=unit)


# Judging and rendering --------------------------------------------------------------------------------------------


def matches(expected: Any, observed: Any) -> bool:
    if isinstance(expected, Comparison):
        return expected.holds(observed)
    if isinstance(expected, Mapping):
        return (
            isinstance(observed, Mapping)
            and expected.keys() == observed.keys()
            and all(matches(value, observed[label]) for label, value in expected.items())
        )
    if isinstance(expected, list | tuple):
        return (
            isinstance(observed, list | tuple)
            and len(expected) == len(observed)
            and all(matches(want, seen) for want, seen in zip(expected, observed, strict=True))
        )
    return expected == observed


def render(value: Any, *, nested: bool = False) -> str:
    """A value as the texts show it: a dict as `label: value` parts (in parentheses inside another value), a list
    as its items, None as `none`, booleans as yes / no, times to the millisecond."""
    if isinstance(value, Comparison):
        return value.text
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}".rstrip("0").rstrip(".")
    if isinstance(value, datetime):
        return value.strftime("%H:%M:%S.%f")[:-3]
    if isinstance(value, Mapping):
        return _labelled({label: render(part, nested=True) for label, part in value.items()}, nested)
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(render(item, nested=True) for item in value) or "none"
    return str(value)


def show(expected: Any, observed: Any, *, nested: bool = False) -> str:
    """The observed value's text: rendered as `render` does, but a part that a comparison judges is shown the
    comparison's way (an `each` counts its items)."""
    if isinstance(expected, Comparison):
        return expected.show(observed, nested=nested)
    if isinstance(expected, Mapping) and isinstance(observed, Mapping):
        return _labelled(
            {label: show(expected.get(label), part, nested=True) for label, part in observed.items()}, nested
        )
    if isinstance(expected, list | tuple) and isinstance(observed, list | tuple) and observed:
        wanted = list(expected) + [None] * (len(observed) - len(expected))
        return ", ".join(show(want, seen, nested=True) for want, seen in zip(wanted, observed, strict=False))
    return render(observed, nested=nested)


def _labelled(parts: dict[str, str], nested: bool) -> str:
    if not parts:
        return "none"
    if nested:
        return "(" + ", ".join(f"{label}: {text}" for label, text in parts.items()) + ")"
    return "; ".join(f"{label}: {text}" for label, text in parts.items())


def check(name: str, *, expected: Any, observed: Any) -> CheckRow:
    """The check's row: passed when `observed` matches `expected`, its two texts rendered from the values."""
    return CheckRow(
        name=name, expected=render(expected), observed=show(expected, observed), passed=matches(expected, observed)
    )

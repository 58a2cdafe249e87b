"""A scenario's checks: what it expected, what it observed, and whether the two agree, decided here and only here.
An expected value holds when the observed one equals it, or is a comparison made below (at_least, after, one_of,
only, contains, each) that holds as it says; the check's line is made from the two values, e.g.
`ok   seconds between attempts: expected each >= 2 (Retry-After), observed [2.004, 2.011]`. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any


def show(value: Any) -> str:
    """A value as a check's line says it: a moment as its time of day to the millisecond, anything else as str()."""
    if isinstance(value, datetime):
        return value.strftime("%H:%M:%S.%f")[:-3]
    return str(value)


@dataclass(frozen=True)
class Comparison:
    """An expectation that is not equality, made by one of the functions below from the value it compares against:
    `holds(observed)` decides it, and its text says it."""

    text: str
    test: Callable[[Any], bool]

    def holds(self, observed: Any) -> bool:
        return self.test(observed)

    def __str__(self) -> str:
        return self.text


def _named(text: str, what: str) -> str:
    return f"{text} ({what})" if what else text


def at_least(bound: float, what: str = "") -> Comparison:
    """No less than `bound` (`what` names it, e.g. "Retry-After")."""
    return Comparison(_named(f">= {show(bound)}", what), lambda observed: observed is not None and observed >= bound)


def after(moment: datetime | None, what: str = "") -> Comparison:
    """A moment later than `moment` (`what` names it, e.g. "the payment's receipt"); no moment is never after."""
    text = _named(f"after {show(moment)}", what)
    return Comparison(text, lambda observed: observed is not None and moment is not None and observed > moment)


def one_of(*values: Any) -> Comparison:
    """Any one of `values`."""
    return Comparison(" or ".join(map(show, values)), lambda observed: observed in values)


def only(*values: Any) -> Comparison:
    """A collection with nothing in it but `values` (an empty one too)."""
    text = f"{' or '.join(map(show, values))} only"
    return Comparison(text, lambda observed: observed is not None and all(item in values for item in observed))


def contains(item: Any) -> Comparison:
    """A collection with `item` in it."""
    return Comparison(f"contains {show(item)}", lambda observed: observed is not None and item in observed)


def each(comparison: Comparison) -> Comparison:
    """A collection, not empty, every item of which meets `comparison`."""
    return Comparison(f"each {comparison}", lambda observed: bool(observed) and all(map(comparison.holds, observed)))


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    expected: Any  # a value the observed one must equal, or a Comparison
    observed: Any

    @property
    def passed(self) -> bool:
        if isinstance(self.expected, Comparison):
            return self.expected.holds(self.observed)
        return self.expected == self.observed

    def __str__(self) -> str:
        return f"{self.name}: expected {show(self.expected)}, observed {show(self.observed)}"

    @property
    def line(self) -> str:
        """The check as a scenario's log says it: `ok   name: expected …, observed …` (or FAIL)."""
        return f"{'ok  ' if self.passed else 'FAIL'} {self}"

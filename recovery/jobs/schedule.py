"""A periodic job as data (what recovery.jobs.cron's Scheduler and recovery.jobs.inprocess's Runner both run)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Periodic:
    name: str  # at most one run of it is pending at a time
    every_s: float
    func: Callable[..., Any]
    args: tuple = ()
    # Run by the scheduler's holder itself, on a thread of its own, never by a worker: the audit checkpoint writes to
    # the holder's disk (workers may run on machines without that directory).
    in_scheduler: bool = False


def describe(periodic: Sequence[Periodic]) -> str:
    return ", ".join(f"{p.name} every {p.every_s:g} s" for p in periodic) or "nothing"

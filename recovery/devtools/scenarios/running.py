"""Running scenarios: one, with its log framed by what it expects and how it ended; or several, side by side."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from recovery.devtools.scenarios.catalogue import SCENARIOS
from recovery.devtools.scenarios.play import Log, Play, ScenarioResult

if TYPE_CHECKING:
    from recovery.devtools.drills.stage import Stage


def run_scenario(stage: Stage, name: str, log: Log) -> ScenarioResult:
    """Run one scenario; an exception ends it with `error` set instead of escaping."""
    scenario = SCENARIOS[name]
    play = Play(scenario, stage, log, number=list(SCENARIOS).index(name) + 1)
    log(f"{scenario.title}: expect {scenario.pinned_end}")
    started = time.monotonic()
    try:
        scenario.play(play)
    except Exception as exc:  # a scenario that breaks is a failed scenario, not a crashed demo
        play.result.error = f"{type(exc).__name__}: {exc}"
        for line in traceback.format_exc().rstrip().splitlines():
            log(f"  {line}")
    play.result.seconds = round(time.monotonic() - started, 1)
    verdict = "as pinned" if play.result.passed else "NOT as pinned"
    log(f"{verdict} ({play.result.score} checks, {play.result.seconds} s): {play.result.end or play.result.error}")
    return play.result


def run_scenarios(stage: Stage, names: Iterable[str] | None, log: Log) -> list[ScenarioResult]:
    """Run the named scenarios (all when `names` is empty), each line of their logs prefixed with the scenario's
    name. Those that share nothing run side by side on threads; exclusive ones (a shared breaker) run afterwards,
    one at a time. Results come back in the catalogue's order."""
    wanted = list(dict.fromkeys(names or SCENARIOS))
    unknown = [name for name in wanted if name not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    width = max(len(name) for name in wanted)
    lock = threading.Lock()

    def prefixed(name: str) -> Log:
        def write(line: str) -> None:
            with lock:
                log(f"{name:<{width}} | {line}")

        return write

    results: dict[str, ScenarioResult] = {}
    together = [name for name in wanted if not SCENARIOS[name].exclusive]
    alone = [name for name in wanted if SCENARIOS[name].exclusive]
    if together:
        with ThreadPoolExecutor(len(together), thread_name_prefix="scenario") as pool:
            futures = {name: pool.submit(run_scenario, stage, name, prefixed(name)) for name in together}
            results.update({name: future.result() for name, future in futures.items()})
    for name in alone:
        results[name] = run_scenario(stage, name, prefixed(name))
    return [results[name] for name in SCENARIOS if name in results]

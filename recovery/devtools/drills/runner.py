"""Running the fault drills of docs/drills.md on a stage, each judged against the pinned table (drills/table.py).

    with drill_stage() as stage:
        result = run_drill(stage, "timeout-after-send", log=print)
        result.passed, result.keys, result.checks

Each drill (one module of drills/cases/) drives the demo agent (recovery/devtools/agent.py) through the real API,
background jobs and sandbox process; drills/judge.py then reads back what happened from two places that share
nothing: the sandbox's ledger and request log (the provider's evidence) and the database's audit trail, attempts and
receipts (the console's). A drill passes only when every key's row and every check the table names holds.

Drills run one after another on one stage and do not lean on each other: each starts and ends with the sandbox's
faults cleared and its callbacks off (only the duplicate-callbacks drill turns them on), and uses keys, tasks and
order ids unique to the run. `expect=` runs a drill against another expectation than the table's (the tests use it
to prove that a mismatch fails).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable

from recovery.devtools.drills.cases import CASES
from recovery.devtools.drills.framework import Log, Run, missing_service
from recovery.devtools.drills.judge import judge
from recovery.devtools.drills.report import log_result
from recovery.devtools.drills.results import DrillResult
from recovery.devtools.drills.stage import Stage
from recovery.devtools.drills.table import BACKLOG_DEFAULT, DRILLS, ROUNDS_DEFAULT, Drill
from recovery.devtools.sandbox.process import SandboxProcess


def run_drills(
    stage: Stage,
    slugs: Iterable[str] | None = None,
    *,
    log: Log = print,
    backlog: int = BACKLOG_DEFAULT,
    rounds: int = ROUNDS_DEFAULT,
) -> list[DrillResult]:
    """The named drills (all by default), in the table's order, one after another on `stage`."""
    wanted = set(slugs) if slugs is not None else set(DRILLS)
    return [run_drill(stage, slug, log=log, backlog=backlog, rounds=rounds) for slug in DRILLS if slug in wanted]


def run_drill(
    stage: Stage,
    slug: str,
    *,
    log: Log = print,
    backlog: int = BACKLOG_DEFAULT,
    rounds: int = ROUNDS_DEFAULT,
    expect: Drill | None = None,
) -> DrillResult:
    """Run one drill and judge it against `expect` (the table's row by default). Never raises for a failing drill:
    an exception inside it is a FAIL with the error in the result; a drill whose service is missing is skipped
    (`skipped` says why, `passed` is False)."""
    drill = expect or DRILLS[slug]
    log(f"== {drill.name} ({slug}) ==")
    if why := missing_service(stage, drill):
        log(f"  skipped: {why}")
        return DrillResult(
            slug=slug,
            name=drill.name,
            injected=drill.injected,
            expected=drill.expected_summary(),
            observed=f"skipped: {why}",
            passed=False,
            seconds=0.0,
            skipped=why,
        )
    log(f"  injected: {drill.injected}")
    log(f"  expected: {drill.expected_end}")
    run = Run(stage, drill, log, backlog=backlog, rounds=rounds)
    began, error = time.monotonic(), ""
    try:
        _reset_sandbox(stage)
        CASES[slug](run)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        log(f"  the drill stopped: {error}")
        log("  " + "".join(traceback.format_exception(exc)[-3:]).strip().replace("\n", "\n  "))
    finally:
        try:
            _reset_sandbox(stage)
        except Exception as exc:  # the result still counts; the next drill's own reset will say what is wrong
            log(f"  could not reset the sandbox: {exc}")
    result = judge(run, slug, error, time.monotonic() - began)
    log_result(result, log)
    return result


def _reset_sandbox(stage: Stage) -> None:
    sandbox = stage.sandbox
    if isinstance(sandbox, SandboxProcess) and (sandbox.process is None or sandbox.process.poll() is not None):
        sandbox.start()  # a drill that stopped it and failed before starting it again
    sandbox.clear_faults()
    sandbox.configure(callback_url=None)

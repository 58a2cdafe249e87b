"""Running one fault drill of docs/drills.md on a stage and judging it against the pinned table (drills/table.py).
Each drill starts and ends with the sandbox's faults cleared and its callbacks off, so drills never lean on each
other; `expect=` judges a drill against another expectation than the table's (the tests prove a mismatch fails).
"""

from __future__ import annotations

import time
import traceback

from recovery.devtools.drills.cases import CASES
from recovery.devtools.drills.framework import Log, Run, missing_service
from recovery.devtools.drills.judge import judge
from recovery.devtools.drills.report import log_result
from recovery.devtools.drills.results import DrillResult
from recovery.devtools.drills.stage import Stage
from recovery.devtools.drills.table import BACKLOG_DEFAULT, DRILLS, ROUNDS_DEFAULT, Drill
from recovery.devtools.sandbox.process import SandboxProcess


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

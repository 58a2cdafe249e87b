"""How drill results read: each drill's lines in the log, and the result table of a run."""

from __future__ import annotations

from collections.abc import Callable

from recovery.devtools.drills.results import DrillResult
from recovery.models.drills import result_table as stored_result_table

ROWS_LOGGED = 12  # per-key rows printed one by one; beyond, only the ones that failed


def log_result(result: DrillResult, log: Callable[[str], None]) -> None:
    """One line per key (only the failed ones beyond ROWS_LOGGED) and per check, then the verdict."""
    shown = result.keys if len(result.keys) <= ROWS_LOGGED else [row for row in result.keys if not row.passed]
    if len(result.keys) > ROWS_LOGGED:
        good, first = sum(row.passed for row in result.keys), result.keys[0]
        log(
            f"  keys: {good} of {len(result.keys)} as expected"
            f" ({first.expected_end}; {first.expected_effects} effect(s) each)"
        )
    for row in shown[:ROWS_LOGGED]:
        whose = f"call {row.call_id}" + (f", its compensation {row.entry}" if row.entry is not None else "")
        seen = f"  key {row.key} ({whose}): {row.observed_end}, {row.observed_effects} effect(s)"
        log(f"{seen} ok" if row.passed else f"{seen} MISMATCH: expected {row.expected_end}, {row.expected_effects}")
    for check in result.checks:
        seen = f"  check: {check.name}: {check.observed}"
        log(f"{seen} ok" if check.passed else f"{seen} FAIL: expected {check.expected}")
    log(f"  {'PASS' if result.passed else 'FAIL'} in {result.seconds:.1f} s")


def result_table(results: list[DrillResult] | list[dict]) -> str:
    """drill | expected | observed | result, one line per drill, columns aligned; from results or their stored JSON
    (DrillRun.results): the same table the console's admin shows for a stored run."""
    return stored_result_table([r.as_json() if isinstance(r, DrillResult) else r for r in results])

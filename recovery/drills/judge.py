"""Judging a drill run against its table row: one row per key (its end and its effects), the checks it reported,
and the one-line summary of what was observed."""

from __future__ import annotations

from collections import Counter

from recovery.drills.evidence import call_paths, last_word
from recovery.drills.framework import Run
from recovery.drills.results import CheckRow, DrillResult, KeyRow
from recovery.drills.stage import Stage
from recovery.drills.table import ARROW, Drill
from recovery.states import CallState as S


def judge(run: Run, slug: str, error: str, seconds: float) -> DrillResult:
    """Every call's end (from its audit trail) and its key's effects (from the sandbox's ledger) against the
    table's, and the checks the table names; a check the drill did not make fails."""
    drill = run.drill
    try:
        effects = run.sandbox.ledger()["by_key"]
    except Exception as exc:
        effects, error = {}, error or f"the sandbox ledger could not be read: {exc}"
    rows = _key_rows(run, effects)
    checks = list(run.checks)
    reported = {check.name for check in checks}
    for name in drill.checks:
        if name not in reported:
            checks.append(CheckRow(name=name, expected="made", observed="not made: the drill stopped", passed=False))
    passed = not error and bool(rows) and all(row.passed for row in rows) and all(check.passed for check in checks)
    return DrillResult(
        slug=slug,
        name=drill.name,
        injected=drill.injected,
        expected=drill.expected_summary(),
        observed=observed_summary(rows, checks, error),
        passed=passed,
        seconds=round(seconds, 2),
        keys=rows,
        checks=checks,
        error=error,
    )


def rejudge(stage: Stage, result: DrillResult, expect: Drill) -> DrillResult:
    """Judge a finished drill's calls and checks again against another expectation, from the audit trail and the
    sandbox's ledger as they are now: the same evidence, another table (tests prove a wrong one fails)."""
    run = Run(stage, expect, lambda line: None)
    run.calls = [(row.key, row.call_id) for row in result.keys]
    run.checks = list(result.checks)
    return judge(run, result.slug, result.error, result.seconds)


def _key_rows(run: Run, effects: dict[str, int]) -> list[KeyRow]:
    drill = run.drill
    ids = [call_id for _, call_id in run.calls if call_id is not None]
    paths, told = call_paths(ids), last_word(ids)
    rows = []
    for key, call_id in run.calls:
        path, said = paths.get(call_id, ()), told.get(call_id, "")
        observed_effects = effects.get(key, 0)
        rows.append(
            KeyRow(
                key=key,
                call_id=call_id,
                expected_end=drill.describe_end(),
                observed_end=describe_path(path, said),
                expected_effects=drill.effects,
                observed_effects=observed_effects,
                passed=any(end.matches(path, said) for end in drill.ends) and observed_effects == drill.effects,
            )
        )
    return rows


def describe_path(path: tuple[str, ...], told: str) -> str:
    final = path[-1] if path else S.READY
    text = ARROW.join(path) if path else S.READY
    return f"{text}, told: {told}" if final in (S.READY, S.RETRYABLE) and told else text


def observed_summary(rows: list[KeyRow], checks: list[CheckRow], error: str) -> str:
    if error:
        return f"error: {error}"
    if not rows:
        return "no call was made"
    if len(rows) == 1:
        effect = rows[0].observed_effects
        text = f"{rows[0].observed_end}; {effect} effect{'s' if effect != 1 else ''}"
    else:
        ends = Counter(row.observed_end for row in rows)
        effects = Counter(row.observed_effects for row in rows)
        text = " | ".join(f"{n} x {end}" for end, n in ends.items())
        text += "; effects " + ", ".join(f"{n} x {e}" for e, n in sorted(effects.items()))
    failed = [check for check in checks if not check.passed]
    if failed:
        return f"{text}; check failed: {failed[0].name}: {failed[0].observed}"
    return f"{text}; checks {len(checks)}/{len(checks)}"

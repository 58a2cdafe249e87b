"""Judging a drill run against its table row: one row per key (its end and its effects), the checks it reported,
and the one-line summary of what was observed."""

from __future__ import annotations

from collections import Counter

from recovery.devtools.drills.evidence import EntryPath, call_paths, entry_paths, last_word
from recovery.devtools.drills.framework import Run
from recovery.devtools.drills.results import CheckRow, DrillResult, KeyRow
from recovery.devtools.drills.stage import Stage
from recovery.devtools.drills.table import ARROW, CompensationEnd, Drill, End
from recovery.engine.states import CallState as S


def judge(run: Run, slug: str, error: str, seconds: float) -> DrillResult:
    """Every call's end (from its audit trail) and its key's effects (from the sandbox's ledger) against the
    table's — and, for a drill that undoes its calls, every compensation entry's end and the effects under its own
    key — and the checks the table names; a check the drill did not make fails."""
    drill = run.drill
    try:
        effects = run.effects if run.effects is not None else run.sandbox.ledger()["by_key"]
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
    run.calls = [(row.key, row.call_id) for row in result.keys if row.entry is None]  # entries are found again
    run.roles = {row.call_id: row.step for row in result.keys if row.entry is None and row.step}
    run.checks = list(result.checks)
    return judge(run, result.slug, result.error, result.seconds)


def _key_rows(run: Run, effects: dict[str, int]) -> list[KeyRow]:
    drill = run.drill
    ids = [call_id for _, call_id in run.calls if call_id is not None]
    paths, told = call_paths(ids), last_word(ids)
    undoes = drill.compensation is not None or bool(drill.steps)
    entries = entry_paths(ids) if undoes else {}
    rows = []
    for key, call_id in run.calls:
        path, said = paths.get(call_id, ()), told.get(call_id, "")
        step = run.roles.get(call_id, "") if call_id is not None else ""
        ends, expected_effects, undo, expected_end = _expected(drill, step)
        observed_effects = effects.get(key, 0)
        rows.append(
            KeyRow(
                key=key,
                call_id=call_id,
                expected_end=expected_end,
                observed_end=describe_path(path, said),
                expected_effects=expected_effects,
                observed_effects=observed_effects,
                passed=any(end.matches(path, said) for end in ends) and observed_effects == expected_effects,
                step=step,
            )
        )
        if undoes:
            rows += _entry_rows(undo, key, call_id, entries.get(call_id, []), effects, step)
    return rows


def _expected(drill: Drill, step: str) -> tuple[tuple[End, ...], int, CompensationEnd | None, str]:
    """What the table pins for a call: (its acceptable ends, its key's effects, its compensation entry's end, the
    end as text) — the drill's own, or, for a drill of steps, the end of the call's step (a step the table does
    not name has no acceptable end)."""
    if not drill.steps:
        return drill.ends, drill.effects, drill.compensation, drill.describe_end()
    pinned = drill.step(step)
    if pinned is None:
        return (), 0, None, f"no step {step or '(unnamed)'} in the table"
    return (pinned.end,), pinned.effects, pinned.compensation, pinned.end.describe()


def _entry_rows(
    undo: CompensationEnd | None, key: str, call_id: int | None, made: list[EntryPath], effects: dict, step: str = ""
) -> list[KeyRow]:
    """The call's compensation entries, one row each under its own key: the first must end as the table says,
    and there must be no other (a missing entry is a failing row of its own; so is any entry of a call the table
    says has nothing to undo)."""
    if not made:
        if undo is None:
            return []
        return [
            KeyRow(
                key=f"{key} (no compensation entry)",
                call_id=call_id,
                expected_end=undo.describe(),
                observed_end="no entry was made",
                expected_effects=undo.effects,
                observed_effects=0,
                passed=False,
                entry=1,
                step=step,
            )
        ]
    rows = []
    for entry in made:
        observed_effects = effects.get(entry.key, 0)
        first = entry.number == 1 and undo is not None
        if undo is None:
            expected_end = f"entry {entry.number}: none (nothing to undo)"
        else:
            expected_end = undo.describe() if first else f"entry {entry.number}: none (one entry per call)"
        rows.append(
            KeyRow(
                key=entry.key,
                call_id=call_id,
                expected_end=expected_end,
                observed_end=f"entry {entry.number}: {ARROW.join(entry.path) or 'pending'}",
                expected_effects=undo.effects if first else 0,
                observed_effects=observed_effects,
                passed=first and entry.path == undo.path and observed_effects == undo.effects,
                entry=entry.number,
                step=step,
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
    entries = [row for row in rows if row.entry is not None]
    rows = [row for row in rows if row.entry is None]
    if not rows:
        return "no call was made"
    text = _calls_summary(rows)
    if entries:
        text += "; " + "; ".join(f"{row.observed_end}, {_effects(row.observed_effects)}" for row in entries[:3])
        if len(entries) > 3:
            text += f"; {len(entries) - 3} more entries"
    failed = [check for check in checks if not check.passed]
    if failed:
        return f"{text}; check failed: {failed[0].name}: {failed[0].observed}"
    return f"{text}; checks {len(checks)}/{len(checks)}"


def _effects(n: int) -> str:
    return f"{n} effect{'s' if n != 1 else ''}"


def _calls_summary(rows: list[KeyRow]) -> str:
    if len(rows) == 1:
        return f"{rows[0].observed_end}; {_effects(rows[0].observed_effects)}"
    ends = Counter(row.observed_end for row in rows)
    effects = Counter(row.observed_effects for row in rows)
    text = " | ".join(f"{n} x {end}" for end, n in ends.items())
    return text + "; effects " + ", ".join(f"{n} x {e}" for e, n in sorted(effects.items()))

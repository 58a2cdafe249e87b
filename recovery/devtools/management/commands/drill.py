"""`manage.py drill [NAME ...]`: start a stage (the API, a sandbox process, background jobs), run the fault drills
one after another, print each drill's log and a result table, store the run as a DrillRun, and exit non-zero when
any drill did not end as recovery/devtools/drills/table.py pins. Usage, options and skips: docs/drills.md.
"""

from __future__ import annotations

import os
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from recovery.devtools.drills.framework import Log
from recovery.devtools.drills.report import result_table
from recovery.devtools.drills.results import DrillResult
from recovery.devtools.drills.runner import run_drill
from recovery.devtools.drills.stage import drill_stage
from recovery.devtools.drills.table import BACKLOG_DEFAULT, DRILLS, NOT_HERE, ROUNDS_DEFAULT, find
from recovery.models import DrillRun

REQUIRE_SERVICES = os.environ.get("REQUIRE_SERVICES") == "1"


class Command(BaseCommand):
    help = (
        "Run the fault drills of docs/drills.md (all by default) against a sandbox process, the API and background "
        "jobs it starts; print each drill's log and a result table, store the run, and exit non-zero on any mismatch."
    )

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", metavar="NAME", help="drills to run, by slug or name (see --list)")
        parser.add_argument(
            "--list", action="store_true", dest="list_only", help="list the drills and what each expects, run nothing"
        )
        parser.add_argument(
            "--backlog", type=int, default=BACKLOG_DEFAULT, help="refunds the queue-backlog drill makes (1000)"
        )
        parser.add_argument("--rounds", type=int, default=ROUNDS_DEFAULT, help="rounds of the two-approvers drill (50)")
        parser.add_argument(
            "--workers", type=int, default=None, help="RQ worker processes with REDIS_URL (default 2; 1 in-process)"
        )
        parser.add_argument(
            "--api-workers",
            type=int,
            default=2,
            help="gunicorn processes serving the API (default 2); 0 serves it from threads of this process",
        )

    def handle(
        self,
        *args,
        names: list[str],
        list_only: bool,
        backlog: int,
        rounds: int,
        workers: int | None,
        api_workers: int,
        **options,
    ):
        if list_only:
            self._list()
            return
        slugs = _slugs(names)
        workers = _checked_options(backlog, rounds, workers, api_workers)
        lines: list[str] = []

        def log(line: str) -> None:
            self.stdout.write(line)
            lines.append(line)

        run = DrillRun.objects.create(
            drills=[DRILLS[slug].name for slug in slugs],
            options={
                "backlog": backlog,
                "rounds": rounds,
                "workers": workers,
                "api_workers": api_workers,
                "database": connection.vendor,
            },
        )
        results: list[DrillResult] = []
        began, failure = time.monotonic(), ""
        try:
            with drill_stage(workers=workers, api_workers=api_workers) as stage:
                run.jobs = stage.jobs[:200]
                run.save(update_fields=["jobs"])
                log(
                    f"drill run {run.pk}: API {stage.api_url}, sandbox {stage.sandbox.url}, {stage.jobs},"
                    f" database {connection.vendor}; keys end in -{stage.run_id}"
                )
                for slug in slugs:
                    results.append(run_drill(stage, slug, log=log, backlog=backlog, rounds=rounds))
        except KeyboardInterrupt:
            failure = "interrupted"
        except Exception as exc:  # the stage could not start (or stop): stored with the run, then reported
            failure = f"{type(exc).__name__}: {exc}"
        finally:
            passed, failure = _store(run, slugs, results, failure, log, lines)
        self._summary(run, slugs, results, passed, failure, time.monotonic() - began)

    def _summary(
        self, run: DrillRun, slugs: list[str], results: list[DrillResult], passed: bool, failure: str, seconds: float
    ) -> None:
        """The closing line; CommandError naming what failed when the run did not pass."""
        skipped = {result.name: result.skipped for result in results if result.skipped}
        ran = [result for result in results if not result.skipped]
        good = sum(result.passed for result in results)
        summary = (
            f"{good} of {len(slugs)} drills passed in {seconds:.0f} s"
            + (f", {len(skipped)} skipped ({'; '.join(skipped)})" if skipped else "")
            + f"; stored as drill run {run.pk} (/operations/drills/{run.pk}/ in the console)"
        )
        if not passed:
            failed = [result.name for result in ran if not result.passed]
            raise CommandError(f"{summary}; failed: {', '.join(failed) or failure}")
        self.stdout.write(self.style.SUCCESS(summary))

    def _list(self) -> None:
        for drill in DRILLS.values():
            self.stdout.write(f"{drill.slug:<20} {drill.name}: {drill.injected}")
            self.stdout.write(f"{'':<20} expected: {drill.expected_end}")
            for step in drill.steps:
                self.stdout.write(f"{'':<20} step {step.describe()}")
            if not drill.steps:
                self.stdout.write(f"{'':<20} each call: {drill.describe_end()}; {drill.effects} effect(s) per key")
            if drill.compensation is not None:
                undo = drill.compensation
                self.stdout.write(
                    f"{'':<20} its compensation: {undo.describe()}; {undo.describe_effects()} under its own key"
                )
            if drill.needs:
                what = "the MCP servers of make test" if drill.needs == "mcp" else f"{drill.needs.upper()}_URL"
                self.stdout.write(f"{'':<20} needs: {what} (skipped with the reason without it)")
        for name, why in NOT_HERE.items():
            self.stdout.write(f"{'(not run here)':<20} {name}: {why}")


def _slugs(names: list[str]) -> list[str]:
    """The drills asked for by slug or name (all without names), always in the table's order."""
    try:
        wanted = {find(name).slug for name in names} or set(DRILLS)
    except KeyError as exc:
        raise CommandError(exc.args[0]) from None
    return [slug for slug in DRILLS if slug in wanted]


def _checked_options(backlog: int, rounds: int, workers: int | None, api_workers: int) -> int:
    """CommandError for an option out of range; the RQ workers to start (2 with REDIS_URL, else 1, unless given)."""
    if backlog < 1:
        raise CommandError("--backlog must be at least 1")
    if rounds < 1:
        raise CommandError("--rounds must be at least 1")
    if workers is not None and workers < 1:
        raise CommandError("--workers must be at least 1")
    if api_workers < 0:
        raise CommandError("--api-workers must be 0 or more")
    return workers or (2 if settings.REDIS_URL else 1)


def _store(
    run: DrillRun, slugs: list[str], results: list[DrillResult], failure: str, log: Log, lines: list[str]
) -> tuple[bool, str]:
    """Log the table and complete the stored run (whatever stopped it): whether it passed, and its failure if any."""
    if failure:
        log(f"the run stopped: {failure}")
    log("")
    log(result_table(results))
    skipped = {result.name: result.skipped for result in results if result.skipped}
    if skipped and REQUIRE_SERVICES:
        failure = failure or f"REQUIRE_SERVICES=1 but {'; '.join(skipped.values())}"
    ran = [result for result in results if not result.skipped]
    passed = not failure and len(results) == len(slugs) and all(result.passed for result in ran)
    run.finished_at = timezone.now()
    run.passed = passed
    # A skipped drill is not a result: the console shows it as not run; why is in the options and the log.
    run.results = [result.as_json() for result in ran]
    if skipped:
        run.options = {**run.options, "skipped": skipped}
    run.log = DrillRun.cut_log("\n".join(lines))
    run.save(update_fields=["finished_at", "passed", "results", "log", "options"])
    return passed, failure

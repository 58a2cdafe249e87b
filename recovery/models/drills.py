"""Drill runs (docs/drills.md): what each `manage.py drill` ran and how it was judged."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class DrillRun(models.Model):
    """One run of `manage.py drill` (docs/drills.md): the drills it ran and, per drill, each key's expected and observed
    end and effects and each check, as recovery/devtools/drills/judge.py judged them. Written when the run starts (so an
    interrupted run shows, unfinished) and completed when it ends; never changed afterwards.
    """

    drills = models.JSONField(default=list)  # the drills' names, in the order run
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)  # None: still running, or interrupted
    passed = models.BooleanField(default=False)  # every drill passed (never True for an unfinished run)
    results = models.JSONField(default=list, blank=True)  # per drill: expected, observed, keys, checks, passed
    jobs = models.CharField(max_length=200, blank=True)  # how background jobs ran (RQ workers or in-process)
    options = models.JSONField(default=dict, blank=True)  # backlog size, workers, database
    log = models.TextField(blank=True)  # what the command printed, its middle cut beyond LOG_LIMIT characters

    LOG_LIMIT = 200_000

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["started_at"], name="drillrun_started_idx")]

    def __str__(self) -> str:
        verdict = "running" if self.finished_at is None else ("passed" if self.passed else "FAILED")
        return f"drill run {self.pk} ({', '.join(self.drills) or 'no drills'}): {verdict}"

    @classmethod
    def cut_log(cls, text: str) -> str:
        """The log as stored: its head and tail when it is longer than LOG_LIMIT characters."""
        if len(text) <= cls.LOG_LIMIT:
            return text
        half = cls.LOG_LIMIT // 2
        return f"{text[:half]}\n… {len(text) - 2 * half} characters cut …\n{text[-half:]}"

    def result_table(self) -> str:
        """The run's result table, as `manage.py drill` printed it (the admin shows it)."""
        return result_table(self.results)


def result_table(stored: list[dict]) -> str:
    """drill | expected | observed | result, one line per drill, columns aligned, from stored results (each drill's
    DrillResult.as_json())."""
    rows = [("drill", "expected", "observed", "result")]
    rows += [(r["name"], r["expected"], r["observed"], _verdict(r)) for r in stored]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for n, row in enumerate(rows):
        lines.append(" | ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)))
        if n == 0:
            lines.append("-+-".join("-" * width for width in [*widths, len("result")]))
    return "\n".join(lines)


def _verdict(result: dict) -> str:
    if result.get("skipped"):
        return "skipped"
    return "pass" if result["passed"] else "FAIL"

"""Reads of duplicate probes (docs/replay.md) for the pages that show a tool: each tool's latest probe, one tool's
latest probes, and the audit trail's record of its retry path changing. Each is one statement whatever the number of
tools or probes; a probe's stored requests and answers are read only where a page shows them (one tool's page).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from recovery.audit.actions import AuditAction
from recovery.models import AuditEvent, DuplicateProbe

PROBES_SHOWN = 20  # a tool's page: its newest probes, this many
CHANGES_SHOWN = 10  # ... and its retry path's newest changes

_NEWEST = (F("created_at").desc(), F("pk").desc())


def latest_probe_per_tool() -> dict[int, DuplicateProbe]:
    """Every tool's newest probe, whatever it decided (an inconclusive one too), keyed by tool id. One statement:
    ROW_NUMBER() per tool keeps the newest of each; the stored requests and answers are not read."""
    rows = (
        DuplicateProbe.objects.annotate(rank=Window(RowNumber(), partition_by=[F("tool_id")], order_by=_NEWEST))
        .filter(rank=1)
        .defer("request", "response")
    )
    return {probe.tool_id: probe for probe in rows}


def tool_probes(tool_id: int, *, limit: int = PROBES_SHOWN) -> tuple[list[DuplicateProbe], bool]:
    """The tool's newest `limit` probes, newest first, and whether older ones exist. One statement."""
    rows = list(DuplicateProbe.objects.filter(tool_id=tool_id).order_by(*_NEWEST)[: limit + 1])
    return rows[:limit], len(rows) > limit


@dataclass(frozen=True, kw_only=True)
class RetryPathChange:
    """One change of a tool's retry path, as the audit trail recorded it (recovery.services.probes.set_retry_path)."""

    seq: int
    at: datetime
    from_state: str
    to_state: str
    reason: str
    actor: str
    probe_id: int | None


def retry_path_changes(tool_name: str, *, limit: int = CHANGES_SHOWN) -> list[RetryPathChange]:
    """The tool's newest retry-path changes, newest first. One statement (audit_action_idx bounds it to the events
    of that action; their evidence names the tool)."""
    rows = (
        AuditEvent.objects.filter(action=AuditAction.RETRY_PATH_CHANGED, evidence__tool=tool_name)
        .order_by("-seq")
        .values("seq", "created_at", "from_state", "to_state", "reason", "actor_label", "evidence")[:limit]
    )
    return [
        RetryPathChange(
            seq=row["seq"],
            at=row["created_at"],
            from_state=row["from_state"],
            to_state=row["to_state"],
            reason=row["reason"],
            actor=row["actor_label"],
            probe_id=_probe_id(row["evidence"]),
        )
        for row in rows
    ]


def _probe_id(evidence) -> int | None:
    probe = evidence.get("probe") if isinstance(evidence, dict) else None
    return probe if isinstance(probe, int) and not isinstance(probe, bool) else None

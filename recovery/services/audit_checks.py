"""Verifying the audit trail on an operator's request (docs/design/audit.md), with the check itself recorded.

`audit_verify` is a write — it appends an `audit.verified` event — so it is for the explicit "Verify" action. A page
that only wants to show whether a chain holds calls `recovery.audit.chain.verify_chain` directly and records nothing.
"""

from __future__ import annotations

import re

from django.db import transaction

from recovery.audit.actions import AuditAction
from recovery.audit.chain import SYSTEM_CHAIN, Actor, AuditReport, append_event, verify_in_one_snapshot

ALL = "all"  # recovery.audit.chain.verify_in_one_snapshot's scope for the whole trail
_TASK_CHAIN = re.compile(r"task:[1-9][0-9]{0,18}", re.ASCII)


def audit_verify(*, scope: str, actor: Actor, using: str = "default") -> AuditReport:
    """Verify the whole trail (scope "all") or one chain ("task:<id>", "system"), then record who checked what and
    what was found as an `audit.verified` event. Raises ValueError for any other scope.

    The record goes to the system chain whatever the scope: checking is an act on the trail, not on a task, and the
    system chain is never purged, so the history of checks outlives a task chain's retention. Its evidence names the
    scope. It is appended after the check, in its own transaction: the check covers the trail as it stood before.
    """
    if scope != ALL and scope != SYSTEM_CHAIN and not _TASK_CHAIN.fullmatch(scope):
        raise ValueError(f"scope must be {ALL!r}, {SYSTEM_CHAIN!r} or 'task:<id>', not {scope!r}")
    report = verify_in_one_snapshot(scope, using)
    outcome = "intact" if report.ok else f"BROKEN: {report.problem}"
    with transaction.atomic(using=using):
        append_event(
            action=AuditAction.AUDIT_VERIFIED,
            actor=actor,
            reason=f"verified {'the whole trail' if scope == ALL else scope}: {outcome}"[:500],
            evidence={
                "scope": scope,
                "events": report.events,
                "chains": report.chains,
                "ok": report.ok,
                "problem": report.problem,
            },
            using=using,
        )
    return report

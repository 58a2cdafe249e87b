"""Status API down (docs/drills.md), on two refund tools: refund.create (never probed) goes to a person at the poll
budget; refund.replayed, once a duplicate probe run through the console's action flow has proved its retry path safe
for keys PROBE_KEY_AGE_S old, is settled by reconciliation's one same-key replay (docs/replay.md), no person.
"""

from __future__ import annotations

from datetime import timedelta

from recovery.devtools.drills.cases.shared import (
    approved_probe,
    check_one_request,
    check_probe_approved,
    committed_refund,
    probe_of,
    probe_seen,
    unconfirmed_refund,
    write_outcomes,
)
from recovery.devtools.drills.checks import at_least, each, one_of
from recovery.devtools.drills.evidence import attempts
from recovery.devtools.drills.framework import Run, sleep_until
from recovery.devtools.drills.stage import REPLAYED_REFUND
from recovery.devtools.drills.table import ARROW, PROBED, REPLAYED, UNPROBED
from recovery.models import ActionRequest, Call, Receipt, RetryPath
from recovery.services.attempts import REPLAY_ATTEMPT_ID

# The probed key's age at the probe, at least: a safe probe covers replays of keys younger than it proved (the gate's
# replay_key_too_old), and the replayed refund's key is a second or two old when its first check fails.
PROBE_KEY_AGE_S = 8


def play(run: Run) -> None:
    # The probe's target first, so its key has aged by the time refund.create's part is over.
    probed = committed_refund(
        run, "probed", goal="refund an order (a duplicate probe replays it)", tool=REPLAYED_REFUND, step=PROBED, n=2
    )
    _unprobed(run)
    request = _probe_when_old_enough(run, probed.call_id)
    _, _, replayed = unconfirmed_refund(
        run,
        "replayed",
        goal="refund an order the provider cannot confirm, with a probe-proven retry path",
        tool=REPLAYED_REFUND,
        step=REPLAYED,
        n=3,
    )
    check_probe_approved(run, request)
    _check_probe_safe(run, request, replayed.call_id)
    _check_replayed(run, replayed.call_id)
    run.check(
        "2 write requests for the replayed key: the lost one and the replay",
        expected={
            "refund requests under the key": ["dropped_after_commit", "replayed"],
            "status queries answered": [503],
        },
        observed={
            "refund requests under the key": write_outcomes(run, replayed.key),
            "status queries answered": _status_answers(run, replayed.key),
        },
    )


def _unprobed(run: Run) -> None:
    """refund.create: every check fails and counts, and the poll budget sends the call to a person."""
    _, _, result = unconfirmed_refund(
        run, "status-down", goal="refund an order the provider cannot confirm", step=UNPROBED
    )
    key = result.key

    check_one_request(run, key, step=UNPROBED)
    call = Call.objects.select_related("tool").get(pk=result.call_id)
    budget = (call.tool.reconcile or {}).get("max_checks") or 0
    receipts = Receipt.objects.filter(call=call, source="poll").order_by("id").values_list("observed", flat=True)
    run.check(
        "every check failed and counted toward the poll budget",
        expected={
            "checks made": budget,
            "poll receipts": each(one_of("failed", "unreachable"), of=budget, unit="receipts"),
            "status queries answered": [503],
            "outcome": "poll_budget_exhausted",
        },
        observed={
            "checks made": call.checks_made,
            "poll receipts": list(receipts),
            "status queries answered": _status_answers(run, key),
            "outcome": call.outcome,
        },
    )


def _probe_when_old_enough(run: Run, call_id: int) -> ActionRequest:
    """Wait until the probed refund's key is PROBE_KEY_AGE_S old, then probe it through the action flow."""
    (first, *_) = attempts(call_id)
    sleep_until(first.admitted_at + timedelta(seconds=PROBE_KEY_AGE_S + 0.2))
    return approved_probe(run, call_id, reason="drill: prove the retry path before reconciliation may replay")


def _check_probe_safe(run: Run, request: ActionRequest, replayed_id: int) -> None:
    """The probe found one effect for the key and an idempotent replay: the tool's retry path is safe, for keys at
    least as old as the replayed refund's was when reconciliation replayed it, and it was safe before that."""
    probe = probe_of(request)
    made = attempts(replayed_id)
    replay = next((a for a in made if a.attempt_id == REPLAY_ATTEMPT_ID), None)
    first_sent = made[0].admitted_at if made else None  # the key's age counts from here, as the gate's does
    replayed_age = int((replay.admitted_at - first_sent).total_seconds()) if replay and first_sent else None
    covered = f"{probe.key_age_s} s" if probe else "nothing"
    run.log(f"  the probe covered keys up to {covered}; the replayed key was {replayed_age} s old at its replay")
    run.check(
        "the probe proved the retry path safe for keys as old as the replayed one",
        expected={
            "probe": {
                "second": "idempotent_replay",
                "downstream audit": "one_effect",
                "effects": {"observed": 1, "expected": 1},
                "decision": "retry_path_safe",
                "tool's retry path": {"now": RetryPath.SAFE, "set by this probe": True},
            },
            "probed key's age (s)": at_least(PROBE_KEY_AGE_S),
            "probed before the replayed refund was sent": True,
            "replayed key's age (s), below the probed": True,
        },
        observed={
            "probe": probe_seen(probe),
            "probed key's age (s)": probe.key_age_s if probe else None,
            "probed before the replayed refund was sent": bool(probe and first_sent and probe.created_at < first_sent),
            "replayed key's age (s), below the probed": bool(probe and replayed_age is not None)
            and replayed_age < probe.key_age_s,
        },
    )


def _check_replayed(run: Run, call_id: int) -> None:
    """One failed status check, then the one same-key replay, recorded as an attempt of reconciliation's own and a
    receipt `idempotent_replay` that moved the call to COMMITTED; nobody acted on it."""
    receipts = Receipt.objects.filter(call_id=call_id).order_by("id")
    replay = [REPLAY_ATTEMPT_ID]
    run.check(
        "COMMITTED by one idempotent_replay receipt, no person",
        expected={
            "receipts": [
                {"source": "poll", "observed": "failed", "moved": "UNKNOWN → STILL_UNKNOWN"},
                {"source": "idempotent_replay", "observed": "committed", "moved": "STILL_UNKNOWN → COMMITTED"},
            ],
            "attempts after the agent's": replay,
            "replay marked": True,
            "operator actions": 0,
        },
        observed={
            "receipts": [
                {
                    "source": r.source,
                    "observed": r.observed,
                    "moved": ARROW.join((r.local_state_before, r.local_state_after)),
                }
                for r in receipts
            ],
            "attempts after the agent's": [a.attempt_id for a in attempts(call_id)[1:]],
            "replay marked": Call.objects.filter(pk=call_id, replay_reconciled_at__isnull=False).exists(),
            "operator actions": ActionRequest.objects.filter(call_id=call_id).count(),
        },
    )


def _status_answers(run: Run, key: str) -> list[int]:
    return sorted({entry["status"] for entry in run.sandbox.requests(key=key, path_prefix="/refunds/by-key/")})

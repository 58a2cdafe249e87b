"""Provider ignores keys (docs/drills.md): the sandbox's `ignore_keys` mode for one key of refund.ignores-keys; an
approved duplicate probe finds two refunds and marks the retry path unsafe, after which no same-key replay comes from
reconciliation, an operator or the runtime.
"""

from __future__ import annotations

from recovery.audit.chain import Actor
from recovery.devtools.drills.cases.shared import (
    approved_probe,
    check_probe_approved,
    committed_refund,
    probe_of,
    probe_seen,
    unconfirmed_refund,
    write_outcomes,
)
from recovery.devtools.drills.checks import each, including
from recovery.devtools.drills.evidence import attempts
from recovery.devtools.drills.framework import Run
from recovery.devtools.drills.stage import KEYLESS_REFUND, drill_people
from recovery.devtools.drills.table import LOST_BEFORE_COMMIT, PROBED, REPLY_LOST
from recovery.models import Call, GateDecision, Receipt, ReceiptSource, RetryPath
from recovery.services.actions import action_preview
from recovery.services.errors import Refusal


def play(run: Run) -> None:
    key, _ = run.refund_args("ignored", 1)
    run.sandbox.fault(route="/refunds", key=key, kind="ignore_keys")  # every request under the key executes anew
    probed = committed_refund(
        run, "ignored", goal="refund an order (a duplicate probe replays it)", tool=KEYLESS_REFUND, step=PROBED, n=1
    )
    request = approved_probe(run, probed.call_id, reason="drill: does the provider deduplicate by key?")
    _, _, lost = unconfirmed_refund(
        run,
        "ignored-lost",
        goal="refund an order the provider cannot confirm, on a tool whose retry path is unsafe",
        tool=KEYLESS_REFUND,
        step=REPLY_LOST,
        n=2,
    )
    dropped = _lost_before_commit(run)

    check_probe_approved(run, request)
    probe = probe_of(request)
    run.check(
        "the probe says retry_path_unsafe",
        expected={
            "second": "new_business_id",
            "downstream audit": "second_effect",
            "effects": {"observed": 2, "expected": 1},
            "decision": "retry_path_unsafe",
            "tool's retry path": {"now": RetryPath.UNSAFE, "set by this probe": True},
        },
        observed=probe_seen(probe),
    )
    ledger = run.sandbox.ledger(key)["entries"]
    run.check(
        "the probe's second effect is in the provider's ledger",
        expected={
            "refund requests under the key": ["answered", "answered"],
            "refunds in the ledger": 2,
            "their ids: the call's, then the probe's": True,
        },
        observed={
            "refund requests under the key": write_outcomes(run, key),
            "refunds in the ledger": len(ledger),
            "their ids: the call's, then the probe's": probe is not None
            and [entry["provider_ref"] for entry in ledger] == [probe.first_business_id, probe.second_business_id],
        },
    )
    _check_not_replayed(run, lost.call_id, lost.key)
    _check_operator_refused(run, lost.call_id)
    _check_retry_denied(run, dropped.call_id, dropped.key)


def _lost_before_commit(run: Run):
    """A refund held past the client's read timeout and dropped unexecuted (as the lost-before-commit drill's): a
    receipt proves it not committed, and the runtime asks for its same-key retry with state_verified."""
    key, arguments = run.refund_args("ignored-dropped", 3)
    read_timeout_s = float(run.stage.registry["providers"][0].get("read_timeout_s", 5))
    run.sandbox.fault(route="/refunds", key=key, kind="latency", ms=int(read_timeout_s * 1000) + 500, times=1)
    run.sandbox.fault(route="/refunds", key=key, kind="drop_before_commit", times=1)
    agent = run.agent()
    task_id, result = run.refund(
        agent,
        key,
        arguments,
        task="drill-ignored-dropped",
        goal="refund an order whose request is lost, on a tool whose retry path is unsafe",
        tool=KEYLESS_REFUND,
        step=LOST_BEFORE_COMMIT,
    )
    agent.submit(task_id, f"refund {result.outcome}: {result.detail}")
    return result


def _check_not_replayed(run: Run, call_id: int, key: str) -> None:
    """Reconciliation asked the status API each time and never replayed the key: no replay mark, no second attempt,
    no `idempotent_replay` receipt, one write request under the key; the poll budget ended it."""
    call = Call.objects.select_related("tool").get(pk=call_id)
    budget = (call.tool.reconcile or {}).get("max_checks") or 0
    receipts = list(Receipt.objects.filter(call=call).order_by("id").values_list("source", "observed"))
    run.check(
        "reconciliation never replayed the lost reply",
        expected={
            "receipts": each(("poll", "failed"), of=budget, unit="receipts"),
            "replay marked": False,
            "attempts": 1,
            "refund requests under the key": ["dropped_after_commit"],
            "outcome": "poll_budget_exhausted",
        },
        observed={
            "receipts": receipts,
            "replay marked": call.replay_reconciled_at is not None,
            "attempts": len(attempts(call_id)),
            "refund requests under the key": write_outcomes(run, key),
            "outcome": call.outcome,
        },
    )
    if any(source == ReceiptSource.IDEMPOTENT_REPLAY for source, _ in receipts):
        run.log("  an idempotent_replay receipt was stored: reconciliation replayed the key")


def _check_operator_refused(run: Run, call_id: int) -> None:
    """The drill reviewer cannot even preview a same-key replay of the refund left in HUMAN_REVIEW: replay is
    switched off for the tool (the console's catalogue says so; nothing is stored, nothing sent)."""
    reviewer = drill_people().reviewer
    refused, why = "", ""
    try:
        action_preview(call_id=call_id, action="replay_same_key", user=reviewer, actor=Actor.for_user(reviewer))
    except Refusal as exc:
        refused, why = exc.code, exc.message
    run.log(f"  replay_same_key preview: {refused or 'allowed'}{f' ({why})' if why else ''}")
    run.check(
        "an operator's same-key replay is refused",
        expected={"call": "HUMAN_REVIEW", "preview refused": "forbidden", "because replay is switched off": True},
        observed={
            "call": Call.objects.values_list("state", flat=True).get(pk=call_id),
            "preview refused": refused or None,
            "because replay is switched off": why.startswith("replay is switched off for this tool"),
        },
    )


def _check_retry_denied(run: Run, call_id: int, key: str) -> None:
    """A receipt proved the dropped refund not committed, and the runtime's same-key retry with that evidence was
    denied at the retry path (after the evidence held): `retry_path_unsafe`, then stop. Nothing was sent again."""
    proof = Receipt.objects.filter(call_id=call_id, applied=True, observed="not_committed").first()
    denials = GateDecision.objects.filter(call_id=call_id, dry_run=False, allowed=False).order_by("id")
    denial = denials.last()
    failed = [c.get("name") for c in (denial.checks if denial else []) if not c.get("passed")]
    run.check(
        "the runtime's retry after state_verified is denied retry_path_unsafe",
        expected={
            "not_committed receipt before the retry": True,
            "denials": 1,
            "denial": {
                "evidence claimed": including("state_verified"),
                "reason": "retry_path_unsafe",
                "failed check": ["retry_path"],
                "then": "stop",
            },
            "attempts": 1,
            "refund requests under the key": ["dropped_before_commit"],
        },
        observed={
            "not_committed receipt before the retry": bool(proof and denial and proof.checked_at < denial.created_at),
            "denials": denials.count(),
            "denial": {
                "evidence claimed": (denial.candidate or {}).get("evidence", []) if denial else None,
                "reason": denial.reason if denial else None,
                "failed check": failed,
                "then": (denial.required_next or {}).get("action") if denial else None,
            },
            "attempts": len(attempts(call_id)),
            "refund requests under the key": write_outcomes(run, key),
        },
    )

"""Background jobs: thin functions (an id in, a service call), enqueued through recovery.jobs.queueing.

The periodic ones run on the schedule of recovery/jobs/cron.py; the others are enqueued on commit by the services and
the API (`reconcile_now` when writes turn UNKNOWN, `reconcile_call` for the immediate check of one call a runtime
asks for, `execute_action` for an approved operator action, `execute_bulk` for an approved bulk action).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.audit.checkpoints import CheckpointRefused, checkpoint_write
from recovery.jobs.queueing import enqueue_now, kick_started, worker_name
from recovery.services import (
    actions,
    breaker_operations,
    bulk,
    compensations,
    metrics,
    notifications,
    notify_send,
    reconcile,
    retention,
    sagas,
    sweeper,
    tasks,
)

logger = logging.getLogger("recovery.jobs")


def reconcile_due() -> int:
    """Periodic: check every UNKNOWN / STILL_UNKNOWN / ACCEPTED call whose next check is due, then the compensation
    entries whose check or resend is due (docs/compensation.md: the same schedule as any unknown write)."""
    worker = worker_name()
    settled = reconcile.reconcile_due(worker=worker) + compensations.compensations_run_due(worker=worker)
    return settled + sagas.sagas_advance_due()


def reconcile_now(name: str, token: str) -> int:
    """A sweep run at once when writes turn UNKNOWN (recovery.services.outcomes.check_at_once): the same checks as the
    periodic reconcile_due, on the same bounded runner, so a burst is checked RECOVERY_CHECKS_IN_FLIGHT at a time.
    At most one run waits to start (queueing.kick_now); once this one starts, the next UNKNOWN queues another."""
    kick_started(name, token)
    return reconcile_due()


def advance_saga(task_id: int) -> None:
    """One step of an aborted saga (enqueued on commit by the abort and whenever one of its entries ends)."""
    sagas.saga_advance(task_id)


def send_compensation(entry_id: int) -> None:
    """Send a compensation entry's request (enqueued on commit when it starts, and when it may be sent again);
    the entry's lease makes a second run of this job a no-op."""
    compensations.compensation_send(entry_id, worker=worker_name())


def check_compensation(entry_id: int) -> None:
    """An immediate status check of an unknown compensation entry."""
    compensations.compensation_check(entry_id, worker=worker_name(), force=True)


def reconcile_call(call_id: int) -> None:
    """An immediate check of one call (`POST .../calls/{id}/reconcile`, a provider's callback)."""
    reconcile.reconcile_call(call_id, worker=worker_name())


def metrics_fold() -> int:
    """Periodic: fold the audit events past the metrics watermark into the rollups (docs/metrics.md)."""
    return metrics.metrics_fold(seconds=settings.RECOVERY_METRICS_FOLD_MAX_S)


def prune_settled_history() -> int:
    """Periodic: remove the settled history past RECOVERY_RETENTION_DAYS (recovery.services.retention); calls pruned."""
    days = settings.RECOVERY_RETENTION_DAYS
    pruned = retention.retention_prune(now=timezone.now(), days=days, actor=Actor.job("retention"))
    if pruned.calls:
        logger.info(
            "retention: %d calls past %d days: %d receipts, %d gate answers, %d response bodies removed",
            pruned.calls,
            days,
            pruned.receipts,
            pruned.gate_decisions,
            pruned.attempt_bodies,
        )
    return pruned.calls


def sweep_sent() -> int:
    """Periodic: SENT calls past their outcome timeout become UNKNOWN (or RETRYABLE)."""
    return sweeper.sweep_sent()


def flag_no_submission() -> int:
    """Periodic: flag OPEN tasks past their deadline that were never submitted (docs/design/tasks.md
    `no_submission`)."""
    return tasks.task_flag_no_submission(now=timezone.now(), actor=Actor.job("no-submission"))


def execute_action(request_id: int) -> None:
    """Execute an approved operator action once (enqueued on commit by its approval): the claim makes a second run
    of this job, or a second worker, a no-op."""
    actions.action_execute(request_id, worker=worker_name())


def execute_bulk(bulk_id: int) -> None:
    """Execute an approved bulk action's items, each once (enqueued on commit by its approval, and by the sweep that
    hands back a bulk whose worker died): the claims make a second run a no-op."""
    bulk.bulk_execute(bulk_id, worker=worker_name())


def actions_due() -> int:
    """Periodic: expire undecided action requests, bulks and breaker resets, mark executions whose worker died
    interrupted (never re-run them), and enqueue again the approved ones whose enqueue was lost; how many changed."""
    changed = actions.actions_expire_due() + actions.actions_sweep_interrupted()
    changed += bulk.bulks_expire_due() + bulk.bulks_sweep_interrupted()
    changed += breaker_operations.breaker_operations_expire_due()
    for request_id in actions.actions_approved_waiting():
        enqueue_now(execute_action, request_id, job_id=f"action-execute-{request_id}")
    for bulk_id in bulk.bulks_approved_waiting():
        enqueue_now(execute_bulk, bulk_id, job_id=f"bulk-execute-{bulk_id}")
    return changed


def audit_checkpoint() -> str:
    """Periodic, in the scheduler's holder: a signed checkpoint of the audit heads (recovery.audit.checkpoints)."""
    try:
        path = checkpoint_write()
    except CheckpointRefused as refused:
        logger.error("audit checkpoint refused: %s", refused)
        return ""
    return str(path) if path else ""


def notifications_due() -> int:
    """Periodic: route new notification events to their deliveries, raise the due-time events, and enqueue a send
    of every delivery that is due (docs/notifications.md); how many sends were enqueued."""
    notifications.notifications_route()
    notifications.notifications_due_sweep()
    notifications.notifications_route()
    due = notify_send.deliveries_due()
    for delivery_id in due:
        enqueue_now(send_notification, delivery_id, job_id=f"notify-send-{delivery_id}")
    return len(due)


def send_notification(delivery_id: int) -> str:
    """One try of a delivery; its lease makes a second run of this job a no-op."""
    return notify_send.delivery_send(delivery_id)

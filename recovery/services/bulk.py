"""Bulk actions (docs/bulk.md): one operator action on a frozen, shown selection of calls. The preview freezes each
item (its call's id and version) with the single action's dry-run answer; the four-eyes steps are
recovery.services.approvals' (bound to the selection's hash); a worker then executes the items one by one, each once,
skipping a call that moved since the freeze and re-checking the others, through an ActionRequest of its own."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.actions import REVIEW_PERMISSION
from recovery.engine.canonical import canonical_digest
from recovery.jobs import queueing
from recovery.models import (
    ActionRequest,
    ActionStatus,
    BulkAction,
    BulkItem,
    BulkItemStatus,
    BulkStatus,
    Call,
)
from recovery.selectors.queues import Queue, QueueFilters, queue_page
from recovery.services import approvals
from recovery.services.action_execution import action_execute
from recovery.services.action_plans import (
    ACTION_BY_NAME,
    Plan,
    PlanError,
    action_event,
    build_plan,
    call_facts,
    options_for,
)
from recovery.services.errors import Refusal

B, Item = BulkStatus, BulkItemStatus
BULK_ACTIONS = ("reconcile_now", "escalate", "replay_same_key", "grant_approval", "abandon")
BULK_MAX = 500
LIVE = (B.APPROVED, B.EXECUTING)
SWEEP_LIMIT = 100
EXECUTE_JOB = "recovery.jobs.tasks.execute_bulk"
_RELATED = ("task__tenant", "step", "tool__provider", "claimed_by")


def _event(event: AuditAction, bulk: BulkAction, actor: Actor, *, reason: str = "", **evidence) -> None:
    """One step of the bulk's own story (the global chain: a bulk spans tasks), in the caller's transaction."""
    append_event(
        action=event,
        actor=actor,
        reason=reason,
        evidence={"bulk": bulk.pk, "action": bulk.action, "selection_hash": bulk.selection_hash, **evidence},
    )


def _record(bulk: BulkAction, to: str, actor: Actor, *, reason: str, was: str, user) -> None:
    """A four-eyes step of the bulk (`bulk.<status>`)."""
    evidence = approvals.step_evidence(to, was, user)
    _event(AuditAction(f"bulk.{to}"), bulk, actor, reason=reason, status=to, **evidence)


KIND = approvals.FourEyes(
    model=BulkAction,
    noun="bulk",
    thing="bulk",
    own="{what} needs a second person: you requested this bulk yourself.",
    expired="This bulk expired before it was decided: select and preview again.",
    reason_use="recorded with the bulk and read by the other person",
    record=_record,
    related=("previewed_by", "requested_by", "decided_by"),
    sweep_limit=SWEEP_LIMIT,
)


def _item_event(event: AuditAction, bulk: BulkAction, item: BulkItem, call: Call, actor: Actor, reason: str) -> None:
    """An item's step that no action request tells (skipped stale, refused at execution), on its call's chain."""
    append_event(
        action=event,
        actor=actor,
        task_id=call.task_id,
        call_id=call.pk,
        reason=reason,
        evidence={"bulk": bulk.pk, "item": item.position, "action": bulk.action, "call_version": item.call_version},
    )


# --- the freeze ------------------------------------------------------------------------------------------------------


def selected_calls(*, queue: Queue, call_ids: list[int] | None, filters: QueueFilters | None, now: datetime):
    """The calls a selection names, in the queue's order: the rows picked, or every call matching the filter.
    Refusal (field "calls") when there are none, more than BULK_MAX, or ids that are not calls."""
    if call_ids is not None:
        ids = list(dict.fromkeys(call_ids))
        if not ids:
            raise Refusal("selection", "Select at least one row, or every row matching the filter.", field="calls")
        if len(ids) > BULK_MAX:
            message = f"{len(ids)} rows are selected: a bulk acts on at most {BULK_MAX}."
            raise Refusal("selection", message, field="calls")
        calls = list(Call.objects.select_related(*_RELATED).filter(pk__in=ids).order_by("state_changed_at", "id"))
        if missing := sorted(set(ids) - {call.pk for call in calls}):
            shown = ", ".join(str(pk) for pk in missing[:10])
            raise Refusal("selection", f"No call has the id {shown}.", field="calls")
        return calls
    everything = replace(filters, after=None)  # every page of the filter, from its first row
    page = queue_page(everything, now=now, size=BULK_MAX)
    if page.next_cursor is not None:
        message = (
            f"More than {BULK_MAX} calls match this filter: narrow it (tool, tenant, risk, age or a search) to at "
            f"most {BULK_MAX}, or select rows."
        )
        raise Refusal("selection", message, field="calls")
    if not page.rows:
        raise Refusal("selection", "No call matches this filter: there is nothing to act on.", field="calls")
    order = {row["id"]: n for n, row in enumerate(page.rows)}
    calls = Call.objects.select_related(*_RELATED).filter(pk__in=list(order))
    return sorted(calls, key=lambda call: order[call.pk])


def _frozen(call: Call, action: str, user, perms, now: datetime) -> tuple[str, list[dict], str]:
    """(status, checks, why) of one call at the freeze: what the single action's preview would answer."""
    facts = call_facts(call, user=user, now=now)
    if facts.held_by:
        until = f"{call.claim_until:%H:%M:%S} UTC" if call.claim_until else "its claim ends"
        return Item.EXCLUDED, [], f"claimed by {facts.held_by} until {until}: they work it, the bulk leaves it"
    option = next(o for o in options_for(call, facts, perms=perms) if o.name == action)
    if not option.allowed:
        return Item.SKIPPED_CHECKS, [], option.reason
    try:
        plan = build_plan(call, action, facts=facts, evidence={}, now=now)
    except PlanError as exc:
        return Item.SKIPPED_CHECKS, [], f"no plan can be made: {exc}"
    checks = [{"check": c["check"], "passed": c["passed"], "detail": c["detail"]} for c in plan.data["checks"]]
    if failed := plan.failed_checks:
        return Item.SKIPPED_CHECKS, checks, "; ".join(f"{c['check']}: {c['detail']}" for c in failed)
    return Item.PENDING, checks, ""


def _selection_hash(action: str, items: list[BulkItem]) -> str:
    return canonical_digest([action, [[i.call_id, i.call_version, i.status] for i in items]])


def bulk_preview(
    *,
    action: str,
    queue: Queue,
    user,
    actor: Actor,
    call_ids: list[int] | None = None,
    filters: QueueFilters | None = None,
    filter_query: dict | None = None,
) -> BulkAction:
    """Freeze the selection (`call_ids`, or every call matching `filters` when call_ids is None) and store it as a
    PREVIEWED bulk with every item's answer. Sends nothing, changes no call."""
    approvals.require_role(user, REVIEW_PERMISSION, "Previewing a bulk action")
    if action not in BULK_ACTIONS:
        names = ", ".join(ACTION_BY_NAME[name].label.lower() for name in BULK_ACTIONS)
        raise Refusal("forbidden", f"{action!r} is not a bulk action: one of {names}.", field="action")
    if call_ids is None and filters is None:
        raise Refusal("selection", "Select rows, or every row matching the filter.", field="calls")
    now = timezone.now()
    calls = selected_calls(queue=queue, call_ids=call_ids, filters=filters, now=now)
    items = _freeze(calls, action, user, now)
    with transaction.atomic():
        bulk = BulkAction.objects.create(
            action=action,
            queue=queue.slug,
            selection="rows" if call_ids is not None else "matching",
            filters=filter_query or {},
            selection_hash=_selection_hash(action, items),
            previewed_by=user,
            previewed_at=now,
            expires_at=now + approvals.ttl(),
            updated_at=now,
        )
        for item in items:
            item.bulk = bulk
        BulkItem.objects.bulk_create(items)
        _previewed_event(bulk, items, actor)
    return bulk


def _freeze(calls: list[Call], action: str, user, now: datetime) -> list[BulkItem]:
    """Every call as an item at its version now, with the single action's dry-run answer (not saved yet)."""
    perms = user.get_all_permissions()
    items = []
    for position, call in enumerate(calls, start=1):
        status, checks, why = _frozen(call, action, user, perms, now)
        items.append(
            BulkItem(
                position=position,
                call=call,
                call_version=call.version,
                call_state=call.state,
                status=status,
                checks=checks,
                why=why,
                updated_at=now,
            )
        )
    return items


def _previewed_event(bulk: BulkAction, items: list[BulkItem], actor: Actor) -> None:
    counts = Counter(item.status for item in items)
    _event(
        AuditAction.BULK_PREVIEWED,
        bulk,
        actor,
        reason=f"dry run of a bulk {ACTION_BY_NAME[bulk.action].label.lower()} on {len(items)} calls: nothing was done",
        status=B.PREVIEWED,
        items=len(items),
        pending=counts[Item.PENDING],
        skipped=counts[Item.SKIPPED_CHECKS],
        excluded=counts[Item.EXCLUDED],
    )


# --- request, approve, reject ----------------------------------------------------------------------------------------


def bulk_request(*, bulk_id: int, user, actor: Actor, reason: str, selection_hash: str) -> BulkAction:
    """PREVIEWED → REQUESTED with a reason, for the selection the reviewer read (its hash)."""

    def binds(bulk: BulkAction) -> None:
        if selection_hash != bulk.selection_hash:
            message = "This is not the selection that was previewed: open the bulk again, read it, then request it."
            raise Refusal("stale", message, field="selection_hash")

    asked = approvals.requestable(
        KIND, bulk_id, user=user, actor=actor, reason=reason, what="Requesting a bulk action", binds=binds
    )
    if not asked.row.items.filter(status=Item.PENDING).exists():
        message = "No item of this selection would run (every one is skipped or excluded): nothing was requested."
        raise Refusal("forbidden", message)
    return approvals.request(asked)


def bulk_approve(*, bulk_id: int, user, actor: Actor, reason: str) -> BulkAction:
    """REQUESTED → APPROVED by a second person; its execution is enqueued on commit. Every item is re-checked when
    the worker reaches it, so the approval cannot act on a call that moved since the freeze."""
    asked = approvals.decidable(KIND, bulk_id, user=user, actor=actor, reason=reason, what="Approving a bulk action")
    approvals.decide(asked, to=B.APPROVED, then=lambda: enqueue_execution(bulk_id))
    return approvals.load(KIND, bulk_id)


def bulk_reject(*, bulk_id: int, user, actor: Actor, reason: str) -> BulkAction:
    """REQUESTED → REJECTED by a second person, with a reason: no item runs."""
    asked = approvals.decidable(KIND, bulk_id, user=user, actor=actor, reason=reason, what="Rejecting a bulk action")
    approvals.decide(asked, to=B.REJECTED)
    return approvals.load(KIND, bulk_id)


def enqueue_execution(bulk_id: int) -> None:
    queueing.enqueue(EXECUTE_JOB, bulk_id, job_id=f"bulk-execute-{bulk_id}")


# --- execution -------------------------------------------------------------------------------------------------------


def _job() -> Actor:
    return Actor.job("bulk")


def _lease_s(call: Call | None = None) -> float:
    """How long the worker holds the bulk for its next item: as long as one action holds its request."""
    if call is None:
        return settings.RECOVERY_ACTION_LEASE_S
    provider = call.tool.provider
    return max(settings.RECOVERY_ACTION_LEASE_S, provider.connect_timeout_s + provider.read_timeout_s + 10)


def _hold(bulk_id: int, worker: str, until: datetime) -> bool:
    """Extend this worker's lease on the bulk; False when the bulk is no longer this worker's."""
    held = BulkAction.objects.filter(pk=bulk_id, status=B.EXECUTING, execution_owner=worker[:100])
    return bool(held.update(execution_lease_until=until, updated_at=timezone.now()))


def _claim(bulk_id: int, worker: str, now: datetime) -> BulkAction | None:
    """APPROVED → EXECUTING for this worker, with a lease; None when it is not approved (any more)."""
    bulk = BulkAction.objects.select_related("requested_by", "decided_by").filter(pk=bulk_id).first()
    if bulk is None or bulk.status != B.APPROVED:
        return None
    with transaction.atomic():
        claimed = BulkAction.objects.filter(pk=bulk_id, status=B.APPROVED).update(
            status=B.EXECUTING,
            execution_owner=worker[:100],
            execution_lease_until=now + timedelta(seconds=_lease_s()),
            started_at=bulk.started_at or now,
            updated_at=now,
        )
        if claimed:
            _event(AuditAction.BULK_EXECUTING, bulk, _job(), reason=f"claimed by worker {worker}", worker=worker)
    return bulk if claimed else None


def bulk_execute(bulk_id: int, *, worker: str) -> BulkAction:
    """The job's body: claim the APPROVED bulk (a second claim gets nothing) and execute its pending items in order,
    each once; FINISHED when none is left."""
    bulk = _claim(bulk_id, worker, timezone.now())
    if bulk is None:
        return approvals.load(KIND, bulk_id)
    size = BulkItem.objects.filter(bulk_id=bulk.pk).count()
    while True:
        item = BulkItem.objects.filter(bulk_id=bulk.pk, status=Item.PENDING).order_by("position").first()
        if item is None:
            break
        call = Call.objects.select_related(*_RELATED).get(pk=item.call_id)
        if not _hold(bulk.pk, worker, timezone.now() + timedelta(seconds=_lease_s(call))):
            return approvals.load(KIND, bulk_id)  # the sweep took the bulk back: whoever resumes it takes the next item
        if not BulkItem.objects.filter(pk=item.pk, status=Item.PENDING).update(
            status=Item.EXECUTING, updated_at=timezone.now()
        ):
            continue
        _execute_item(bulk, item, call, worker, size)
    with transaction.atomic():
        now = timezone.now()
        done = BulkAction.objects.filter(pk=bulk.pk, status=B.EXECUTING, execution_owner=worker[:100]).update(
            status=B.FINISHED, finished_at=now, execution_lease_until=None, updated_at=now
        )
        if done:
            counts = bulk_counts(bulk.pk)
            summary = ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in sorted(counts.items()))
            _event(
                AuditAction.BULK_FINISHED, bulk, _job(), reason=f"every item has its result: {summary}", counts=counts
            )
    return approvals.load(KIND, bulk_id)


def _finish_item(item: BulkItem, status: str, why: str, request: ActionRequest | None = None) -> None:
    """executing → its result (one conditional UPDATE: an item the sweep marked interrupted keeps that)."""
    changes = {"status": status, "why": why, "updated_at": timezone.now()}
    if request is not None:
        changes["request"] = request
    BulkItem.objects.filter(pk=item.pk, status=Item.EXECUTING).update(**changes)


def _execute_item(bulk: BulkAction, item: BulkItem, call: Call, worker: str, size: int) -> None:
    """One item: skipped when its call moved since the freeze; refused when the action or its checks no longer pass
    now; otherwise executed once through an ActionRequest of its own, as the bulk's requester and decider agreed."""
    if call.version != item.call_version:
        why = (
            f"stale: the call moved since the freeze (it was {item.call_state} at version {item.call_version}, it is "
            f"{call.state} at version {call.version}): never acted on"
        )
        with transaction.atomic():
            _finish_item(item, Item.SKIPPED_STALE, why)
            _item_event(AuditAction.BULK_ITEM_SKIPPED, bulk, item, call, _job(), why)
        return
    now = timezone.now()
    plan, refusal = _recheck(bulk, call, now)
    if refusal:
        why = f"not executed, re-checked at execution: {refusal}"
        with transaction.atomic():
            _finish_item(item, Item.FAILED, why)
            _item_event(AuditAction.BULK_ITEM_REFUSED, bulk, item, call, _job(), why)
        return
    request = _item_request(bulk, item, call, plan, size, now)
    done = action_execute(request.pk, worker=worker)
    status = _ITEM_RESULT.get(done.status)
    if status is None:  # another worker holds its request (it was swept and this one overran): the sweep decides
        return
    what = (done.result or {}).get("what", "") if isinstance(done.result, dict) else ""
    _finish_item(item, status, what or f"its action request #{request.pk} is {done.status}", request)


# An item's result, from its action request's.
_ITEM_RESULT = {
    ActionStatus.EXECUTED: Item.EXECUTED,
    ActionStatus.FAILED: Item.FAILED,
    ActionStatus.INTERRUPTED: Item.INTERRUPTED,
}


def _recheck(bulk: BulkAction, call: Call, now: datetime) -> tuple[Plan | None, str]:
    """The item's plan as the bulk's requester would get it now, or why it may not run any more."""
    requester = bulk.requested_by
    facts = call_facts(call, user=requester, now=now)
    option = next(o for o in options_for(call, facts, perms=requester.get_all_permissions()) if o.name == bulk.action)
    if not option.allowed:
        return None, option.reason
    try:
        plan = build_plan(call, bulk.action, facts=facts, evidence={}, now=now)
    except PlanError as exc:
        return None, f"no plan can be made: {exc}"
    if failed := plan.failed_checks:
        return None, "its checks fail now: " + "; ".join(f"{c['check']}: {c['detail']}" for c in failed)
    return plan, ""


def _item_request(bulk: BulkAction, item: BulkItem, call: Call, plan: Plan, size: int, now: datetime) -> ActionRequest:
    """The item's own action request, APPROVED as the bulk was (its requester, decider and reasons), with its event."""
    with transaction.atomic():
        request = ActionRequest.objects.create(
            call=call,
            action=bulk.action,
            status=ActionStatus.APPROVED,
            plan=plan.data,
            plan_hash=plan.hash,
            call_version=call.version,
            previewed_by=bulk.previewed_by,
            previewed_at=bulk.previewed_at,
            requested_by=bulk.requested_by,
            requested_at=bulk.requested_at,
            reason=f"bulk #{bulk.pk}, item {item.position}: {bulk.reason}",
            decided_by=bulk.decided_by,
            decided_at=bulk.decided_at,
            decision_reason=bulk.decision_reason,
            expires_at=now + approvals.ttl(),
            updated_at=now,
        )
        BulkItem.objects.filter(pk=item.pk).update(request=request)
        who = f"requested by {bulk.requested_by.get_username()}, approved by {bulk.decided_by.get_username()}"
        action_event(
            AuditAction.ACTION_APPROVED,
            request,
            call,
            _job(),
            reason=f"item {item.position} of bulk #{bulk.pk} ({size} calls), {who}: {bulk.reason}",
            status=ActionStatus.APPROVED,
            bulk=bulk.pk,
            item=item.position,
        )
    return request


def bulk_counts(bulk_id: int) -> dict[str, int]:
    """Items per status (only the statuses present)."""
    rows = BulkItem.objects.filter(bulk_id=bulk_id).values_list("status").annotate(n=Count("id")).order_by()
    return {status: n for status, n in rows}


# --- periodic: expiry, interrupted workers, lost enqueues ------------------------------------------------------------


def bulks_expire_due(*, now: datetime | None = None) -> int:
    """PREVIEWED and REQUESTED bulks past their expiry → EXPIRED; how many."""
    return approvals.expire_due(KIND, actor=Actor.job("bulk-expire"), now=now)


def bulks_sweep_interrupted(*, now: datetime | None = None) -> int:
    """EXECUTING bulks whose worker's lease has passed: the item it was executing → INTERRUPTED (never run again;
    its action request too, when it had not started), and the bulk back to APPROVED, resumed from its next pending
    item (FINISHED when none is left); how many bulks."""
    now = now or timezone.now()
    due = BulkAction.objects.filter(status=B.EXECUTING, execution_lease_until__lt=now).order_by("pk")[:SWEEP_LIMIT]
    swept = 0
    actor = Actor.job("bulk-sweep")
    for bulk in due:
        with transaction.atomic():
            moved = BulkAction.objects.filter(
                pk=bulk.pk, status=B.EXECUTING, execution_owner=bulk.execution_owner
            ).update(status=B.APPROVED, execution_owner="", execution_lease_until=None, updated_at=now)
            if not moved:
                continue
            swept += 1
            why = (
                f"the worker {bulk.execution_owner} stopped while executing this item (its lease ended "
                f"{bulk.execution_lease_until.isoformat()}): never run again"
            )
            for item in BulkItem.objects.select_related("call").filter(bulk_id=bulk.pk, status=Item.EXECUTING):
                BulkItem.objects.filter(pk=item.pk, status=Item.EXECUTING).update(
                    status=Item.INTERRUPTED, why=why, updated_at=now
                )
                _item_event(AuditAction.BULK_ITEM_INTERRUPTED, bulk, item, item.call, actor, why)
                if item.request_id:
                    # Created but never claimed by the dead worker: nobody may run it later.
                    ActionRequest.objects.filter(pk=item.request_id, status=ActionStatus.APPROVED).update(
                        status=ActionStatus.INTERRUPTED, result={"what": why}, updated_at=now
                    )
            _event(
                AuditAction.BULK_INTERRUPTED,
                bulk,
                actor,
                reason=f"worker {bulk.execution_owner} stopped: its item is interrupted, the rest resume",
                worker=bulk.execution_owner,
            )
            enqueue_execution(bulk.pk)
    return swept


def bulks_approved_waiting(*, now: datetime | None = None, older_than_s: int = 30) -> list[int]:
    """APPROVED bulks no worker has claimed for a while (their enqueue was lost): to enqueue again."""
    now = now or timezone.now()
    waiting = BulkAction.objects.filter(status=B.APPROVED, updated_at__lte=now - timedelta(seconds=older_than_s))
    return list(waiting.order_by("pk").values_list("pk", flat=True)[:SWEEP_LIMIT])

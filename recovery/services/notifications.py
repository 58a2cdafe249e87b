"""Routing notification events to deliveries, and the due times that raise events of their own
(docs/notifications.md). Each event lands in exactly one delivery of each rule it matches: the rule's delivery of the
event's window, keyed (rule, window, thread), so a storm is one message per rule window. An event about an item the
rule already told someone about (its resolution, its due time passing, its assignment) follows that message up.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from recovery.engine.due import due_times
from recovery.models import (
    Call,
    DeliveryItem,
    DeliveryStatus,
    EventKind,
    NotificationDelivery,
    NotificationEvent,
    NotificationRule,
)
from recovery.selectors.due import late_q
from recovery.statemachine.notices import NEEDS_PERSON, call_fields, call_path, notice

FOLLOW_UP_KINDS = {EventKind.RESOLVED, EventKind.OVERDUE, EventKind.UNCLAIMED_OVERDUE, EventKind.ASSIGNED}
ROUTE_BATCH = 1000
WINDOW_TRIES = 5
OVERDUE_SCAN = 500
CATCH_UP_MAX = 200  # items a new rule is told about at once: one message listing them


def rule_matches(rule: NotificationRule, event: NotificationEvent) -> bool:
    if event.kind not in rule.events:
        return False
    if rule.tenant_id and event.tenant_id != rule.tenant_id:
        return False
    if rule.tool_id and event.tool_id != rule.tool_id:
        return False
    return not rule.risk or event.risk == rule.risk


def window_of(at: datetime, window_s: int) -> datetime:
    stamp = int(at.timestamp())
    return datetime.fromtimestamp(stamp - stamp % max(1, window_s), tz=UTC)


def notifications_route(*, now: datetime | None = None, batch: int = ROUTE_BATCH) -> int:
    """Put the events not routed yet into their rules' deliveries; how many events were routed."""
    now = now or timezone.now()
    rules = list(NotificationRule.objects.filter(enabled=True, channel__enabled=True).select_related("channel"))
    with transaction.atomic():
        events = list(
            NotificationEvent.objects.filter(routed_at__isnull=True)
            .select_for_update(skip_locked=True)
            .order_by("id")[:batch]
        )
        for event in events:
            for rule in rules:
                if rule_matches(rule, event):
                    _attach(rule, event, now)
        NotificationEvent.objects.filter(pk__in=[event.pk for event in events]).update(routed_at=now)
    return len(events)


def _thread_of(rule: NotificationRule, event: NotificationEvent) -> NotificationDelivery | None:
    """The first message of this rule about the event's subject, when the event follows it up."""
    if event.kind not in FOLLOW_UP_KINDS:
        return None
    item = (
        DeliveryItem.objects.filter(rule=rule, event__subject=event.subject, delivery__follows__isnull=True)
        .select_related("delivery")
        .order_by("-id")
        .first()
    )
    return item.delivery if item else None


def rule_catch_up(rule: NotificationRule, *, now: datetime | None = None) -> int:
    """A rule just added or enabled hears about what already waits for a person: the calls in a queue that needs one
    now, each by the latest event of its entry into that queue (within RECOVERY_NOTIFY_CATCH_UP_S, at most
    CATCH_UP_MAX), in one delivery of the current window. Without it, an item that entered its queue before the rule
    existed would never be told, nor its resolution followed up. How many events it took."""
    now = now or timezone.now()
    if not (rule.enabled and rule.channel.enabled):
        return 0
    kinds = [kind for state, kind in NEEDS_PERSON.items() if kind in rule.events]
    if not kinds:
        return 0
    since = now - timedelta(seconds=settings.RECOVERY_NOTIFY_CATCH_UP_S)
    waiting = Call.objects.filter(state__in=[state for state, kind in NEEDS_PERSON.items() if kind in kinds])
    events = (
        # Routed ones only: an event not routed yet reaches the rule through the router, which now sees it.
        NotificationEvent.objects.filter(
            kind__in=kinds, call__in=waiting, created_at__gte=since, routed_at__isnull=False
        )
        .exclude(items__rule=rule)
        .order_by("subject", "-id")
        .select_related("call")
    )
    taken, seen = 0, set()
    for event in events[: CATCH_UP_MAX * 4]:
        entered = NEEDS_PERSON.get(event.call.state)
        if event.subject in seen or event.kind != entered or not rule_matches(rule, event):
            continue
        seen.add(event.subject)
        _attach(rule, event, now, at=now)
        taken += 1
        if taken >= CATCH_UP_MAX:
            break
    return taken


def _attach(rule: NotificationRule, event: NotificationEvent, now: datetime, *, at: datetime | None = None) -> None:
    """The event into the rule's pending delivery of its window (the next window when that one is already being
    sent): the delivery row is locked while the item is added, so a sender that claimed it has every item. The
    window is the event's own unless `at` names another (a rule catching up puts old events in its current one)."""
    follows = _thread_of(rule, event)
    start = window_of(min(at or event.created_at, now), rule.window_s)
    for _ in range(WINDOW_TRIES):
        delivery = _pending_delivery(rule, start, follows)
        if delivery is not None:
            DeliveryItem.objects.create(delivery=delivery, event=event, rule=rule)
            return
        start = max(start + timedelta(seconds=rule.window_s), window_of(now, rule.window_s))
    raise RuntimeError(f"no pending delivery of rule {rule.pk} found in {WINDOW_TRIES} windows")


def _pending_delivery(rule, start: datetime, follows) -> NotificationDelivery | None:
    """The rule's delivery of the window starting at `start`, locked, if it is still pending (made if missing)."""
    key = {"rule": rule, "window_start": start, "follows": follows}
    found = NotificationDelivery.objects.select_for_update().filter(**key).first()
    if found is None:
        due = start + timedelta(seconds=rule.window_s)
        try:
            with transaction.atomic():
                found = NotificationDelivery.objects.create(**key, due_at=due, next_try_at=due)
        except IntegrityError:  # a concurrent router made it first
            found = NotificationDelivery.objects.select_for_update().filter(**key).first()
    return found if found is not None and found.status == DeliveryStatus.PENDING else None


# --- due times ------------------------------------------------------------------------------------------------------


def _overdue_calls(now: datetime, *, unclaimed: bool) -> list[Call]:
    found = Call.objects.filter(late_q(now, claim=unclaimed), state__in=list(NEEDS_PERSON))
    if unclaimed:
        found = found.filter(Q(claimed_by__isnull=True) | Q(claim_until__lte=now))
    fields = ("id", "version", "tenant_id", "tool_id", "risk", "state", "state_changed_at")
    return list(found.only(*fields).order_by("-state_changed_at")[:OVERDUE_SCAN])


def notifications_due_sweep(*, now: datetime | None = None) -> int:
    """Events for the items that passed a due time since they entered their state: once unclaimed past the first
    claim's due time (escalation), once unresolved past the resolution's (RECOVERY_SLA_S), each per queue and risk
    (recovery.selectors.due); how many events."""
    now = now or timezone.now()
    made = 0
    passes = (
        (EventKind.UNCLAIMED_OVERDUE, True, "not claimed"),
        (EventKind.OVERDUE, False, "not resolved"),
    )
    for kind, unclaimed, what in passes:
        calls = _overdue_calls(now, unclaimed=unclaimed)
        keys = {f"{kind}:{call.pk}:{call.version}": call for call in calls}
        known = set(NotificationEvent.objects.filter(dedup__in=list(keys)).values_list("dedup", flat=True))
        for key, call in keys.items():
            if key in known:
                continue
            due = due_times(
                call.state_changed_at,
                call.risk,
                state=call.state,
                sla=settings.RECOVERY_SLA_S,
                claim=settings.RECOVERY_CLAIM_DUE_S,
            )
            at = due.claim_by if unclaimed else due.resolve_by
            title = f"Call {call.pk} is {what} past its due time ({at:%Y-%m-%d %H:%M} UTC)"
            with transaction.atomic():
                made += notice(
                    kind,
                    subject=f"call:{call.pk}",
                    title=title,
                    dedup=key,
                    path=call_path(call.pk),
                    reason=str(call.state),
                    **call_fields(call),
                )
    return made

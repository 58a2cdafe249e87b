"""Reads of notifications (docs/notifications.md): the delivery log the console shows — each delivery with its rule,
channel, items and every try — and the figures the metrics export: deliveries by status, tries by outcome, and the
items past their due times now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Prefetch, Q

from recovery.models import Call, DeliveryAttempt, NotificationDelivery
from recovery.selectors.due import late_q
from recovery.statemachine.notices import NEEDS_PERSON

LOG_SIZE = 50


def delivery_log(*, limit: int = LOG_SIZE) -> list[NotificationDelivery]:
    """The newest deliveries, each with its rule and channel, its item count (`n_items`) and its tries (three
    statements)."""
    tries = Prefetch("tries", queryset=DeliveryAttempt.objects.order_by("number"))
    return list(
        NotificationDelivery.objects.select_related("rule__channel", "follows")
        .annotate(n_items=Count("items"))
        .prefetch_related(tries)
        .order_by("-id")[:limit]
    )


@dataclass(frozen=True, kw_only=True)
class NotificationFigures:
    deliveries: dict[str, int]  # status -> deliveries
    tries: dict[str, int]  # outcome -> tries
    overdue: dict[str, int]  # "claim" / "resolution" -> items past that due time now


def notification_figures(*, now: datetime) -> NotificationFigures:
    """Three statements: deliveries by status, tries by outcome, and the overdue items (claim: unclaimed past the
    first claim's due time; resolution: past RECOVERY_SLA_S)."""
    deliveries = dict(NotificationDelivery.objects.values_list("status").annotate(n=Count("id")).order_by())
    tries = dict(DeliveryAttempt.objects.values_list("outcome").annotate(n=Count("id")).order_by())
    unclaimed = Q(claimed_by__isnull=True) | Q(claim_until__lte=now)
    overdue = Call.objects.filter(state__in=list(NEEDS_PERSON)).aggregate(
        claim=Count("id", filter=late_q(now, claim=True) & unclaimed),
        resolution=Count("id", filter=late_q(now, claim=False)),
    )
    return NotificationFigures(deliveries=deliveries, tries=tries, overdue=overdue)

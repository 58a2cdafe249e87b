"""Reaching the people (docs/notifications.md): the events worth telling someone about, written beside the change
that caused them; the channels and rules an admin configures; the deliveries that group a rule's events per time
window, each sent at least once under a stable id, with a log of every try; a reviewer's assignment and saved views.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from recovery.models.calls import Call
from recovery.models.registry import Risk, Tenant, Tool


class EventKind(models.TextChoices):
    STILL_UNKNOWN = "still_unknown", "Still unknown"
    HUMAN_REVIEW = "human_review", "Human review"
    COMPENSATION_PROBLEM = "compensation_problem", "Compensation problem"
    APPROVAL_REQUESTED = "approval_requested", "Approval requested"
    BREAKER_OPENED = "breaker_opened", "Breaker opened"
    OVERDUE = "overdue", "Past its due time"
    UNCLAIMED_OVERDUE = "unclaimed_overdue", "Unclaimed past its claim due time"
    ASSIGNED = "assigned", "Assigned"
    RESOLVED = "resolved", "Resolved"


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook", "Webhook (signed JSON)"
    SLACK = "slack", "Slack (Web API, bot token)"
    EMAIL = "email", "E-mail"


class NotificationChannel(models.Model):
    """Where messages go. Secrets are never stored: `secret_env` names the environment variable holding the webhook's
    signing secret or the Slack bot token."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    url = models.URLField(blank=True, help_text="Webhook: the receiver's URL. Slack: the Web API base URL.")
    slack_channel = models.CharField(max_length=100, blank=True, help_text="Slack: the channel id (C0123...).")
    email_to = models.CharField(max_length=500, blank=True, help_text="E-mail: addresses, comma-separated.")
    secret_env = models.CharField(
        max_length=100, blank=True, help_text="The environment variable holding the signing secret or bot token."
    )
    allow_private = models.BooleanField(
        default=False, help_text="Allow private and loopback addresses (a receiver on this network)."
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class NotificationRule(models.Model):
    """Which events notify which channel, filtered by tenant, tool and risk (empty: any); its events are grouped into
    one delivery per `window_s` seconds."""

    name = models.CharField(max_length=100, unique=True)
    channel = models.ForeignKey(NotificationChannel, on_delete=models.PROTECT, related_name="rules")
    events = models.JSONField(default=list, help_text='Event kinds, e.g. ["human_review", "resolved"].')
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    tool = models.ForeignKey(Tool, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    risk = models.CharField(max_length=8, choices=Risk.choices, blank=True)
    window_s = models.PositiveIntegerField(default=30)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class NotificationEvent(models.Model):
    """Something a person should hear about, written in the transaction that caused it; routed to the matching
    rules' deliveries by the notifications job (`routed_at`)."""

    kind = models.CharField(max_length=32, choices=EventKind.choices)
    subject = models.CharField(max_length=100)  # "call:12", "breaker:refund", "approval:action:7"
    call = models.ForeignKey(Call, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    tool = models.ForeignKey(Tool, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    risk = models.CharField(max_length=8, blank=True)
    title = models.CharField(max_length=300)  # our own words, never a provider's or a secret
    reason = models.CharField(max_length=100, blank=True)  # a code of ours: human_review_required, ...
    path = models.CharField(max_length=200, blank=True)  # the console page, joined to CONSOLE_BASE_URL
    # At most one event per key (an item's overdue event once per state it entered); null: no such limit.
    dedup = models.CharField(max_length=150, null=True, blank=True, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    routed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["id"], name="notify_event_unrouted_idx", condition=models.Q(routed_at__isnull=True)),
            models.Index(fields=["subject", "id"], name="notify_event_subject_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"  # its rule or channel was disabled before it was sent: never sent


class NotificationDelivery(models.Model):
    """One message: a rule's events of one window (and, for follow-ups, of one earlier message's thread). Its
    `delivery_id` is sent with every try (Recovery-Delivery-Id, Message-ID): the receiver deduplicates."""

    rule = models.ForeignKey(NotificationRule, on_delete=models.PROTECT, related_name="deliveries")
    window_start = models.DateTimeField()
    follows = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="follow_ups")
    delivery_id = models.UUIDField(default=uuid.uuid4, unique=True)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    due_at = models.DateTimeField()  # the window's end: when it is first sent
    attempts = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField()
    lease_until = models.DateTimeField(null=True, blank=True)  # a sender holds it until then
    # Whether a try may have reached the receiver (a timeout after sending): every later try carries the same id.
    maybe_sent = models.BooleanField(default=False)
    thread_ref = models.CharField(max_length=200, blank=True)  # Slack's ts, the e-mail's Message-ID
    last_reason = models.CharField(max_length=300, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rule", "window_start", "follows"], name="notify_delivery_window"),
            models.UniqueConstraint(
                fields=["rule", "window_start"], condition=models.Q(follows__isnull=True), name="notify_delivery_first"
            ),
        ]
        indexes = [models.Index(fields=["status", "next_try_at"], name="notify_delivery_due_idx")]

    def __str__(self) -> str:
        return f"delivery {self.delivery_id} ({self.status})"


class DeliveryItem(models.Model):
    """An event in a delivery: each event lands in exactly one delivery of each rule it matches."""

    delivery = models.ForeignKey(NotificationDelivery, on_delete=models.CASCADE, related_name="items")
    event = models.ForeignKey(NotificationEvent, on_delete=models.CASCADE, related_name="items")
    rule = models.ForeignKey(NotificationRule, on_delete=models.PROTECT, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["event", "rule"], name="notify_item_once_per_rule")]

    def __str__(self) -> str:
        return f"event {self.event_id} in delivery {self.delivery_id}"


class DeliveryAttempt(models.Model):
    """One try of a delivery, as the console's delivery log shows it."""

    delivery = models.ForeignKey(NotificationDelivery, on_delete=models.CASCADE, related_name="tries")
    number = models.PositiveIntegerField()
    outcome = models.CharField(max_length=16)  # sent, failed, unknown
    status_code = models.PositiveIntegerField(null=True, blank=True)
    reason = models.CharField(max_length=300, blank=True)  # our words: "timed out after sending", "HTTP 500"
    answer = models.CharField(max_length=500, blank=True)  # the start of the receiver's answer, redacted
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="notify_attempt_number")]

    def __str__(self) -> str:
        return f"try {self.number} of delivery {self.delivery_id}: {self.outcome}"


class Assignment(models.Model):
    """The named reviewer an item is assigned to, beside the short claim (docs/notifications.md#assignment)."""

    call = models.OneToOneField(Call, on_delete=models.PROTECT, related_name="assignment")
    assignee = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    assigned_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    assigned_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["assignee", "call"], name="assignment_assignee_idx")]

    def __str__(self) -> str:
        return f"call {self.call_id} assigned to {self.assignee_id}"


class SavedView(models.Model):
    """A user's named queue view: the queue and its filters as they stand in the URL."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    name = models.CharField(max_length=60)
    queue = models.CharField(max_length=40)
    query = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="saved_view_name")]

    def __str__(self) -> str:
        return self.name

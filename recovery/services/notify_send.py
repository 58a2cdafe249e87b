"""Sending deliveries (docs/notifications.md#delivery): at least once, under a stable delivery id. A sender claims a
due delivery with a lease (a conditional UPDATE), sends it through its channel, logs the try and either marks it sent
or puts it back with backoff; after a try whose outcome is unknown (or a sender that died holding the lease) a webhook
or an e-mail is re-sent under the same id, which the receiver deduplicates, and a Slack message is looked up first.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from recovery.engine import notify as words
from recovery.engine.due import due_times
from recovery.models import (
    Assignment,
    Call,
    ChannelKind,
    DeliveryAttempt,
    DeliveryStatus,
    EventKind,
    NotificationDelivery,
    NotificationEvent,
)
from recovery.providers import notify as outside
from recovery.services.callbacks import sign

logger = logging.getLogger("recovery.notifications")
P, SENDING, CANCELLED = DeliveryStatus.PENDING, DeliveryStatus.SENDING, DeliveryStatus.CANCELLED
WAIT_FOR_FIRST_S = 5  # a follow-up whose first message is not sent yet waits this long, its try not counted
BACKOFF_MAX_S = 3600


def _due_q(now: datetime) -> Q:
    return Q(status=P, next_try_at__lte=now) | Q(status=SENDING, lease_until__lt=now)


def deliveries_due(*, now: datetime | None = None, limit: int = 200) -> list[int]:
    """The deliveries a sender may take now: pending ones whose time came, and ones whose sender's lease lapsed."""
    now = now or timezone.now()
    return list(
        NotificationDelivery.objects.filter(_due_q(now)).order_by("next_try_at").values_list("id", flat=True)[:limit]
    )


def backoff_s(tries: int) -> int:
    return min(settings.RECOVERY_NOTIFY_BACKOFF_S * 2 ** max(0, tries - 1), BACKOFF_MAX_S)


def _claim(delivery_id: int, now: datetime) -> NotificationDelivery | None:
    """Take the delivery for one try; None when it is not due or someone else holds it. A lapsed lease means a
    sender died mid-try: the receiver may have the message, so this try is a re-send (maybe_sent)."""
    lease = now + timedelta(seconds=settings.RECOVERY_NOTIFY_LEASE_S)
    lapsed = NotificationDelivery.objects.filter(pk=delivery_id, status=SENDING, lease_until__lt=now)
    with transaction.atomic():
        moved = lapsed.update(lease_until=lease, attempts=F("attempts") + 1, maybe_sent=True)
        if not moved:
            moved = NotificationDelivery.objects.filter(pk=delivery_id, status=P, next_try_at__lte=now).update(
                status=SENDING, lease_until=lease, attempts=F("attempts") + 1
            )
    if not moved:
        return None
    return NotificationDelivery.objects.select_related("rule__channel", "follows").get(pk=delivery_id)


def _items(delivery: NotificationDelivery, now: datetime) -> tuple[words.Item, ...]:
    events = list(NotificationEvent.objects.filter(items__delivery=delivery).order_by("id"))
    calls = Call.objects.filter(pk__in=[e.call_id for e in events if e.call_id])
    entered = {pk: (at, state) for pk, at, state in calls.values_list("id", "state_changed_at", "state")}
    sla, claim = settings.RECOVERY_SLA_S, settings.RECOVERY_CLAIM_DUE_S
    items = []
    for event in events:
        due = None
        if event.call_id and event.kind != EventKind.RESOLVED and event.risk:
            at, state = entered.get(event.call_id, (event.created_at, ""))
            due = due_times(at, event.risk, state=state, sla=sla, claim=claim).resolve_by
        link = f"{settings.CONSOLE_BASE_URL}{event.path}" if event.path else settings.CONSOLE_BASE_URL + "/"
        items.append(
            words.Item(
                event=event.kind,
                subject=event.subject,
                title=event.title,
                reason=event.reason,
                link=link,
                at=event.created_at,
                due_at=due,
            )
        )
    return tuple(items)


def message_of(delivery: NotificationDelivery, now: datetime) -> words.Message:
    return words.Message(
        delivery_id=str(delivery.delivery_id),
        rule=delivery.rule.name,
        items=_items(delivery, now),
        now=now,
        follows=str(delivery.follows.delivery_id) if delivery.follows_id else "",
    )


def delivery_send(delivery_id: int, *, now: datetime | None = None) -> str:
    """One try of a delivery: claim, send, log, settle. Its outcome (sent, failed, unknown), "" when not taken."""
    now = now or timezone.now()
    delivery = _claim(delivery_id, now)
    if delivery is None:
        return ""
    if stopped := _stopped(delivery):
        _settle(delivery, outside.Sent(outcome=CANCELLED, reason=stopped), now)
        return CANCELLED
    first = delivery.follows
    if first is not None and first.status in (DeliveryStatus.PENDING, DeliveryStatus.SENDING):
        # A follow-up goes after the message it threads under (one that failed for good is not waited for).
        _put_back(delivery, now + timedelta(seconds=WAIT_FOR_FIRST_S), count=False)
        return ""
    message = message_of(delivery, now)
    try:
        sent = _send(delivery, message)
    except Exception:
        logger.exception("delivery %s: the channel raised", delivery.delivery_id)
        sent = outside.Sent(outcome=outside.UNKNOWN, reason="the sender failed while sending")
    _settle(delivery, sent, max(now, timezone.now()))
    return sent.outcome


def _stopped(delivery: NotificationDelivery) -> str:
    """Why the delivery may no longer be sent ("" when it may): its rule or its channel was disabled since it was
    made (a rule with deliveries cannot be deleted, only disabled: its log stays)."""
    rule = delivery.rule
    if not rule.enabled:
        return f"cancelled: the rule {rule.name} was disabled"
    if not rule.channel.enabled:
        return f"cancelled: the channel {rule.channel.name} was disabled"
    return ""


def _put_back(delivery: NotificationDelivery, at: datetime, *, count: bool) -> None:
    extra = {} if count else {"attempts": F("attempts") - 1}
    NotificationDelivery.objects.filter(pk=delivery.pk, status=SENDING, attempts=delivery.attempts).update(
        status=P, next_try_at=at, lease_until=None, **extra
    )


def _settle(delivery: NotificationDelivery, sent: outside.Sent, now: datetime) -> None:
    """The try logged and the delivery marked sent, put back with backoff, or failed after the last try; only while
    this sender still holds it (same status and try number)."""
    held = NotificationDelivery.objects.filter(pk=delivery.pk, status=SENDING, attempts=delivery.attempts)
    with transaction.atomic():
        DeliveryAttempt.objects.create(
            delivery=delivery,
            number=delivery.attempts,
            outcome=sent.outcome,
            status_code=sent.status_code,
            reason=sent.reason[:300],
            answer=sent.answer[:500],
            at=now,
        )
        if sent.outcome == CANCELLED:
            held.update(status=DeliveryStatus.CANCELLED, lease_until=None, last_reason=sent.reason[:300])
        elif sent.outcome == outside.SENT:
            ref = sent.ref or delivery.thread_ref
            held.update(status=DeliveryStatus.SENT, sent_at=now, lease_until=None, thread_ref=ref, last_reason="")
        elif delivery.attempts >= settings.RECOVERY_NOTIFY_MAX_TRIES:
            held.update(status=DeliveryStatus.FAILED, lease_until=None, last_reason=sent.reason[:300])
        else:
            held.update(
                status=P,
                next_try_at=now + timedelta(seconds=backoff_s(delivery.attempts)),
                lease_until=None,
                last_reason=sent.reason[:300],
                maybe_sent=sent.outcome == outside.UNKNOWN or delivery.maybe_sent,
            )


# --- channels -------------------------------------------------------------------------------------------------------


def _secret(name: str) -> str:
    return os.environ.get(name, "") if name else ""


def _send(delivery: NotificationDelivery, message: words.Message) -> outside.Sent:
    channel = delivery.rule.channel
    if channel.kind == ChannelKind.WEBHOOK:
        return _webhook(channel, message)
    if channel.kind == ChannelKind.SLACK:
        return _slack(delivery, channel, message)
    return _email(delivery, channel, message)


def _webhook(channel, message: words.Message) -> outside.Sent:
    secret = _secret(channel.secret_env)
    if not secret:
        return outside.Sent(outcome=outside.FAILED, reason=f"no secret in {channel.secret_env or 'secret_env'}")
    body = json.dumps(words.webhook_body(message), separators=(",", ":")).encode()
    headers = {"Recovery-Delivery-Id": message.delivery_id, "Recovery-Signature": sign(secret, body)}
    sent, _ = outside.post_json(channel.url, body, headers, allow_private=channel.allow_private)
    return sent


def _slack(delivery: NotificationDelivery, channel, message: words.Message) -> outside.Sent:
    token = _secret(channel.secret_env)
    if not token:
        return outside.Sent(outcome=outside.FAILED, reason=f"no bot token in {channel.secret_env or 'secret_env'}")
    first = delivery.follows
    thread_ts = first.thread_ref if first is not None else ""
    sent = _slack_post(delivery, channel, token, message, thread_ts)
    resolved = all(item.event == EventKind.RESOLVED for item in message.items)
    if sent.outcome == outside.SENT and thread_ts and resolved:
        # chat.update sets the message to what we send: doing it again is harmless, so it is never looked up first.
        update = {
            "channel": channel.slack_channel,
            "ts": thread_ts,
            "text": f"Resolved: {message.headline}",
            "blocks": words.slack_blocks(message),
        }
        answer = outside.slack_call(channel.url, "chat.update", token, update, allow_private=channel.allow_private)
        if answer.outcome != outside.SENT:
            logger.warning("delivery %s: chat.update of the first message: %s", message.delivery_id, answer.reason)
    return sent


def _slack_post(delivery, channel, token: str, message: words.Message, thread_ts: str) -> outside.Sent:
    """chat.postMessage, unless an earlier try whose outcome is unknown did post it: Slack does not deduplicate, so
    that try is looked up first (docs/notifications.md#slack) — found: sent under its ts; not found: posted again;
    the lookup failed: not posted, tried again later."""
    if delivery.maybe_sent:
        ts, failure = slack_lookup(delivery, channel, token, thread_ts)
        if ts is None:
            return outside.Sent(outcome=outside.FAILED, reason=f"not re-sent: the lookup failed ({failure})"[:300])
        if ts:
            return outside.Sent(outcome=outside.SENT, reason="found by lookup: Slack already had it", ref=ts)
    payload = {
        "channel": channel.slack_channel,
        "text": message.headline,
        "blocks": words.slack_blocks(message),
        "unfurl_links": False,
        "metadata": {"event_type": SLACK_EVENT_TYPE, "event_payload": {"delivery_id": message.delivery_id}},
    }
    if thread_ts:
        payload["thread_ts"] = thread_ts
    return outside.slack_call(channel.url, "chat.postMessage", token, payload, allow_private=channel.allow_private)


SLACK_EVENT_TYPE = "recovery_delivery"
LOOKUP_MARGIN_S = 300  # before the delivery's due time: clocks (ours, Slack's) disagree a little
LOOKUP_PAGES, LOOKUP_PAGE_SIZE = 10, 200


def slack_lookup(delivery: NotificationDelivery, channel, token: str, thread_ts: str) -> tuple[str | None, str]:
    """The ts of the message Slack already has under this delivery's id, found in the channel's history since the
    delivery's due time (no try is earlier) less a margin, or in the thread it replies in: (ts, "") found, ("", "")
    surely not there, (None, why) not known (a failed read, or more pages than LOOKUP_PAGES)."""
    method, params = "conversations.history", {}
    if thread_ts:
        method, params = "conversations.replies", {"ts": thread_ts}
    params.update(
        channel=channel.slack_channel,
        oldest=f"{delivery.due_at.timestamp() - LOOKUP_MARGIN_S:.6f}",
        include_all_metadata="true",
        limit=LOOKUP_PAGE_SIZE,
    )
    wanted = str(delivery.delivery_id)
    for _ in range(LOOKUP_PAGES):
        read, page = outside.slack_read(channel.url, method, token, params, allow_private=channel.allow_private)
        if read.outcome != outside.SENT:
            return None, read.reason
        for found in page.get("messages") or []:
            metadata = found.get("metadata") or {}
            payload = metadata.get("event_payload") or {}
            if metadata.get("event_type") == SLACK_EVENT_TYPE and payload.get("delivery_id") == wanted:
                return str(found.get("ts", "")), ""
        cursor = (page.get("response_metadata") or {}).get("next_cursor") or ""
        if not page.get("has_more") or not cursor:
            return "", ""
        params["cursor"] = cursor
    return None, f"{method}: more than {LOOKUP_PAGES} pages since the delivery was due"


def message_id(delivery_id: str) -> str:
    return f"<{delivery_id}@recovery-console>"


ASSIGNEE = "assignee"  # in an e-mail channel's addresses: the assignee of each item assigned in the message


def _recipients(delivery: NotificationDelivery, channel) -> list[str]:
    """The channel's addresses; `assignee` among them stands for the e-mail of whoever the message's assigned items
    are assigned to now (their own notification)."""
    named = [address.strip() for address in channel.email_to.split(",") if address.strip()]
    to = [address for address in named if address != ASSIGNEE]
    if ASSIGNEE in named:
        calls = NotificationEvent.objects.filter(items__delivery=delivery, kind=EventKind.ASSIGNED).values("call_id")
        emails = Assignment.objects.filter(call_id__in=calls).values_list("assignee__email", flat=True)
        to += sorted({email for email in emails if email} - set(to))
    return to


def _email(delivery: NotificationDelivery, channel, message: words.Message) -> outside.Sent:
    to = _recipients(delivery, channel)
    if not to:
        return outside.Sent(outcome=outside.SENT, reason="nobody to write to (no assignee with an e-mail address)")
    ref = message_id(message.delivery_id)
    sent = outside.send_email(
        to=to,
        subject=words.email_subject(message),
        text=words.email_text(message),
        html=words.email_html(message),
        message_id=ref,
        in_reply_to=message_id(message.follows) if message.follows else "",
    )
    if sent.outcome == outside.SENT:
        return outside.Sent(outcome=sent.outcome, reason=sent.reason, ref=ref)
    return sent

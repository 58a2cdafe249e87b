"""A Slack message whose outcome was unknown is looked up before it is posted again (Slack does not deduplicate:
docs/notifications.md#slack), against a stand-in of Slack's Web API over a real socket; and a disabled channel or
rule sends nothing more, its pending deliveries cancelled with the reason in the delivery log."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.engine.states import CallState as S
from recovery.models import DeliveryAttempt, NotificationChannel, NotificationDelivery, NotificationRule
from recovery.services.notifications import notifications_route
from recovery.statemachine.transitions import transition_call
from tests.notify_receivers import Receiver
from tests.test_notifications import SECRET, notify_settings, run_once, to_review, webhook_rule

pytestmark = pytest.mark.django_db
__all__ = ["notify_settings"]  # the fixture, shared with tests/test_notifications.py


@pytest.fixture
def slack_env(notify_settings, monkeypatch):
    monkeypatch.setenv("TEST_SLACK_TOKEN", "xoxb-test-token")
    return notify_settings


def slack_rule(slack: Receiver) -> NotificationRule:
    channel = NotificationChannel.objects.create(
        name="slack",
        kind="slack",
        url=slack.url + "/api",
        slack_channel="C0TEST",
        secret_env="TEST_SLACK_TOKEN",
        allow_private=True,
    )
    return NotificationRule.objects.create(name="slack", channel=channel, events=["human_review", "resolved"])


def paths(slack: Receiver) -> list[str]:
    return [r["path"].removeprefix("/api/") for r in slack.requests]


def log(delivery) -> list[tuple[str, str]]:
    return list(DeliveryAttempt.objects.filter(delivery=delivery).order_by("number").values_list("outcome", "reason"))


def test_a_reply_lost_after_slack_posted_is_found_not_posted_twice(slack_env, make_call, actor):
    with Receiver(slack=True, script=("hang",), hang_s=2.5, page_max=2) as slack:
        rule = slack_rule(slack)
        to_review(make_call(S.STILL_UNKNOWN), actor)
        at = timezone.now() + timedelta(seconds=rule.window_s)
        assert run_once(at) == ["unknown"]  # Slack posted it; its answer never came
        for n in range(3):  # the channel moves on: ours is on the history's second page now (newest first)
            slack.post("C0TEST", f"someone else {n}")
        assert run_once(at + timedelta(seconds=2)) == ["sent"]
        assert paths(slack) == ["chat.postMessage", "conversations.history", "conversations.history"]
        ours = [m for m in slack.posted if "metadata" in m]
        history = slack.requests[1]["body"]
    delivery = NotificationDelivery.objects.get(rule=rule)
    assert len(ours) == 1 and delivery.status == "sent" and delivery.thread_ref == ours[0]["ts"]
    assert history["include_all_metadata"] == "true" and history["channel"] == "C0TEST"
    assert float(history["oldest"]) <= float(ours[0]["ts"])
    assert slack.requests[2]["body"]["cursor"]  # paged by response_metadata.next_cursor
    assert log(delivery) == [
        ("unknown", "timed out after sending: the receiver may have it"),
        ("sent", "found by lookup: Slack already had it"),
    ]


def test_a_request_dropped_before_slack_posted_is_posted_once_on_the_retry(slack_env, make_call, actor):
    with Receiver(slack=True, script=("drop",)) as slack:
        rule = slack_rule(slack)
        to_review(make_call(S.STILL_UNKNOWN), actor)
        at = timezone.now() + timedelta(seconds=rule.window_s)
        assert run_once(at) == ["unknown"]
        assert slack.posted == []
        assert run_once(at + timedelta(seconds=2)) == ["sent"]
        assert paths(slack) == ["chat.postMessage", "conversations.history", "chat.postMessage"]
    [message] = slack.posted
    delivery = NotificationDelivery.objects.get(rule=rule)
    assert delivery.thread_ref == message["ts"]
    assert message["metadata"]["event_payload"]["delivery_id"] == str(delivery.delivery_id)


def test_a_threaded_reply_is_looked_up_in_its_thread_and_a_failed_lookup_sends_nothing(slack_env, make_call, actor):
    with Receiver(slack=True) as slack:
        rule = slack_rule(slack)
        call = to_review(make_call(S.STILL_UNKNOWN), actor)
        at = timezone.now() + timedelta(seconds=rule.window_s)
        assert run_once(at) == ["sent"]
        transition_call(call, S.COMMITTED, actor=actor, reason="approved action with evidence")
        slack.script = ["hang", "500"]  # the reply posted, its answer lost; then the lookup fails once
        slack.hang_s = 2.5
        at += timedelta(seconds=3 * rule.window_s)
        assert run_once(at) == ["unknown"]
        assert run_once(at + timedelta(seconds=2)) == ["failed"]  # not re-sent: we do not know
        assert run_once(at + timedelta(seconds=6)) == ["sent"]
        assert paths(slack)[1:] == [
            "chat.postMessage",
            "conversations.replies",
            "conversations.replies",
            "chat.update",  # an update is idempotent: done once the reply is known to be there
        ]
        replies = slack.requests[2]["body"]
    first = NotificationDelivery.objects.get(follows__isnull=True)
    follow_up = NotificationDelivery.objects.get(follows=first)
    assert [m.get("thread_ts") for m in slack.posted] == [None, first.thread_ref]  # one reply, in the thread
    assert replies["ts"] == first.thread_ref and replies["include_all_metadata"] == "true"
    assert follow_up.status == "sent" and follow_up.thread_ref == slack.posted[1]["ts"]
    assert [outcome for outcome, _ in log(follow_up)] == ["unknown", "failed", "sent"]
    assert log(follow_up)[1][1] == "not re-sent: the lookup failed (conversations.replies: HTTP 500)"


@pytest.mark.parametrize("disabled", ["channel", "rule"])
def test_a_disabled_channel_or_rule_sends_nothing_more(notify_settings, make_call, actor, disabled):
    with Receiver(secret=SECRET, script=("500",)) as receiver:
        rule = webhook_rule(receiver.url)
        first = to_review(make_call(S.STILL_UNKNOWN), actor)
        at = timezone.now() + timedelta(seconds=rule.window_s)
        assert run_once(at) == ["failed"]  # tried once, waiting for its next try
        transition_call(first, S.COMMITTED, actor=actor, reason="approved action with evidence")
        notifications_route()  # its follow-up, made before the switch-off
        assert NotificationDelivery.objects.filter(rule=rule).count() == 2
        owner = rule.channel if disabled == "channel" else rule
        owner.enabled = False
        owner.save()
        later = at + timedelta(seconds=4 * rule.window_s)
        assert run_once(later) == ["cancelled", "cancelled"]
        assert run_once(later + timedelta(hours=2)) == []
        assert len(receiver.requests) == 1
    name = rule.channel.name if disabled == "channel" else rule.name
    for delivery in NotificationDelivery.objects.filter(rule=rule):
        assert delivery.status == "cancelled"
        assert log(delivery)[-1] == ("cancelled", f"cancelled: the {disabled} {name} was disabled")


def test_a_sender_killed_after_slack_posted_is_taken_over_by_lookup(slack_env, make_call, actor):
    with Receiver(slack=True) as slack:
        rule = slack_rule(slack)
        to_review(make_call(S.STILL_UNKNOWN), actor)
        notifications_route()
        delivery = NotificationDelivery.objects.get(rule=rule)
        # What a sender killed right after Slack posted leaves: the message in the channel, the delivery claimed
        # by a lease that lapsed, no try logged.
        ts = slack.post(
            "C0TEST",
            "the first try",
            metadata={"event_type": "recovery_delivery", "event_payload": {"delivery_id": str(delivery.delivery_id)}},
        )
        lapsed = timezone.now() - timedelta(seconds=1)
        NotificationDelivery.objects.filter(pk=delivery.pk).update(status="sending", attempts=1, lease_until=lapsed)
        assert run_once(timezone.now() + timedelta(seconds=rule.window_s)) == ["sent"]
        assert paths(slack) == ["conversations.history"]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.thread_ref, delivery.maybe_sent) == ("sent", ts, True)
    assert len(slack.posted) == 1

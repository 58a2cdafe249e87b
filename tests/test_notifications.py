"""Notifications with real parts (docs/notifications.md): events written by the transitions themselves, rules
grouping them per window, deliveries sent to a real HTTP receiver that checks the signature and the delivery id,
retried with backoff and re-sent under the same id when the outcome is unknown or the sender was killed mid-try."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from recovery.api.prometheus import scrape
from recovery.engine.notify import host_refusal
from recovery.engine.states import CallState as S
from recovery.models import (
    DeliveryAttempt,
    DeliveryItem,
    NotificationChannel,
    NotificationDelivery,
    NotificationEvent,
    NotificationRule,
)
from recovery.selectors.notifications import notification_figures
from recovery.services.notifications import notifications_due_sweep, notifications_route
from recovery.services.notify_send import deliveries_due, delivery_send
from recovery.statemachine.transitions import transition_call
from tests.console import signed_in
from tests.notify_receivers import Receiver
from tests.servers import ROOT

pytestmark = pytest.mark.django_db
SECRET = "hook-secret-" + "x" * 24
BASE = "http://console.example"


@pytest.fixture
def notify_settings(settings, monkeypatch):
    settings.RECOVERY_NOTIFY_HOSTS = ["127.0.0.1"]
    settings.CONSOLE_BASE_URL = BASE
    settings.RECOVERY_NOTIFY_READ_TIMEOUT_S = 1
    settings.RECOVERY_NOTIFY_CONNECT_TIMEOUT_S = 1
    settings.RECOVERY_NOTIFY_BACKOFF_S = 2
    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    return settings


def webhook_rule(url: str, *, events=("human_review", "resolved"), window_s: int = 10, **filters) -> NotificationRule:
    channel = NotificationChannel.objects.create(
        name=f"hook-{NotificationChannel.objects.count()}",
        kind="webhook",
        url=url + "/hook",
        secret_env="TEST_HOOK_SECRET",
        allow_private=True,
    )
    return NotificationRule.objects.create(
        name=f"rule-{channel.name}", channel=channel, events=list(events), window_s=window_s, **filters
    )


def to_review(call, actor):
    return transition_call(
        call, S.HUMAN_REVIEW, actor=actor, reason="poll budget spent", changes={"outcome": "poll_budget_exhausted"}
    )


def run_once(at) -> list[str]:
    """What the notifications job does at `at`: route the events, then one try of every due delivery."""
    notifications_route(now=at)
    return [delivery_send(pk, now=at) for pk in deliveries_due(now=at)]


def test_a_review_item_makes_one_signed_message_and_its_resolution_a_follow_up(notify_settings, make_call, actor):
    with Receiver(secret=SECRET) as receiver:
        rule = webhook_rule(receiver.url)
        call = to_review(make_call(S.STILL_UNKNOWN), actor)
        event = NotificationEvent.objects.get(subject=f"call:{call.pk}")
        assert (event.kind, event.reason, event.path) == ("human_review", "poll_budget_exhausted", f"/calls/{call.pk}/")
        now = timezone.now()
        assert run_once(now) == []  # its window is still open: nothing is sent before it ends
        assert run_once(now + timedelta(seconds=rule.window_s)) == ["sent"]
        [first] = receiver.wait_for(1)
        body, headers = first["body"], first["headers"]
        assert first["signed"]
        assert headers["recovery-delivery-id"] == body["delivery_id"]
        assert body["follows"] is None
        [item] = body["items"]
        assert item["link"] == f"{BASE}/calls/{call.pk}/" and "@" not in item["link"]
        assert item["event"] == "human_review" and item["reason"] == "poll_budget_exhausted"
        assert item["due_at"]  # the resolution's due time (RECOVERY_SLA_S by risk)

        transition_call(call, S.COMMITTED, actor=actor, reason="approved action with evidence")
        later = timezone.now() + timedelta(seconds=2 * rule.window_s)
        assert run_once(later) == ["sent"]
        second = receiver.wait_for(2)[1]
        assert second["signed"] and second["body"]["follows"] == body["delivery_id"]
        assert second["body"]["items"][0]["event"] == "resolved"
        assert second["headers"]["recovery-delivery-id"] != body["delivery_id"]
        assert run_once(later + timedelta(seconds=60)) == []  # sent once: nothing more is due


def test_the_event_is_written_in_the_transition_s_transaction(notify_settings, make_call, actor):
    call = make_call(S.STILL_UNKNOWN)
    with pytest.raises(RuntimeError), transaction.atomic():
        to_review(call, actor)
        assert NotificationEvent.objects.filter(subject=f"call:{call.pk}").count() == 1
        raise RuntimeError("the change is rolled back")
    assert not NotificationEvent.objects.filter(subject=f"call:{call.pk}").exists()


def test_500_then_timeout_after_reading_then_accepted_is_one_delivery_id(notify_settings, make_call, actor):
    with Receiver(secret=SECRET, script=("500", "hang"), hang_s=2.5) as receiver:
        rule = webhook_rule(receiver.url)
        to_review(make_call(S.STILL_UNKNOWN), actor)
        at = timezone.now() + timedelta(seconds=rule.window_s)
        assert run_once(at) == ["failed"]
        delivery = NotificationDelivery.objects.get(rule=rule)
        assert delivery.status == "pending" and delivery.next_try_at == at + timedelta(seconds=2)
        assert run_once(at + timedelta(seconds=1)) == []  # backing off
        at += timedelta(seconds=2)
        assert run_once(at) == ["unknown"]
        delivery.refresh_from_db()
        assert delivery.maybe_sent and delivery.next_try_at == at + timedelta(seconds=4)  # doubled
        assert run_once(at + timedelta(seconds=4)) == ["sent"]
        got = receiver.wait_for(3)
    assert {r["headers"]["recovery-delivery-id"] for r in got} == {str(delivery.delivery_id)}
    assert all(r["signed"] for r in got)
    log = list(DeliveryAttempt.objects.filter(delivery=delivery).order_by("number").values_list("outcome", "reason"))
    assert log == [
        ("failed", "HTTP 500"),
        ("unknown", "timed out after sending: the receiver may have it"),
        ("sent", ""),
    ]
    delivery.refresh_from_db()
    assert delivery.status == "sent" and delivery.attempts == 3
    exported = {
        (sample.name, tuple(sample.labels.values())): sample.value
        for family in text_string_to_metric_families(scrape(now=timezone.now()).decode())
        for sample in family.samples
        if sample.name.startswith("recovery_notification_")
    }
    assert exported[("recovery_notification_deliveries", ("sent",))] == 1
    tried = {
        outcome: exported[("recovery_notification_tries_total", (outcome,))]
        for outcome in ("sent", "failed", "unknown")
    }
    assert tried == {"sent": 1, "failed": 1, "unknown": 1}


def test_a_storm_of_200_items_is_one_message_per_rule_window(notify_settings, make_call, actor):
    with Receiver(secret=SECRET) as receiver:
        rule = webhook_rule(receiver.url, window_s=3600)
        other = webhook_rule(receiver.url, events=("human_review",), window_s=3600, risk="low")  # matches none
        calls = [make_call(S.STILL_UNKNOWN) for _ in range(200)]
        with transaction.atomic():
            for call in calls:
                to_review(call, actor)
        events = NotificationEvent.objects.filter(kind="human_review")
        windows = {e.created_at.timestamp() // 3600 for e in events}
        assert run_once(timezone.now() + timedelta(hours=1)) == ["sent"] * len(windows)
        got = receiver.wait_for(len(windows))
    assert sum(len(r["body"]["items"]) for r in got) == 200
    # every event in exactly one delivery of the rule, none in the other rule's
    assert DeliveryItem.objects.filter(rule=rule).values("event").distinct().count() == 200
    assert DeliveryItem.objects.filter(rule=rule).count() == 200
    assert not DeliveryItem.objects.filter(rule=other).exists()


def test_rules_filter_by_tenant_tool_and_risk(notify_settings, make_call, actor, registry):
    with Receiver(secret=SECRET) as receiver:
        by_tool = webhook_rule(receiver.url, tool=registry["lookup"])
        by_risk = webhook_rule(receiver.url, risk="high")
        by_tenant = webhook_rule(receiver.url, tenant=registry["tenant"])
        to_review(make_call(S.STILL_UNKNOWN), actor)  # refund.create, high risk, tenant acme
        notifications_route()
    assert not DeliveryItem.objects.filter(rule=by_tool).exists()
    assert DeliveryItem.objects.filter(rule=by_risk).count() == 1
    assert DeliveryItem.objects.filter(rule=by_tenant).count() == 1


def test_unclaimed_past_due_escalates_once(notify_settings, make_call, actor):
    notify_settings.RECOVERY_CLAIM_DUE_S = {"high": 60, "low": 60}
    notify_settings.RECOVERY_SLA_S = {"high": 600, "low": 600}
    with Receiver(secret=SECRET) as receiver:
        escalation = webhook_rule(receiver.url, events=("unclaimed_overdue",))
        call = to_review(make_call(S.STILL_UNKNOWN), actor)
        assert notifications_due_sweep(now=timezone.now()) == 0
        later = timezone.now() + timedelta(seconds=61)
        assert notifications_due_sweep(now=later) == 1
        assert notification_figures(now=later).overdue == {"claim": 1, "resolution": 0}  # the metrics' breaches
        assert notifications_due_sweep(now=later) == 0  # once per state entered
        assert run_once(later + timedelta(seconds=10)) == ["sent"]
        [got] = receiver.wait_for(1)
    assert got["body"]["items"][0]["event"] == "unclaimed_overdue"
    assert got["body"]["items"][0]["link"] == f"{BASE}/calls/{call.pk}/"
    assert DeliveryItem.objects.filter(rule=escalation).count() == 1


def test_outbound_hosts_are_checked():
    allowed = ("hooks.example.com", ".slack.com")
    ok = {"allowed_hosts": allowed, "addresses": ("93.184.216.34",), "allow_private": False}
    assert host_refusal("https://hooks.example.com/x", **ok) == ""
    assert host_refusal("https://api.slack.com/api", **ok) == ""
    assert "not on RECOVERY_NOTIFY_HOSTS" in host_refusal("https://evil.example.net/x", **ok)
    assert "credentials" in host_refusal("https://u:p@hooks.example.com/x", **ok)
    assert "https" in host_refusal("http://hooks.example.com/x", **ok)
    loopback = {**ok, "addresses": ("127.0.0.1",)}
    assert "private or loopback" in host_refusal("https://hooks.example.com/x", **loopback)
    assert host_refusal("https://hooks.example.com/x", **{**loopback, "allow_private": True}) == ""
    private = {**ok, "addresses": ("10.0.0.8",)}
    assert "private" in host_refusal("https://hooks.example.com/x", **private)


def test_a_receiver_off_the_allow_list_gets_nothing(notify_settings, make_call, actor):
    notify_settings.RECOVERY_NOTIFY_HOSTS = ["hooks.example.com"]
    with Receiver(secret=SECRET) as receiver:
        rule = webhook_rule(receiver.url)
        to_review(make_call(S.STILL_UNKNOWN), actor)
        assert run_once(timezone.now() + timedelta(seconds=rule.window_s)) == ["failed"]
        assert receiver.requests == []
    [attempt] = DeliveryAttempt.objects.all()
    assert attempt.reason == "refused: 127.0.0.1 is not on RECOVERY_NOTIFY_HOSTS"


# --- a sender killed mid-delivery ------------------------------------------------------------------------------------

SENDER = """
import django, sys
django.setup()
from django.utils import timezone
from datetime import timedelta
from recovery.services.notify_send import delivery_send
print(delivery_send(int(sys.argv[1]), now=timezone.now() + timedelta(seconds=int(sys.argv[2]))), flush=True)
"""


def _database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.mark.django_db(transaction=True)
def test_a_sender_killed_mid_delivery_is_re_sent_under_the_same_id(notify_settings, make_call, actor):
    with Receiver(secret=SECRET, script=("hang",), hang_s=30) as receiver:
        rule = webhook_rule(receiver.url)
        to_review(make_call(S.STILL_UNKNOWN), actor)
        notifications_route()
        delivery = NotificationDelivery.objects.get(rule=rule)
        env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE"}}
        env.update(
            DJANGO_SETTINGS_MODULE="console.settings",
            DEBUG="1",
            DATABASE_URL=_database_url(),
            RECOVERY_NOTIFY_HOSTS="127.0.0.1",
            RECOVERY_NOTIFY_READ_TIMEOUT_S="60",
            CONSOLE_BASE_URL=BASE,
        )
        sender = subprocess.Popen(
            [sys.executable, "-c", SENDER, str(delivery.pk), str(rule.window_s)],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        try:
            receiver.wait_for(1, timeout_s=30)  # the message is on the wire: the receiver read it
        finally:
            os.killpg(sender.pid, signal.SIGKILL)
            sender.wait(10)
        delivery.refresh_from_db()
        assert delivery.status == "sending" and delivery.attempts == 1
        # While the lease holds nobody else sends it; once it lapsed, the next try is a re-send under the same id.
        assert delivery_send(delivery.pk, now=timezone.now() + timedelta(seconds=rule.window_s)) == ""
        lapsed = delivery.lease_until + timedelta(seconds=1)
        assert delivery_send(delivery.pk, now=lapsed) == "sent"
        got = receiver.wait_for(2)
    assert [r["headers"]["recovery-delivery-id"] for r in got] == [str(delivery.delivery_id)] * 2
    delivery.refresh_from_db()
    assert delivery.maybe_sent and delivery.status == "sent" and delivery.attempts == 2
    assert time.time()  # the receiver shut down with the hanging handler still asleep: a daemon thread


# --- e-mail through a real SMTP server, Slack through a stand-in of its Web API -------------------------------------


@pytest.fixture
def smtp_server(notify_settings):
    from aiosmtpd.controller import Controller

    from tests.servers import free_port

    class Inbox:
        def __init__(self):
            self.messages = []

        async def handle_DATA(self, server, session, envelope):
            self.messages.append((envelope.rcpt_tos, envelope.content))
            return "250 OK"

    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    notify_settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    notify_settings.EMAIL_HOST, notify_settings.EMAIL_PORT = "127.0.0.1", controller.port
    yield inbox
    controller.stop()


def test_e_mail_is_plain_and_html_under_a_stable_message_id_and_threads_its_follow_up(smtp_server, make_call, actor):
    from email import message_from_bytes

    channel = NotificationChannel.objects.create(name="mail", kind="email", email_to="oncall@example.com")
    rule = NotificationRule.objects.create(name="mail", channel=channel, events=["human_review", "resolved"])
    call = to_review(make_call(S.STILL_UNKNOWN), actor)
    assert run_once(timezone.now() + timedelta(seconds=rule.window_s)) == ["sent"]
    transition_call(call, S.COMMITTED, actor=actor, reason="approved action with evidence")
    assert run_once(timezone.now() + timedelta(seconds=3 * rule.window_s)) == ["sent"]
    first, second = (message_from_bytes(content) for _, content in smtp_server.messages)
    assert smtp_server.messages[0][0] == ["oncall@example.com"]
    original = NotificationDelivery.objects.get(follows__isnull=True)
    assert first["Message-ID"] == f"<{original.delivery_id}@recovery-console>" == original.thread_ref
    assert first.get_content_type() == "multipart/alternative"
    plain, html = (part.get_payload(decode=True).decode() for part in first.get_payload())
    assert f"{BASE}/calls/{call.pk}/" in plain and f'href="{BASE}/calls/{call.pk}/"' in html
    assert "poll_budget_exhausted" in plain
    assert second["In-Reply-To"] == first["Message-ID"] and second["Subject"].startswith("Re: ")


def test_slack_posts_block_kit_threads_the_follow_up_and_updates_the_original(
    notify_settings, make_call, actor, monkeypatch
):
    monkeypatch.setenv("TEST_SLACK_TOKEN", "xoxb-test-token")
    with Receiver(slack=True) as slack:
        channel = NotificationChannel.objects.create(
            name="slack",
            kind="slack",
            url=slack.url + "/api",
            slack_channel="C0TEST",
            secret_env="TEST_SLACK_TOKEN",
            allow_private=True,
        )
        rule = NotificationRule.objects.create(name="slack", channel=channel, events=["human_review", "resolved"])
        call = to_review(make_call(S.STILL_UNKNOWN), actor)
        assert run_once(timezone.now() + timedelta(seconds=rule.window_s)) == ["sent"]
        transition_call(call, S.COMMITTED, actor=actor, reason="approved action with evidence")
        assert run_once(timezone.now() + timedelta(seconds=3 * rule.window_s)) == ["sent"]
        post, reply, update = slack.wait_for(3)
    assert [r["path"] for r in (post, reply, update)] == [
        "/api/chat.postMessage",
        "/api/chat.postMessage",
        "/api/chat.update",
    ]
    assert post["headers"]["authorization"] == "Bearer xoxb-test-token"
    original = NotificationDelivery.objects.get(follows__isnull=True)
    assert original.thread_ref == slack.posted[0]["ts"]  # the ts Slack answered
    assert "thread_ts" not in post["body"] and reply["body"]["thread_ts"] == original.thread_ref
    assert update["body"]["ts"] == original.thread_ref and update["body"]["channel"] == "C0TEST"
    assert_block_kit(post["body"])
    assert post["body"]["blocks"][1]["accessory"]["url"] == f"{BASE}/calls/{call.pk}/"
    assert post["body"]["metadata"]["event_payload"]["delivery_id"] == str(original.delivery_id)


def assert_block_kit(payload: dict) -> None:
    """The documented shape (api.slack.com/reference/block-kit): a fallback text, at most 50 blocks, a header of
    plain_text up to 150 characters, sections of mrkdwn up to 3000 with a button accessory (text up to 75, url)."""
    assert payload["channel"] and isinstance(payload["text"], str) and payload["text"]
    blocks = payload["blocks"]
    assert 1 <= len(blocks) <= 50
    assert blocks[0]["type"] == "header" and blocks[0]["text"]["type"] == "plain_text"
    assert len(blocks[0]["text"]["text"]) <= 150
    for block in blocks[1:]:
        assert block["type"] in ("section", "context")
        if block["type"] == "section":
            assert block["text"]["type"] == "mrkdwn" and len(block["text"]["text"]) <= 3000
            button = block["accessory"]
            assert button["type"] == "button" and button["text"]["type"] == "plain_text"
            assert len(button["text"]["text"]) <= 75 and button["url"].startswith("http")
            assert len(button["action_id"]) <= 255


# --- the other events: a breaker opened or forced open, an approval requested ----------------------------------------


def test_breakers_and_approval_requests_write_their_events(people, registry):
    from recovery.audit.chain import Actor
    from recovery.models import Tool
    from recovery.services.breaker_operations import breaker_force_open, breaker_preview, breaker_request_reset
    from recovery.services.breakers import breaker_record

    policy = {"window_s": 60, "min_calls": 4, "failure_rate": 0.5, "cooldown_s": 30, "half_open_probes": 1,
              "probe_lease_s": 60}  # fmt: skip
    failing = Tool.objects.create(
        name="order.search", provider=registry["provider"], side_effect="read", breaker=policy
    )
    for _ in range(4):
        breaker_record(failing, counts_as_failure=True, probe=False, now=timezone.now())
    [opened] = NotificationEvent.objects.filter(kind="breaker_opened")
    assert (opened.subject, opened.tool_id, opened.reason) == (f"breaker:{failing.pk}", failing.pk, "opened")
    assert opened.title == "The circuit breaker of order.search opened"

    reviewer, refund = people["reviewer"], registry["refund"]
    breaker_force_open(tool_id=refund.pk, user=reviewer, actor=Actor.for_user(reviewer), reason="incident INC-7")
    forced = NotificationEvent.objects.get(kind="breaker_opened", subject=f"breaker:{refund.pk}")
    assert forced.title == "The circuit breaker of refund.create was forced open by an operator"
    assert "INC-7" not in forced.title  # an operator's words stay in the audit trail, not in messages

    seen = breaker_preview(tool_id=refund.pk, operation="reset").version
    op = breaker_request_reset(
        tool_id=refund.pk, user=reviewer, actor=Actor.for_user(reviewer), reason="fixed", seen=seen
    )
    asked = NotificationEvent.objects.get(kind="approval_requested")
    assert asked.subject == f"approval:breakeroperation:{op.pk}" and asked.path == "/approvals/"


@pytest.mark.postgres  # SQLite does not refuse an over-long value: the failing insert needs PostgreSQL
def test_a_failed_event_insert_never_undoes_the_change_it_describes(make_call, actor):
    from recovery.statemachine.notices import notice

    call = make_call(S.STILL_UNKNOWN)
    with transaction.atomic():
        to_review(call, actor)
        assert notice("k" * 40, subject="call:x", title="too long a kind for its column") is False
    call.refresh_from_db()
    assert call.state == S.HUMAN_REVIEW  # the transaction went on and committed
    assert NotificationEvent.objects.filter(subject=f"call:{call.pk}").count() == 1


def test_a_follow_up_is_never_sent_before_the_message_it_follows(notify_settings, make_call, actor):
    with Receiver(secret=SECRET) as receiver:
        rule = webhook_rule(receiver.url)
        call = to_review(make_call(S.STILL_UNKNOWN), actor)
        transition_call(call, S.COMMITTED, actor=actor, reason="approved action with evidence")  # the same window
        notifications_route()
        first = NotificationDelivery.objects.get(rule=rule, follows__isnull=True)
        follow_up = NotificationDelivery.objects.get(rule=rule, follows=first)
        at = timezone.now() + timedelta(seconds=rule.window_s)
        assert delivery_send(follow_up.pk, now=at) == ""  # its first message is not sent yet: it waits, uncounted
        follow_up.refresh_from_db()
        assert (follow_up.status, follow_up.attempts) == ("pending", 0)
        assert run_once(at) == ["sent"]
        assert run_once(at + timedelta(seconds=6)) == ["sent"]
        got = receiver.wait_for(2)
    assert [r["body"]["follows"] for r in got] == [None, str(first.delivery_id)]


def test_an_assignment_e_mails_the_assignee(smtp_server, make_call, actor, people):
    from email import message_from_bytes

    from recovery.services.assignments import call_assign

    people["reviewer2"].email = "reviewer2@example.com"
    people["reviewer2"].save()
    channel = NotificationChannel.objects.create(name="assignees", kind="email", email_to="assignee, lead@example.com")
    rule = NotificationRule.objects.create(name="assigned", channel=channel, events=["assigned"])
    call = to_review(make_call(S.STILL_UNKNOWN), actor)
    reviewer = people["reviewer"]
    from recovery.audit.chain import Actor

    call_assign(call_id=call.pk, assignee="reviewer2", user=reviewer, actor=Actor.for_user(reviewer))
    assert run_once(timezone.now() + timedelta(seconds=rule.window_s)) == ["sent"]
    [(recipients, content)] = smtp_server.messages
    assert sorted(recipients) == ["lead@example.com", "reviewer2@example.com"]
    assert "assigned to reviewer2 by reviewer" in message_from_bytes(content)["Subject"]


def test_a_rule_added_in_the_admin_catches_up_with_the_calls_already_waiting(notify_settings, make_call, actor, people):
    """The demo's HUMAN_REVIEW refund entered its queue before any rule existed: the rule an admin then adds lists it
    in its first message (one message for what waits, not one per old window), and its resolution follows it up. A
    call that was resolved before the rule, and one the rule's filter excludes, are not listed."""
    waiting = to_review(make_call(S.STILL_UNKNOWN), actor)
    gone = to_review(make_call(S.STILL_UNKNOWN), actor)
    transition_call(gone, S.COMMITTED, actor=actor, reason="settled before the rule")
    unknown = transition_call(make_call(S.UNKNOWN), S.STILL_UNKNOWN, actor=actor, reason="checks used up")
    before = timezone.now()
    assert notifications_route(now=before) == 4  # no rule yet: routed to nothing
    with Receiver(secret=SECRET) as receiver:
        channel = NotificationChannel.objects.create(
            name="hook", kind="webhook", url=receiver.url + "/hook", secret_env="TEST_HOOK_SECRET", allow_private=True
        )
        client = signed_in(people, "admin")
        form = {"name": "review", "channel": channel.pk, "events": '["human_review", "resolved"]', "window_s": 10}
        answer = client.post("/admin/recovery/notificationrule/add/", {**form, "risk": "", "enabled": "on"})
        assert answer.status_code == 302, answer.content.decode()[:2000]
        rule = NotificationRule.objects.get(name="review")
        assert run_once(timezone.now() + timedelta(seconds=rule.window_s)) == ["sent"]
        [first] = receiver.wait_for(1)
        assert first["signed"]
        assert [item["link"] for item in first["body"]["items"]] == [f"{BASE}/calls/{waiting.pk}/"]
        assert unknown.state == S.STILL_UNKNOWN  # waiting too, but the rule names only human_review
        transition_call(waiting, S.COMMITTED, actor=actor, reason="approved action with evidence")
        assert run_once(timezone.now() + timedelta(seconds=3 * rule.window_s)) == ["sent"]
        second = receiver.wait_for(2)[1]
        assert second["body"]["follows"] == first["body"]["delivery_id"]
        assert second["body"]["items"][0]["event"] == "resolved"

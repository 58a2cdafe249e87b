"""Saved views and the delivery log in the console (docs/notifications.md): a user saves a queue's filters under a
name, the navigation lists the view with its live count, a bad name changes nothing, and the log shows every try."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from recovery.models import (
    Assignment,
    DeliveryAttempt,
    NotificationChannel,
    NotificationDelivery,
    NotificationRule,
    SavedView,
)
from tests.console import PASSWORD, signed_in


def test_a_saved_view_is_listed_in_the_navigation_with_its_live_count(people, make_call, registry):
    calls = [make_call("HUMAN_REVIEW") for _ in range(3)]
    Assignment.objects.create(call=calls[0], assignee=people["reviewer"], assigned_by=people["reviewer"])
    reviewer = signed_in(people, "reviewer")
    page = reviewer.get("/queues/human-review/?assigned=me&after=bogus").content.decode()
    assert '<input type="hidden" name="query" value="assigned=me">' in page  # never the page position
    response = reviewer.post("/views/", {"name": "Mine", "queue": "human-review", "query": "assigned=me&after=x"})
    assert response.status_code == 302 and response["Location"] == "/queues/human-review/?assigned=me"
    view = SavedView.objects.get(user=people["reviewer"])
    assert (view.name, view.queue, view.query) == ("Mine", "human-review", "assigned=me")
    nav = reviewer.get("/queues/counts/").content.decode()
    assert f'data-subject="view:{view.pk}" data-value="1"' in nav and ">Mine <span" in nav
    Assignment.objects.create(call=calls[1], assignee=people["reviewer"], assigned_by=people["reviewer"])
    nav = reviewer.get("/queues/counts/").content.decode()
    assert f'data-subject="view:{view.pk}" data-value="2"' in nav  # live
    assert "Mine" not in signed_in(people, "reviewer2").get("/queues/counts/").content.decode()  # theirs only

    reviewer.post(f"/views/{view.pk}/delete/")
    assert not SavedView.objects.exists()
    assert "view:" not in reviewer.get("/queues/counts/").content.decode()


def test_a_view_without_a_name_or_queue_changes_nothing(people):
    viewer = signed_in(people, "viewer")
    viewer.post("/views/", {"name": " ", "queue": "human-review", "query": "risk=high"})
    viewer.post("/views/", {"name": "x", "queue": "nope", "query": ""})
    assert not SavedView.objects.exists()


def test_the_delivery_log_shows_every_try_and_the_receivers_answer(people, db):
    channel = NotificationChannel.objects.create(name="hook", kind="webhook", url="https://hooks.example.com/x")
    rule = NotificationRule.objects.create(name="reviews", channel=channel, events=["human_review"])
    now = timezone.now()
    delivery = NotificationDelivery.objects.create(
        rule=rule, window_start=now, due_at=now, next_try_at=now + timedelta(seconds=4)
    )
    DeliveryAttempt.objects.create(
        delivery=delivery, number=1, outcome="failed", status_code=500, reason="HTTP 500", answer='{"error": "boom"}'
    )
    DeliveryAttempt.objects.create(
        delivery=delivery, number=2, outcome="unknown", reason="timed out after sending: the receiver may have it"
    )
    page = signed_in(people, "viewer").get("/notifications/").content.decode()
    assert str(delivery.delivery_id) in page and "reviews" in page and "hook (webhook)" in page
    assert "failed (500): HTTP 500" in page and "answer: <code>{&quot;error&quot;: &quot;boom&quot;}</code>" in page
    assert "unknown: timed out after sending" in page


def test_saved_views_are_listed_again_after_signing_in_anew(people, client):
    SavedView.objects.create(user=people["viewer"], name="High risk", queue="unknown", query="risk=high")
    assert client.post("/sign-in/", {"username": "viewer", "password": PASSWORD}).status_code == 302
    assert ">High risk <span" in client.get("/queues/counts/").content.decode()

"""Assignment and due times on the queues (docs/notifications.md): a reviewer assigns an item (audited, notified), the
queues filter by assignee in both readings of the page, a refusal writes nothing, and rows say when they are due."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import Assignment, AuditEvent, Call, NotificationEvent
from recovery.selectors.queues import QUEUES, QueueFilters, queue_page
from tests.console import signed_in


def _review_items(make_call, n: int, *, minutes_ago: int = 1) -> list[Call]:
    calls = [make_call("HUMAN_REVIEW") for _ in range(n)]
    Call.objects.filter(pk__in=[c.pk for c in calls]).update(
        state_changed_at=timezone.now() - timedelta(minutes=minutes_ago)
    )
    return calls


def test_a_reviewer_assigns_to_themselves_audited_and_notified(people, make_call):
    mine, other = _review_items(make_call, 2)
    reviewer = signed_in(people, "reviewer")
    response = reviewer.post(f"/calls/{mine.pk}/assign/", {"assignee": "me", "next": "/queues/human-review/"})
    assert response.status_code == 302
    assert Assignment.objects.get(call=mine).assignee == people["reviewer"]
    event = AuditEvent.objects.get(action="call.assigned", call_id=mine.pk)
    assert event.evidence == {"assignee": "reviewer"} and event.actor_user == people["reviewer"]
    assert NotificationEvent.objects.get(kind="assigned").subject == f"call:{mine.pk}"

    page = reviewer.get("/queues/human-review/?assigned=me").content.decode()
    assert f'data-id="{mine.pk}"' in page and f'data-id="{other.pk}"' not in page
    assert "assigned to reviewer" in page
    page = reviewer.get("/queues/human-review/?assigned=none").content.decode()
    assert f'data-id="{other.pk}"' in page and f'data-id="{mine.pk}"' not in page
    page = signed_in(people, "reviewer2").get("/queues/human-review/?assigned=me").content.decode()
    assert 'data-id="' not in page


def test_assigning_to_someone_who_is_not_a_reviewer_changes_nothing(people, make_call):
    (call,) = _review_items(make_call, 1)
    response = signed_in(people, "reviewer").post(f"/calls/{call.pk}/assign/", {"assignee": "viewer"})
    assert response.status_code == 302  # back, with the refusal as a message
    assert not Assignment.objects.exists() and not AuditEvent.objects.filter(action="call.assigned").exists()
    assert signed_in(people, "viewer").post(f"/calls/{call.pk}/assign/", {"assignee": "me"}).status_code == 403
    assert not Assignment.objects.exists()


def test_the_htmx_assign_answers_the_row_with_its_assignee(people, make_call):
    (call,) = _review_items(make_call, 1)
    response = signed_in(people, "reviewer").post(
        f"/calls/{call.pk}/assign/?queue=human-review", {"assignee": "reviewer2"}, HTTP_HX_REQUEST="true"
    )
    row = response.content.decode()
    assert response.status_code == 200 and row.lstrip().startswith(f'<tr id="call-{call.pk}"')
    assert "assigned to reviewer2" in row and "assign-me" in row  # still theirs to take


@pytest.mark.parametrize("raw", [True, False], ids=["sql", "orm"])
def test_both_readings_of_the_page_filter_by_assignee_alike(people, make_call, settings, raw):
    settings.RECOVERY_HOT_PATH_SQL = raw
    calls = _review_items(make_call, 3)
    Assignment.objects.create(call=calls[1], assignee=people["reviewer"], assigned_by=people["reviewer"])
    states = QUEUES["human-review"].states
    now = timezone.now()
    mine = queue_page(QueueFilters(states=states, assignee_id=people["reviewer"].pk), now=now).rows
    nobody = queue_page(QueueFilters(states=states, unassigned=True), now=now).rows
    assert [r["id"] for r in mine] == [calls[1].pk]
    assert sorted(r["id"] for r in nobody) == sorted([calls[0].pk, calls[2].pk])


def test_rows_say_when_they_are_due_and_overdue(people, make_call, settings):
    settings.RECOVERY_CLAIM_DUE_S = {"high": 300, "low": 300}
    settings.RECOVERY_SLA_S = {"high": 900, "low": 900}
    (late,) = _review_items(make_call, 1, minutes_ago=10)
    (fresh,) = _review_items(make_call, 1, minutes_ago=1)
    page = signed_in(people, "viewer").get("/queues/human-review/").content.decode()
    late_row = page[page.index(f'id="call-{late.pk}"') :].split("</tr>")[0]
    fresh_row = page[page.index(f'id="call-{fresh.pk}"') :].split("</tr>")[0]
    assert 'data-value="overdue"' in late_row and "claim overdue 5 min" in late_row
    assert 'data-value="due"' in fresh_row and ("claim due in 3 min" in fresh_row or "claim due in 4 min" in fresh_row)


def test_the_call_page_shows_due_and_assignee_and_assigns_a_named_reviewer(people, make_call):
    (call,) = _review_items(make_call, 1, minutes_ago=30)
    reviewer = signed_in(people, "reviewer")
    page = reviewer.get(f"/calls/{call.pk}/").content.decode()
    assert 'data-fact="due" data-value="overdue"' in page and "claim overdue" in page
    assert '<option value="reviewer2">reviewer2</option>' in page and '<option value="viewer">' not in page
    response = reviewer.post(f"/calls/{call.pk}/assign/", {"assignee": "reviewer2", "next": f"/calls/{call.pk}/"})
    assert response.status_code == 302 and response["Location"] == f"/calls/{call.pk}/"
    page = reviewer.get(f"/calls/{call.pk}/").content.decode()
    assert '<strong class="assignee">reviewer2</strong>' in page
    reviewer.post(f"/calls/{call.pk}/assign/", {"unassign": "1"})
    assert not Assignment.objects.exists()
    assert AuditEvent.objects.filter(action="call.unassigned", call_id=call.pk).count() == 1


def test_time_to_first_claim_counts_each_queue_entry_s_first_claim_once(people, make_call, actor):
    from prometheus_client.parser import text_string_to_metric_families

    from recovery.api.prometheus import scrape
    from recovery.services.claims import call_claim, call_release
    from recovery.services.metrics import metrics_fold
    from recovery.statemachine.transitions import transition_call

    call = transition_call(make_call("STILL_UNKNOWN"), "HUMAN_REVIEW", actor=actor, reason="poll budget spent")
    reviewer = people["reviewer"]
    for _ in range(2):  # claimed, released, claimed again: one first claim
        call_claim(call_id=call.pk, user=reviewer, actor=Actor.for_user(reviewer))
        call_release(call_id=call.pk, user=reviewer, actor=Actor.for_user(reviewer))
    metrics_fold()
    samples = {
        (sample.name, sample.labels.get("queue")): sample.value
        for family in text_string_to_metric_families(scrape(now=timezone.now()).decode())
        for sample in family.samples
        if sample.name.startswith("recovery_time_to_first_claim_seconds")
    }
    assert samples[("recovery_time_to_first_claim_seconds_count", "human_review")] == 1
    assert samples[("recovery_time_to_first_claim_seconds_count", "unknown")] == 0  # STILL_UNKNOWN: never claimed


def test_a_queue_sorts_by_due_time_and_pages_through_it(people, make_call, settings):
    settings.RECOVERY_SLA_S = {"high": 900, "low": 14_400}
    now = timezone.now()
    entered = {"high": [10, 1], "low": [120]}  # minutes ago
    made = {}
    for risk, ages in entered.items():
        for minutes in ages:
            call = make_call("HUMAN_REVIEW")
            Call.objects.filter(pk=call.pk).update(risk=risk, state_changed_at=now - timedelta(minutes=minutes))
            made[(risk, minutes)] = call.pk
    # due: high 10 min ago → in 5 min; high 1 min ago → in 14 min; low 2 h ago → in 2 h (first by age, last by due)
    expected = [made[("high", 10)], made[("high", 1)], made[("low", 120)]]
    filters = QueueFilters(states=QUEUES["human-review"].states, due_first=True)
    seen, after = [], None
    while True:
        page = queue_page(replace(filters, after=after), now=now, size=1)
        seen += [row["id"] for row in page.rows]
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert seen == expected
    html = signed_in(people, "viewer").get("/queues/human-review/?sort=due").content.decode()
    assert [html.index(f'data-id="{pk}"') for pk in expected] == sorted(
        html.index(f'data-id="{pk}"') for pk in expected
    )

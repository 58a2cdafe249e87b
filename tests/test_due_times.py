"""Due times per queue and risk (docs/notifications.md#due-times): RECOVERY_CLAIM_DUE_S and RECOVERY_SLA_S take a
"<queue>.<risk>" value over the risk's, checked when the settings load, and every reader agrees on it — the rows, the
call page, the due sort, the escalation sweep and the metrics (one function, recovery.engine.due.due_seconds)."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from recovery.engine.due import DUE_QUEUES
from recovery.models import Call, NotificationEvent
from recovery.selectors.notifications import notification_figures
from recovery.selectors.queues import QUEUES, QueueFilters, queue_page
from recovery.services.notifications import notifications_due_sweep
from tests.console import signed_in

VAR = "RECOVERY_TEST_DUE_S"
RISKS = ("high", "low")


def read(monkeypatch, raw: str) -> dict[str, int]:
    from console.env import env_seconds_by_key

    monkeypatch.setenv(VAR, raw)
    return env_seconds_by_key(VAR, {"high": 1, "low": 2}, keys=RISKS, scopes=tuple(DUE_QUEUES))


def test_a_queue_s_value_is_read_beside_the_risks(monkeypatch):
    table = read(monkeypatch, "high=300,low=3600,human-review.high=120, compensation-problems.low = 60")
    assert table == {"high": 300, "low": 3600, "human-review.high": 120, "compensation-problems.low": 60}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("high=300,low=3600,human-reveiw.high=120", "'human-reveiw.high' is not <queue>.<risk> (queue one of"),
        ("high=300,low=3600,human-review.medium=120", "'human-review.medium' is not <queue>.<risk>"),
        ("high=300,low=3600,human-review.high=120,human-review.high=60", "'human-review.high' is given twice"),
        ("high=300,low=3600,unknown.low=0", "unknown.low='0' is not a whole number of seconds above 0"),
        ("human-review.high=120,low=3600", "high missing"),  # a queue's value never stands for the risk's
        ("high=300,lwo=3600", "'lwo' is not one of high, low"),
    ],
)
def test_a_bad_key_is_refused_by_name(monkeypatch, raw, message):
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        read(monkeypatch, raw)


def _item(make_call, state: str, risk: str, minutes_ago: int) -> Call:
    call = make_call(state)
    Call.objects.filter(pk=call.pk).update(risk=risk, state_changed_at=timezone.now() - timedelta(minutes=minutes_ago))
    return call


def _row(page: str, call: Call) -> str:
    return page[page.index(f'id="call-{call.pk}"') :].split("</tr>")[0]


@pytest.mark.django_db
def test_every_reader_takes_the_queue_s_due_time_over_the_risk_s(people, make_call, settings):
    settings.RECOVERY_CLAIM_DUE_S = {"high": 300, "low": 3600, "human-review.high": 60}
    settings.RECOVERY_SLA_S = {"high": 900, "low": 14_400, "unknown.low": 60}
    review_high = _item(make_call, "HUMAN_REVIEW", "high", 2)  # claim due 1 min after: overdue
    unknown_high = _item(make_call, "STILL_UNKNOWN", "high", 2)  # the risk's 5 min: due in 3 less a moment
    unknown_low = _item(make_call, "STILL_UNKNOWN", "low", 2)  # resolution due 1 min after: overdue
    viewer = signed_in(people, "viewer")

    review = viewer.get("/queues/human-review/").content.decode()
    assert "claim overdue 1 min" in _row(review, review_high)
    unknown = viewer.get("/queues/unknown/").content.decode()
    assert "claim due in 2 min" in _row(unknown, unknown_high)  # 2 min 59 s, floored
    assert "resolution overdue 1 min" in _row(unknown, unknown_low)  # the claim is never due after it
    call_page = viewer.get(f"/calls/{review_high.pk}/").content.decode()
    assert 'data-fact="due" data-value="overdue"' in call_page and "claim overdue 1 min" in call_page

    now = timezone.now()
    filters = QueueFilters(states=QUEUES["unknown"].states, due_first=True)
    first = queue_page(filters, now=now, size=1)
    rest = queue_page(replace(filters, after=first.next_cursor), now=now, size=5)
    assert [row["id"] for row in (*first.rows, *rest.rows)] == [unknown_low.pk, unknown_high.pk]

    assert notification_figures(now=now).overdue == {"claim": 2, "resolution": 1}
    assert notifications_due_sweep(now=now) == 3
    raised = set(NotificationEvent.objects.values_list("kind", "subject"))
    assert raised == {
        ("unclaimed_overdue", f"call:{review_high.pk}"),
        ("unclaimed_overdue", f"call:{unknown_low.pk}"),
        ("overdue", f"call:{unknown_low.pk}"),
    }


def test_the_process_refuses_to_start_with_a_bad_queue_key_and_reads_a_good_one(tmp_path):
    from tests.test_settings import _manage, _production_env

    bad = _production_env(tmp_path, RECOVERY_CLAIM_DUE_S="high=300,low=3600,humanreview.high=120")
    result = _manage(bad, "check")
    assert result.returncode != 0
    assert "RECOVERY_CLAIM_DUE_S='high=300,low=3600,humanreview.high=120': 'humanreview.high' is not" in result.stderr
    good = _production_env(tmp_path, RECOVERY_CLAIM_DUE_S="high=300,low=3600,human-review.high=120")
    shown = _manage(good, "shell", "-c", "from django.conf import settings; print(settings.RECOVERY_CLAIM_DUE_S)")
    assert shown.stdout.strip().splitlines()[-1] == "{'high': 300, 'low': 3600, 'human-review.high': 120}", shown.stderr


@pytest.mark.django_db
def test_the_due_sort_reads_a_page_of_each_state_and_risk_at_most(make_call, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.RECOVERY_SLA_S = {"high": 900, "low": 14_400, "unknown.low": 60}
    made = [_item(make_call, "STILL_UNKNOWN", risk, minutes) for risk in RISKS for minutes in range(1, 5)]
    made += [_item(make_call, "UNKNOWN", "high", 3)]
    filters = QueueFilters(states=QUEUES["unknown"].states, due_first=True)
    seen, after = [], None
    with CaptureQueriesContext(connection) as queries:
        while True:
            page = queue_page(replace(filters, after=after), now=timezone.now(), size=3)
            seen += [row["id"] for row in page.rows]
            if page.next_cursor is None:
                break
            after = page.next_cursor
    fields = Call.objects.filter(pk__in=[call.pk for call in made]).values_list(
        "id", "state_changed_at", "risk", "state"
    )
    seconds = {("STILL_UNKNOWN", "low"): 60, ("STILL_UNKNOWN", "high"): 900, ("UNKNOWN", "high"): 900}
    due = {pk: (at + timedelta(seconds=seconds[(state, risk)]), pk) for pk, at, risk, state in fields}
    assert seen == sorted(due, key=due.__getitem__)
    # every statement reads one state and one risk in entry order, a page at most: never the whole queue sorted
    assert len(queries.captured_queries) <= 4 * 4  # four parts (two states, two risks) per page, four pages
    for query in queries.captured_queries:
        sql = query["sql"]
        assert '"recovery_call"."risk" = ' in sql and '"recovery_call"."state" = ' in sql, sql
        assert re.search(r"ORDER BY \S+ ASC, \S+ ASC LIMIT 4$", sql.strip()) and "CASE" not in sql, sql

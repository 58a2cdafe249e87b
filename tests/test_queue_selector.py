"""The queue page's statement (recovery/selectors/queues.py) is SQL written once from the models, for speed; it must
read exactly what the ORM reads for the same filters: each filter alone and combined, both orders, every page by
keyset (with rows sharing a timestamp across page boundaries), and each row's values and names, on the backend the
suite runs on (SQLite by default, PostgreSQL in CI). The selector's own ORM twin (RECOVERY_HOT_PATH_SQL off, what the
benchmark times the SQL against) passes the same tests and gives the same rows.

The compensation problems queue is one more case of each: its membership (a COMPENSATING call only while its open
entry is in review or stuck past RECOVERY_COMPENSATION_STUCK_S) is read here a third way, in Python from the
entries, and both the SQL and the ORM twin must list exactly those calls."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db.models import Q
from django.utils import timezone

from recovery.models import Call, CompensationEntry, Step, Task, Tenant
from recovery.selectors.queues import QUEUES, QueueFilters, call_row, queue_counts, queue_options, queue_page

STATES = ("UNKNOWN", "STILL_UNKNOWN", "HUMAN_REVIEW", "COMMITTED")
COMPENSATION = QUEUES["compensation-problems"]
STUCK_S = 300
# (the call's state, its entries as (state, minutes in it), oldest first): listed or not, and why.
SAGAS = [
    ("COMPENSATING", [("review", 1)]),  # listed: a person decides
    ("COMPENSATING", [("unknown", 10)]),  # listed: unknown past the threshold
    ("COMPENSATING", [("unknown", 1)]),  # not yet: being reconciled
    ("COMPENSATING", [("pending", 6)]),  # listed: never sent
    ("COMPENSATING", [("sent", 30)]),  # listed: in flight for half an hour
    ("COMPENSATING", [("not_committed", 30)]),  # not listed: sent again by the schedule
    ("COMPENSATING", [("failed", 60), ("pending", 1)]),  # not listed: a new entry, just made
    ("COMPENSATING", [("failed", 60), ("review", 2)]),  # listed
    ("COMPENSATING", []),  # not listed (no entry to show)
    ("PARTIAL_COMPENSATED", [("committed", 20)]),  # listed: less than expected undone
    ("COMPENSATION_FAILED", [("failed", 20)]),  # listed: nothing undone
    ("COMPENSATED", [("committed", 20)]),  # not listed: done
]


@pytest.fixture(params=["sql", "orm"])
def reader(request, settings):
    """The selector's SQL, or its ORM twin."""
    settings.RECOVERY_HOT_PATH_SQL = request.param == "sql"
    return request.param


@pytest.fixture
def backlog(registry, people, make_call):
    """60 calls over two tenants, two tools, three tasks and four states; every three share a state_changed_at, so
    pages of 7 split groups of equal timestamps; some claimed (one claim expired), some with a receipt or a
    provider ref."""
    now = timezone.now()
    globex = Tenant.objects.create(name="globex", sandbox=True, all_tools=True)
    tasks = [
        Task.objects.create(tenant=tenant, external_id=f"ext-{n}", agent="demo", goal="g")
        for n, tenant in enumerate([registry["tenant"], registry["tenant"], globex])
    ]
    for owner in tasks:
        Step.objects.create(task=owner, index=2)
    rng = random.Random(7)
    for n in range(60):
        owner = tasks[n % 3]
        call = make_call(STATES[n % 4], tool=registry["refund" if n % 5 else "lookup"], on_task=owner)
        fields = {
            "state_changed_at": now - timedelta(minutes=5 * (n // 3) + 1),
            "step": Step.objects.get(task=owner, index=1 + n % 2),
        }
        if n % 6 == 0:
            fields |= {"checks_made": 2, "last_receipt_status": "pending"}
            fields["last_receipt_at"] = now - timedelta(seconds=n)
        if n % 7 == 0:
            fields |= {"provider_ref": f"re_{n}"}
        if n % 8 == 0:
            holder = people["reviewer" if n % 16 else "reviewer2"]
            fields |= {"claimed_by": holder, "claim_until": now + timedelta(minutes=rng.choice([-5, 10]))}
        Call.objects.filter(pk=call.pk).update(**fields)
    for n in range(3 * len(SAGAS)):
        _saga(n, now, tasks, registry, people, make_call)
    return {"now": now, "tasks": tasks, "globex": globex}


@pytest.fixture(autouse=True)
def _stuck_threshold(settings):
    settings.RECOVERY_COMPENSATION_STUCK_S = STUCK_S


def _saga(n: int, now, tasks, registry, people, make_call) -> None:
    """One call of SAGAS (each three times, on different tasks, tools and risks), its entries, and the same spread of
    timestamps, claims and receipts as the backlog's other calls."""
    owner = tasks[n % 3]
    state, entries = SAGAS[n % len(SAGAS)]
    call = make_call(state, tool=registry["refund" if n % 4 else "lookup"], on_task=owner)
    fields = {
        "state_changed_at": now - timedelta(minutes=4 * (n // 3) + 2),
        "step": Step.objects.get(task=owner, index=1 + n % 2),
    }
    if n % 5 == 0:
        fields |= {"checks_made": 1, "last_receipt_status": "committed", "last_receipt_at": now - timedelta(hours=1)}
        fields |= {"provider_ref": f"ord_{n}"}
    if n % 6 == 0:
        fields |= {"claimed_by": people["reviewer"], "claim_until": now + timedelta(minutes=10)}
    Call.objects.filter(pk=call.pk).update(**fields)
    for number, (entry_state, minutes) in enumerate(entries, start=1):
        CompensationEntry.objects.create(
            call=call,
            number=number,
            tool=registry["refund"],
            idempotency_key=f"{call.idempotency_key}.compensation-{number}",
            target="t",
            target_version=0,
            expected_effect="e",
            state=entry_state,
            state_changed_at=now - timedelta(minutes=minutes),
            outcome="refused" if entry_state == "failed" else "",
        )


def _problems(now) -> set[int]:
    """The calls the compensation problems queue lists, read in Python from every entry (the third reading)."""
    cutoff = now - timedelta(seconds=STUCK_S)
    listed = set(
        Call.objects.filter(state__in=["PARTIAL_COMPENSATED", "COMPENSATION_FAILED"]).values_list("pk", flat=True)
    )
    for entry in CompensationEntry.objects.filter(call__state="COMPENSATING"):
        stuck = entry.state in ("pending", "sent", "unknown") and entry.state_changed_at <= cutoff
        if entry.state == "review" or stuck:
            listed.add(entry.call_id)
    return listed


def _reference(filters: QueueFilters, now) -> list[int]:
    """The same filters read through the ORM."""
    calls = Call.objects.filter(state__in=filters.states)
    if filters.compensation:
        calls = calls.filter(pk__in=_problems(now))
    if filters.tool_id:
        calls = calls.filter(tool_id=filters.tool_id)
    if filters.tenant_id:
        calls = calls.filter(tenant_id=filters.tenant_id)
    if filters.risk:
        calls = calls.filter(risk=filters.risk)
    if filters.older_than:
        calls = calls.filter(state_changed_at__lte=now - filters.older_than)
    if filters.q:
        found = Q(task__external_id=filters.q) | Q(idempotency_key=filters.q) | Q(provider_ref=filters.q)
        if len(filters.q) >= 3:  # by part: a task's external id, an idempotency key
            found |= Q(task__external_id__contains=filters.q) | Q(idempotency_key__contains=filters.q)
        if filters.q.isdigit():
            found |= Q(task_id=int(filters.q))
        calls = calls.filter(found)
    order = ("-state_changed_at", "-id") if filters.newest_first else ("state_changed_at", "id")
    return list(calls.order_by(*order).values_list("id", flat=True))


def _walk(filters: QueueFilters, now, size: int) -> list[dict]:
    """Every page from the first, each from the previous page's cursor."""
    rows, after = [], None
    for _ in range(100):
        page = queue_page(replace(filters, after=after), now=now, size=size)
        assert len(page.rows) <= size
        rows += page.rows
        if page.next_cursor is None:
            return rows
        assert len(page.rows) == size
        after = page.next_cursor
    raise AssertionError("the pages never ended")


def _filter_sets(backlog, registry) -> list[QueueFilters]:
    tools = [None, registry["refund"].pk, registry["lookup"].pk]
    tenants = [None, registry["tenant"].pk, backlog["globex"].pk]
    key = Call.objects.order_by("pk")[9].idempotency_key
    searches = ["", "ext-1", str(backlog["tasks"][2].pk), "re_14", key]
    parts = [key[1:], "xt"]  # by part (3 characters or more), and too short a part, which matches only whole
    every = itertools.product(
        [
            (QUEUES["unknown"].states, False),
            (("HUMAN_REVIEW",), False),
            (("COMMITTED",), False),
            (COMPENSATION.states, True),
            (("COMPENSATING",), True),
            (("COMPENSATION_FAILED", "PARTIAL_COMPENSATED"), True),
        ],
        tools,
        tenants,
        ["", "high", "low"],
        [None, timedelta(minutes=60)],
        searches,
        [False, True],
    )
    chosen = random.Random(11).sample(list(every), 180)
    singles = [
        QueueFilters(states=states, compensation=compensation, **{name: value})
        for states, compensation in [(QUEUES["unknown"].states, False), (COMPENSATION.states, True)]
        for name, values in [
            ("tool_id", tools[1:]),
            ("tenant_id", tenants[1:]),
            ("risk", ["high", "low"]),
            ("older_than", [timedelta(minutes=60)]),
            ("q", searches[1:] + parts),
            ("newest_first", [True]),
        ]
        for value in values
    ]
    return singles + [
        QueueFilters(
            states=states, tool_id=tool, tenant_id=tenant, risk=risk, older_than=older, q=q, newest_first=newest,
            compensation=compensation,
        )
        for (states, compensation), tool, tenant, risk, older, q, newest in chosen
    ]  # fmt: skip


def test_every_filter_and_order_reads_what_the_orm_reads_page_by_page(backlog, registry, reader):
    now = backlog["now"]
    nonempty = compensating = 0
    compensation = QueueFilters(states=COMPENSATION.states, compensation=True)
    for filters in [QueueFilters(states=QUEUES["unknown"].states), compensation, *_filter_sets(backlog, registry)]:
        expected = _reference(filters, now)
        got = [row["id"] for row in _walk(filters, now, size=7)]
        assert got == expected, filters
        nonempty += bool(expected)
        compensating += bool(expected) and filters.compensation
    assert nonempty > 60 and compensating > 12, (nonempty, compensating)  # not mostly empty pages (70, 18 of 204)
    assert len(_reference(compensation, now)) == 3 * 7  # the seven kinds of SAGAS that need a person


def test_each_row_carries_the_calls_values_and_names(backlog, reader):
    now = backlog["now"]
    rows = _walk(QueueFilters(states=STATES), now, size=50)
    assert len(rows) == 60
    calls = {call.pk: call for call in Call.objects.select_related("task", "step", "claimed_by")}
    for row in rows:
        call = calls[row["id"]]
        assert row == call_row(call.pk)
        assert row["state"] == call.state and row["risk"] == call.risk
        assert row["state_changed_at"] == call.state_changed_at and row["state_changed_at"].tzinfo is not None
        assert row["last_receipt_at"] == call.last_receipt_at and row["claim_until"] == call.claim_until
        assert row["checks_made"] == call.checks_made and row["last_receipt_status"] == call.last_receipt_status
        assert (row["task_id"], row["tool_id"], row["tenant_id"]) == (call.task_id, call.tool_id, call.tenant_id)
        assert row["task_external_id"] == call.task.external_id and row["step_index"] == call.step.index
        assert row["holder"] == (call.claimed_by.username if call.claimed_by else None)
    assert {row["holder"] for row in rows} == {None, "reviewer", "reviewer2"}
    assert call_row(max(calls) + 1) is None


def test_each_compensation_row_carries_its_latest_entry(backlog, reader):
    now = backlog["now"]
    rows = _walk(QueueFilters(states=COMPENSATION.states, compensation=True), now, size=50)
    assert rows and {row["state"] for row in rows} == set(COMPENSATION.states)
    for row in rows:
        latest = CompensationEntry.objects.filter(call_id=row["id"]).order_by("-number").first()
        assert (row["entry_number"], row["entry_state"], row["entry_outcome"]) == (
            latest.number,
            latest.state,
            latest.outcome,
        )
        assert row == call_row(row["id"], compensation=True)
    assert {row["entry_state"] for row in rows} == {"review", "unknown", "pending", "sent", "committed", "failed"}
    assert "entry_state" not in call_row(rows[0]["id"])  # the other queues' rows are unchanged


def test_a_state_outside_the_state_table_is_refused_not_written_into_the_statement(backlog):
    with pytest.raises(ValueError, match="not call states"):
        queue_page(QueueFilters(states=("UNKNOWN', 'x') OR 1=1 --",)), now=backlog["now"])
    with pytest.raises(ValueError, match="not compensation problem states"):
        queue_page(QueueFilters(states=("UNKNOWN",), compensation=True), now=backlog["now"])


def test_the_counts_and_options_match_the_tables(backlog, registry, reader):
    now = backlog["now"]
    assert queue_counts(now=now) == {
        "unknown": Call.objects.filter(state__in=QUEUES["unknown"].states).count(),
        "human_review": Call.objects.filter(state="HUMAN_REVIEW").count(),
        "compensation_problems": len(_problems(now)),
    }
    assert queue_counts(cap=5, now=now) == {"unknown": 6, "human_review": 6, "compensation_problems": 6}
    tools, tenants = queue_options()
    assert tools == [(registry["lookup"].pk, "order.lookup"), (registry["refund"].pk, "refund.create")]
    assert tenants == [(registry["tenant"].pk, "acme"), (backlog["globex"].pk, "globex")]


def test_the_sql_and_its_orm_twin_give_the_same_rows_and_cursors(backlog, registry, settings):
    now = backlog["now"]
    compensation = QueueFilters(states=COMPENSATION.states, compensation=True)
    for filters in [QueueFilters(states=STATES), compensation, *_filter_sets(backlog, registry)[:60]]:
        settings.RECOVERY_HOT_PATH_SQL = True
        raw = _walk(filters, now, size=7)
        settings.RECOVERY_HOT_PATH_SQL = False
        assert _walk(filters, now, size=7) == raw, filters

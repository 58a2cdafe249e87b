"""Compensations in the operator console (docs/compensation.md, docs/console.md, docs/console.md): the Compensation
problems queue, and the call and task pages showing the forward effect and its undo as one chain.

The calls that matter are made the real way (tests/test_compensations.py's `world`): an order created through the
API against the real sandbox process, then undone by an entry the real worker function sends — refused by the
sandbox's 409 `not_cancellable`, or its reply lost and settled by a status check. Only the statement-count tests
insert plain rows, because they need twenty entries and not their story.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import Call, CompensationAttempt, CompensationEntry, CompensationReceipt, Tool
from recovery.services.compensations import compensation_check, compensation_send, compensation_start
from tests import test_compensations as sagas
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT, page_text, statements

world = sagas.world  # the fixture: the shipped sandbox registry on the sandbox process, and a runtime's client
ACTOR = Actor.system("tests")
QUEUE = "/queues/compensation-problems/"
sandboxed = pytest.mark.django_db(transaction=True)


def _reviewer(people, who: str = "reviewer") -> Client:
    client = Client()
    client.force_login(people[who])
    return client


def refused_cancel(world) -> Call:
    """An order created for real whose cancellation the sandbox refused (409 not_cancellable): COMPENSATION_FAILED."""
    call, _ = sagas._committed_order(world)
    entry = compensation_start(call, actor=ACTOR, send=False)
    world["sandbox"].fault(
        route=f"/orders/{call.provider_ref}/cancel", kind="error", status=409, code="not_cancellable"
    )
    compensation_send(entry.pk, worker="w1")
    call = Call.objects.select_related("task", "tool").get(pk=call.pk)
    assert call.state == "COMPENSATION_FAILED"
    return call


def lost_cancel(world) -> tuple[Call, CompensationEntry]:
    """An order created for real whose cancellation committed but whose reply was lost: the entry is unknown and
    the call COMPENSATING."""
    call, _ = sagas._committed_order(world)
    entry = compensation_start(call, actor=ACTOR, send=False)
    world["sandbox"].fault(route=f"/orders/{call.provider_ref}/cancel", kind="commit_then_drop", times=1)
    compensation_send(entry.pk, worker="w1")
    entry.refresh_from_db()
    assert entry.state == "unknown"
    return Call.objects.select_related("task", "tool").get(pk=call.pk), entry


def cancelled(world) -> Call:
    """An order created, then cancelled (the reply lost, the cancellation confirmed by a receipt): COMPENSATED."""
    call, entry = lost_cancel(world)
    compensation_check(entry.pk, worker="w1", force=True)
    call.refresh_from_db()
    assert call.state == "COMPENSATED"
    return call


def _listed(html: str) -> set[int]:
    return {int(pk) for pk in re.findall(r'<tr id="call-\d+" data-id="(\d+)"', html)}


def _count(html: str) -> str:
    return re.search(r'data-queue="compensation-problems">([^<]*)<', html).group(1)


def _section(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return html[start : html.find("</section>", start)]


# --- the queue --------------------------------------------------------------------------------------------------


@sandboxed
def test_it_lists_a_refused_compensation_and_not_a_compensated_call(world, console_people):
    failed = refused_cancel(world)
    done = cancelled(world)

    html = _reviewer(console_people).get(QUEUE).content.decode()

    assert _listed(html) == {failed.pk}
    row = page_text(re.search(rf'<tr id="call-{failed.pk}".*?</tr>', html, re.S).group(0))
    for cell in (failed.task.external_id, "order.create", "demo", "low", "COMPENSATION_FAILED"):
        assert cell in row, cell
    assert "compensation 1: failed (refused)" in row
    assert f'href="/calls/{failed.pk}/"' in html and f"/calls/{done.pk}/" not in html
    assert _count(html) == "1"
    assert "Compensation problems" in page_text(html)


@sandboxed
def test_a_stuck_unknown_entry_is_listed_once_it_has_waited_past_the_threshold(world, console_people, settings):
    call, entry = lost_cancel(world)
    client = _reviewer(console_people)
    assert _listed(client.get(QUEUE).content.decode()) == set()  # being reconciled: no person needed yet

    waited = timezone.now() - timedelta(seconds=settings.RECOVERY_COMPENSATION_STUCK_S + 1)
    CompensationEntry.objects.filter(pk=entry.pk).update(state_changed_at=waited)  # as if the checks kept failing

    html = client.get(QUEUE).content.decode()
    assert _listed(html) == {call.pk} and _count(html) == "1"
    assert "compensation 1: unknown" in page_text(html)
    assert "COMPENSATING" in page_text(html)

    compensation_check(entry.pk, worker="w1", force=True)  # the provider confirms the cancellation
    html = client.get(QUEUE).content.decode()
    assert _listed(html) == set() and _count(html) == "0"


@sandboxed
def test_its_filters_search_and_claims_work_as_in_the_other_queues(world, console_people):
    call = refused_cancel(world)
    client = _reviewer(console_people)
    order_create = call.tool_id
    cases = [
        ({"state": "COMPENSATION_FAILED"}, True),
        ({"state": "COMPENSATING"}, False),
        ({"state": "PARTIAL_COMPENSATED"}, False),
        ({"tool": order_create}, True),
        ({"tool": CompensationEntry.objects.get(call=call).tool_id}, False),  # order.cancel: not the call's tool
        ({"tenant": call.tenant_id}, True),
        ({"risk": "low"}, True),
        ({"risk": "high"}, False),
        ({"age": "5m"}, False),
        ({"sort": "newest"}, True),
        ({"q": call.task.external_id}, True),
        ({"q": call.idempotency_key}, True),
        ({"q": call.provider_ref}, True),
        ({"q": "nothing-like-it"}, False),
    ]
    for query, shown in cases:
        response = client.get(QUEUE, query)
        assert response.status_code == 200, query
        assert (call.pk in _listed(response.content.decode())) == shown, query
    assert client.get(QUEUE, {"state": "UNKNOWN"}).status_code == 400  # not one of this queue's states

    # The live refresh keeps the filters and draws the rows only.
    rows = client.get(QUEUE, {"risk": "low"}, HTTP_HX_REQUEST="true").content.decode()
    assert rows.lstrip().startswith('<tbody id="rows"') and f'hx-get="{QUEUE}?risk=low"' in rows

    # A claim is the same lease on the call; the row drawn again keeps its entry.
    page = client.get(QUEUE).content.decode()
    claim = f"/calls/{call.pk}/claim/?queue=compensation-problems"
    assert f'hx-post="{claim}"' in page
    taken = client.post(claim, HTTP_HX_REQUEST="true")
    assert taken.status_code == 200
    assert "compensation 1: failed (refused)" in page_text(taken.content.decode())
    assert f"/calls/{call.pk}/release/?queue=compensation-problems" in taken.content.decode()
    assert Call.objects.get(pk=call.pk).claimed_by == console_people["reviewer"]

    colleague = _reviewer(console_people, "reviewer2")
    refused = colleague.post(claim, HTTP_HX_REQUEST="true")
    assert refused.status_code == 409 and "claimed by reviewer" in refused.content.decode()
    seen = colleague.get(QUEUE).content.decode()
    assert 'class="holder">reviewer<' in seen and f'hx-post="{claim}"' not in seen


# --- the call page: one chain -------------------------------------------------------------------------------------


@sandboxed
def test_the_call_page_shows_a_refused_compensation_after_the_forward_effect(world, console_people):
    call = refused_cancel(world)
    entry = CompensationEntry.objects.get(call=call)

    html = _reviewer(console_people).get(f"/calls/{call.pk}/").content.decode()
    text = page_text(html)

    assert "The effect: created, not cancelled: the undo failed" in text
    assert "never created" not in text
    chain = page_text(_section(html, "compensations-h"))
    for fact in (
        "compensation 1 order.cancel failed (refused)",
        entry.idempotency_key,
        f"comp-{call.pk}-1",
        entry.expected_effect,
        f"the call at version {entry.target_version}",
    ):
        assert fact in chain, fact
    attempt = page_text(re.search(r'<tr id="compensation-1-attempt-1">.*?</tr>', html, re.S).group(0))
    assert f"POST {world['sandbox'].url}/orders/{call.provider_ref}/cancel" in attempt
    for fact in ("409", "not_cancellable", "refusal", "refused", "failed"):
        assert fact in attempt, fact
    assert sagas.API_KEY not in html  # the request's Authorization header is shown masked
    result = page_text(re.search(r'<li class="chain-result".*?</li>', html, re.S).group(0))
    assert "the call is COMPENSATION_FAILED" in result and "the effect still stands" in result


@sandboxed
def test_the_call_page_reads_created_then_cancelled_with_the_receipt_that_proved_it(world, console_people):
    call = cancelled(world)
    entry = CompensationEntry.objects.get(call=call)
    receipt = CompensationReceipt.objects.get(entry=entry)

    html = _reviewer(console_people).get(f"/calls/{call.pk}/").content.decode()

    assert "The effect: created, then cancelled" in page_text(html)
    assert "never created" not in page_text(html)
    row = page_text(re.search(rf'<tr id="compensation-receipt-{receipt.pk}">.*?</tr>', html, re.S).group(0))
    assert "poll" in row and "committed" in row and "unknown → committed" in row and "cancelled" in row
    attempt = page_text(re.search(r'<tr id="compensation-1-attempt-1">.*?</tr>', html, re.S).group(0))
    assert "unknown" in attempt  # the reply was lost: sent, then nobody knew
    # One timeline: the forward effect, then the compensation made, sent, checked, then the result.
    timeline = page_text(_section(html, "timeline-h"))
    steps = [
        "attempt 1 admitted",
        "call.transition SENT → COMMITTED",
        f"compensation 1 made: order.cancel, its own key {entry.idempotency_key}",
        "call.transition COMMITTED → COMPENSATING",
        "compensation 1 attempt 1 sent",
        "compensation 1 attempt 1 answered",
        "compensation 1 poll receipt: committed",
        "call.transition COMPENSATING → COMPENSATED",
        "result: COMPENSATED, created, then cancelled",
    ]
    positions = [timeline.index(step) for step in steps]
    assert positions == sorted(positions), list(zip(steps, positions, strict=True))
    times = re.findall(r'<time datetime="([^"]+)">', _section(html, "timeline-h"))
    assert times == sorted(times)


@sandboxed
def test_the_task_page_shows_the_compensated_call_in_its_group_with_its_chain(world, console_people):
    call = cancelled(world)
    entry = CompensationEntry.objects.get(call=call)

    html = _reviewer(console_people).get(f"/tasks/{call.task_id}/").content.decode()

    group = page_text(_section(html, "fact-compensated-h"))
    assert f"call {call.pk} order.create COMPENSATED" in group
    assert "— created, then cancelled" in group
    assert f"compensation 1 order.cancel committed key {entry.idempotency_key}" in group
    assert "never created" not in page_text(html)


# --- cost: a fixed number of statements -----------------------------------------------------------------------


def _entries(call: Call, n: int) -> None:
    """`n` final entries of `call` (the last committed) by a `refund.reverse` tool, each with two attempts and two
    receipts: plain rows."""
    now = timezone.now()
    tool, _ = Tool.objects.get_or_create(
        name="refund.reverse", defaults={"provider": call.tool.provider, "side_effect": "write"}
    )
    for number in range(1, n + 1):
        entry = CompensationEntry.objects.create(
            call=call,
            number=number,
            tool=tool,
            idempotency_key=f"{call.idempotency_key}.compensation-{number}",
            target=f"refund.create {HOSTILE_SCRIPT}",
            target_version=call.version,
            expected_effect=f"undo {HOSTILE_IMG}",
            state="committed" if number == n else "failed",
            outcome="" if number == n else "refused",
            attempts_count=2,
        )
        CompensationAttempt.objects.bulk_create(
            CompensationAttempt(
                entry=entry, number=k, request={"method": "POST", "url": "http://x/undo", "headers": {}},
                http_status=200 if number == n else 409, row="1" if number == n else "refusal",
                state_after=entry.state, finished_at=now,
            )
            for k in (1, 2)
        )  # fmt: skip
        CompensationReceipt.objects.bulk_create(
            CompensationReceipt(
                entry=entry, source="poll", observed="pending", provider_status=HOSTILE_IMG,
                state_before="unknown", state_after="unknown",
            )
            for _ in (1, 2)
        )  # fmt: skip


def test_the_call_page_runs_the_same_statements_with_0_or_20_entries(people, make_call):
    plain = make_call("COMMITTED")
    undone = make_call("COMPENSATED")
    _entries(undone, 20)
    client = _reviewer(people)
    client.get(f"/calls/{plain.pk}/")  # warm the session and permission caches alike for both

    none, none_page = statements(client, f"/calls/{plain.pk}/")
    twenty, twenty_page = statements(client, f"/calls/{undone.pk}/")

    assert none == twenty, (none, twenty)
    html = twenty_page.content.decode()
    assert html.count('<li class="chain-entry"') == 20 and html.count('id="compensation-receipt-') == 40
    assert len(re.findall(r'<tr id="compensation-\d+-attempt-\d+">', html)) == 40
    assert "No compensation" in none_page.content.decode()
    assert "The effect: created, then reversed" in page_text(html)
    assert HOSTILE_SCRIPT not in html and HOSTILE_IMG not in html  # the provider's words, escaped


def test_the_task_page_runs_the_same_statements_with_0_or_20_entries(people, make_call, task):
    plain = make_call("COMMITTED")
    other = type(task).objects.create(tenant=task.tenant, external_id="saga-20", agent="demo", goal="g")
    undone = make_call("COMPENSATED", on_task=other)
    _entries(undone, 20)
    client = _reviewer(people)
    client.get(f"/tasks/{plain.task_id}/")

    none, _ = statements(client, f"/tasks/{plain.task_id}/")
    twenty, twenty_page = statements(client, f"/tasks/{other.pk}/")

    assert none == twenty, (none, twenty)
    group = page_text(_section(twenty_page.content.decode(), "fact-compensated-h"))
    assert group.count("compensation ") == 20 and "— created, then reversed" in group

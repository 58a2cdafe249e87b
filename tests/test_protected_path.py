"""The protected call's short path (API 1.2, docs/api.md#reporting-off-the-clock): registration that admits the first
attempt in the same request, and reports off the caller's clock only on the terms the admission handed over.

Against the API served by `live_server`, a real sandbox provider process and background jobs (the drill stage), the
recovered tool driven as a framework would call it; the console's records and the sandbox's ledger are the evidence.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
import requests
from recovery_client import facts_from_response, recovered

from recovery.devtools.drills.stage import drill_stage
from recovery.models import Attempt, Call, Tool
from recovery.services.report_terms import report_terms

pytestmark = pytest.mark.django_db(transaction=True)
REFUND = "refund.create"


@pytest.fixture
def stage(live_server):
    with drill_stage(api_url=live_server.url) as stage:
        yield stage


class CountingClient:
    """Counts the console round trips of a client (its own requests' session hooks: nothing replaced)."""

    def __init__(self, client) -> None:
        self.count = 0
        self.lock = threading.Lock()
        client.session.hooks["response"].append(self.seen)

    def seen(self, response, *args, **kwargs):
        with self.lock:
            self.count += 1


def refund_tool(stage):
    url, api_key = stage.sandbox.url, stage.sandbox.api_key

    def refund(order_id: str, amount_cents: int) -> dict:
        """Refund part or all of an order's payment."""
        reply = recovered.http().post(
            f"{url}/refunds",
            json={"order_id": order_id, "amount_cents": amount_cents},
            headers={"Authorization": f"Bearer {api_key}"},
        )
        reply.raise_for_status()
        return reply.json()

    return recovered.tool(stage.tool(REFUND), key="refund-{order_id}")(refund)


@contextmanager
def open_task(stage, name: str, **options):
    client = stage.client()
    try:
        with recovered.task(client, tenant=stage.tenant, external_id=stage.key(name), goal=name, **options) as opened:
            yield opened, client
    finally:
        client.session.close()


def test_registration_admits_the_first_attempt_and_a_resent_registration_finds_the_same_admission(stage):
    client = stage.client()
    task = client.create_task(stage.tenant, stage.key("one-trip"), agent="tests", goal="one round trip")
    arguments = {"order_id": "O-4401", "amount_cents": 100}
    key = stage.key("refund-one-trip")

    ref = client.add_call(
        task.id, step=1, tool=stage.tool(REFUND), arguments=arguments, idempotency_key=key, admit="a1"
    )
    again = client.add_call(
        task.id, step=1, tool=stage.tool(REFUND), arguments=arguments, idempotency_key=key, admit="a1"
    )
    other = client.add_call(
        task.id, step=1, tool=stage.tool(REFUND), arguments=arguments, idempotency_key=key, admit="a2"
    )

    assert (ref.created, ref.state, ref.admission.attempt_number, ref.not_admitted) == (True, "SENT", 1, None)
    assert ref.admission.report["may_defer"] is True
    assert ref.admission.report["required_result_fields"] == ["refund_id", "status"]
    assert (again.created, again.call_id, again.admission.raw) == (False, ref.call_id, ref.admission.raw)
    # Found again past READY, under another attempt id: nothing admitted, nothing stored.
    assert (other.call_id, other.state, other.admission, other.not_admitted) == (ref.call_id, "SENT", None, None)
    assert list(Attempt.objects.filter(call_id=ref.call_id).values_list("attempt_id", flat=True)) == ["a1"]
    assert Call.objects.get(pk=ref.call_id).state == "SENT"
    client.session.close()


def test_a_deferred_report_answers_the_caller_in_one_round_trip_and_lands_before_the_task_ends(stage):
    refund = refund_tool(stage)
    with open_task(stage, "deferred", defer_reports=True) as (opened, client):
        opened.side_effect(stage.tool(REFUND))  # the tenant's capabilities, read once per task: not counted
        trips = CountingClient(client)
        answer = refund(order_id="O-4402", amount_cents=250)
        before_report = trips.count
    call = Call.objects.get(task_id=opened.id)

    assert (answer["status"], answer["result"]["amount_cents"]) == ("committed", 250)
    assert before_report in (1, 2)  # the registration with its admission; the report may have left meanwhile
    assert trips.count == 2  # and the report, from the background, before the task's block ended
    assert call.state == "COMMITTED"
    assert Attempt.objects.get(call=call).reported_at is not None
    assert stage.sandbox.ledger(call.idempotency_key)["effects"] == 1


def test_a_reply_that_fails_the_handed_checks_is_reported_before_the_caller_is_answered(stage):
    refund = refund_tool(stage)
    stage.sandbox.fault(route="/refunds", kind="bad_result", drop=["refund_id"], times=1)
    stage.sandbox.fault(route="/refunds", kind="delayed_callbacks", ms=600_000, times=1)  # no settling callback
    with open_task(stage, "checks-fail", defer_reports=True) as (opened, _client):
        answer = refund(order_id="O-4403", amount_cents=250)
        call = Call.objects.get(task_id=opened.id)
        reported = Attempt.objects.get(call=call).reported_at  # read while the task is still open

    assert reported is not None  # reported synchronously: no reference to rest an early answer on
    assert answer["status"] != "committed"
    assert call.state != "COMMITTED"


def test_a_verdict_that_disagrees_with_an_early_answer_comes_back_with_the_tasks_next_answer(stage):
    refund = refund_tool(stage)
    # A 2xx whose body says another amount than asked: it has the reference and the required fields.
    stage.sandbox.fault(route="/refunds", kind="bad_result", set={"amount_cents": 1}, times=1)
    # Its signed callback held back: it would settle the call COMMITTED if it came before the report.
    stage.sandbox.fault(route="/refunds", kind="delayed_callbacks", ms=600_000, times=1)
    with open_task(stage, "disagrees", defer_reports=True) as (opened, _):
        first = refund(order_id="O-4404", amount_cents=250)
        second = refund(order_id="O-4405", amount_cents=250)
    disputed = Call.objects.get(task_id=opened.id, arguments__order_id="O-4404")
    verdict = Attempt.objects.get(call=disputed).outcome_response["call_state"]  # what the report was answered

    assert first["status"] == "committed"  # the early answer: the reply passed the checks the admission handed over
    assert verdict != "COMMITTED"  # the console's verdict: the amount in the result is not the one asked for
    assert second["status"] == "committed"
    assert [(e["call_id"], e["call_state"]) for e in second["earlier"]] == [(disputed.pk, verdict)]
    following = Attempt.objects.get(call__task_id=opened.id, call__arguments__order_id="O-4405")
    assert Attempt.objects.get(call=disputed).reported_at < following.admitted_at  # reported before it was admitted
    assert "earlier" not in first


def test_the_tasks_next_admission_carries_the_decision_card_of_a_deferrable_report_the_console_did_not_commit(stage):
    client = stage.client()
    task = client.create_task(stage.tenant, stage.key("card-next"), agent="tests", goal="a verdict handed back")
    # A 2xx whose body says another amount than asked (reference and required fields present: deferrable), its
    # settling callback held back; then a plain good one.
    stage.sandbox.fault(route="/refunds", kind="bad_result", set={"amount_cents": 1}, times=1)
    stage.sandbox.fault(route="/refunds", kind="delayed_callbacks", ms=600_000, times=1)

    def call(step: int, order_id: str):
        key = stage.key(f"refund-{order_id}")
        arguments = {"order_id": order_id, "amount_cents": 250}
        return (
            client.add_call(
                task.id, step=step, tool=stage.tool(REFUND), arguments=arguments, idempotency_key=key, admit="a1"
            ),
            key,
            arguments,
        )

    def send_and_report(ref, key, arguments):
        reply = requests.post(
            f"{stage.sandbox.url}/refunds",
            json=arguments,
            timeout=10,
            headers={"Authorization": f"Bearer {stage.sandbox.api_key}", "Idempotency-Key": key},
        )
        wire = ref.admission.raw["wire"]
        return client.report(
            ref.call_id, "a1", facts_from_response(reply, provider_ref_header=wire["request_id_header"])
        )

    disputed = call(1, "O-4406")
    verdict = send_and_report(*disputed)
    good = call(2, "O-4407")
    committed = send_and_report(*good)
    after = call(3, "O-4408")[0]
    client.session.close()

    assert disputed[0].admission.raw["report"]["may_defer"] is True and disputed[0].admission.earlier == []
    assert verdict.call_state != "COMMITTED" and verdict.decision is not None
    earlier = good[0].admission.earlier  # the next admission of the task, whichever call it is for
    assert earlier == [
        {
            "call_id": disputed[0].call_id,
            "attempt_id": "a1",
            "call_state": verdict.call_state,
            "decision": verdict.raw["decision"],
        }
    ]
    assert committed.call_state == "COMMITTED"
    assert after.admission.earlier == []  # handed back once; a committed report is no disagreement
    stored = Attempt.objects.get(call_id=good[0].call_id).response["earlier"]
    assert stored == earlier  # a resent registration answers the same stored admission


def test_the_report_may_wait_for_neither_a_half_open_probe_nor_a_tool_whose_unknown_budget_is_zero(stage):
    tool = Tool.objects.get(name=stage.tool(REFUND))
    assert report_terms(tool, probe=False)["may_defer"] is True
    assert report_terms(tool, probe=True)["may_defer"] is False
    tool.budgets = {**(tool.budgets or {}), "unknown_budget": 0}
    assert report_terms(tool, probe=False)["may_defer"] is False
    tool.outcome_timeout_s = 6
    assert report_terms(tool, probe=False)["within_s"] == 2.0  # min(5 s, outcome_timeout_s / 3)
    tool.outcome_timeout_s = 60
    assert report_terms(tool, probe=False)["within_s"] == 5.0


def test_with_a_console_before_api_1_2_the_client_registers_then_admits_as_before(stage, settings):
    settings.RECOVERY_API_VERSION = "1.1"  # the console answers as a 1.1 one: `admit` is not sent to it
    refund = refund_tool(stage)
    with open_task(stage, "older-console") as (opened, client):
        opened.side_effect(stage.tool(REFUND))
        sent: list[str] = []
        client.session.hooks["response"].append(lambda response, *a, **k: sent.append(response.request.path_url))
        answer = refund(order_id="O-4406", amount_cents=250)

    call = Call.objects.get(task_id=opened.id)
    assert answer["status"] == "committed" and call.state == "COMMITTED"
    assert [path.rsplit("/", 1)[-1] for path in sent] == ["calls", "attempts", "outcome"]

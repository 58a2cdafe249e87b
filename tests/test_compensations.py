"""Compensation ledgers end to end (docs/compensation.md): a runtime creates an order through the real API and the real
sandbox process, the order is undone by an entry with its own key, attempts and receipts, and what the sandbox really
holds is the judge (its ledger and request log) — never a count of our own rows alone."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
import requests
from django.db import IntegrityError, connection, connections, transaction
from django.test import Client as DjangoClient
from django.utils import timezone
from recovery_client import NotAdmitted, RecoveryClient, facts_from_exception, facts_from_response
from rq.worker import SimpleWorker

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor
from recovery.engine.compensation_states import ALLOWED_PAIRS, EDGES, EntryState
from recovery.jobs import queueing
from recovery.jobs import tasks as jobs
from recovery.models import AuditEvent, Call, CompensationEntry, CompensationReceipt, Receipt
from recovery.registry import load_registry
from recovery.services.callbacks import sign
from recovery.services.compensation_plans import derive_key
from recovery.services.compensations import (
    compensation_check,
    compensation_send,
    compensation_start,
    compensations_run_due,
)
from recovery.services.errors import Refusal
from recovery.services.tokens import token_create
from recovery.statemachine.transitions import IllegalTransition, TransitionConflict, transition_entry
from tests.sandbox import sandbox_registry

pytestmark = pytest.mark.django_db(transaction=True)

API_KEY, CALLBACK_SECRET = "sandbox-test-key", "sandbox-test-secret"
ORDER = {"customer_id": "C-1042", "items": [{"sku": "SKU-1", "quantity": 2}]}
E = EntryState
ACTOR = Actor.system("tests")
_n = iter(range(1, 100_000))


@pytest.fixture
def world(sandbox, live_server, monkeypatch):
    """The shipped sandbox registry pointed at the sandbox process, with checks due at once."""
    monkeypatch.setenv("SANDBOX_API_KEY", API_KEY)
    monkeypatch.setenv("SANDBOX_CALLBACK_SECRET", CALLBACK_SECRET)
    load_registry(sandbox_registry(sandbox.url, max_checks=4), actor=ACTOR)
    _, token = token_create(name="runtime", tenants=["demo"], actor=ACTOR)
    return {"client": RecoveryClient(live_server.url, token), "sandbox": sandbox}


def _committed_order(world) -> tuple[Call, int]:
    """An order the runtime created for real (admit, POST /orders to the sandbox, report): COMMITTED."""
    client, sandbox = world["client"], world["sandbox"]
    task = client.create_task("demo", f"saga-{next(_n)}", agent="tests", goal="order, then undo it")
    key = f"order-{next(_n)}"
    ref = client.add_call(task.id, step=1, tool="order.create", arguments=ORDER, idempotency_key=key)
    admitted = client.admit(ref.call_id, "a1")
    try:
        reply = requests.post(f"{sandbox.url}/orders", json=ORDER, headers=sandbox.headers(key), timeout=(2, 3))
        facts = facts_from_response(reply)
    except requests.RequestException as exc:
        facts = facts_from_exception(exc)
    assert client.report(ref.call_id, admitted.attempt_id, facts).call_state == "COMMITTED"
    return Call.objects.select_related("tool", "task").get(pk=ref.call_id), task.id


def _cancel_posts(sandbox, entry: CompensationEntry) -> list[dict]:
    return [r for r in sandbox.requests(key=entry.idempotency_key) if r["method"] == "POST"]


def _state(model, pk) -> str:
    return model.objects.get(pk=pk).state


def test_a_committed_order_is_cancelled_by_its_own_entry_and_the_call_ends_compensated(world):
    sandbox = world["sandbox"]
    call, _ = _committed_order(world)

    entry = compensation_start(call, actor=ACTOR, send=False)

    assert (entry.number, entry.state, entry.tool.name) == (1, "pending", "order.cancel")
    assert entry.idempotency_key == derive_key(call.idempotency_key, 1) != call.idempotency_key
    assert entry.arguments == {"order_id": call.provider_ref, "reason": "compensation"}
    assert (
        entry.target_version == call.version and "one cancellation expected" in entry.expected_effect
    )  # as read before
    assert _state(Call, call.pk) == "COMPENSATING"

    compensation_send(entry.pk, worker="w1")

    entry.refresh_from_db()
    assert (entry.state, entry.attempts_count, entry.provider_ref[:3]) == ("committed", 1, "ca_")
    assert _state(Call, call.pk) == "COMPENSATED"
    order = sandbox.ledger(call.idempotency_key)
    cancellation = sandbox.ledger(entry.idempotency_key)
    assert order["effects"] == 1 and cancellation["effects"] == 1
    (sent,) = _cancel_posts(sandbox, entry)
    assert sent["path"] == f"/orders/{call.provider_ref}/cancel"
    story = list(AuditEvent.objects.filter(call=call).values_list("action", "from_state", "to_state"))
    assert story[-5:] == [
        (AuditAction.COMPENSATION_STARTED, "", ""),
        (AuditAction.CALL_TRANSITION, "COMMITTED", "COMPENSATING"),
        (AuditAction.COMPENSATION_TRANSITION, "pending", "sent"),
        (AuditAction.COMPENSATION_TRANSITION, "sent", "committed"),
        (AuditAction.CALL_TRANSITION, "COMPENSATING", "COMPENSATED"),
    ]


def test_a_cancellation_whose_reply_is_lost_is_settled_by_a_receipt_without_a_second_cancel(world):
    sandbox = world["sandbox"]
    call, _ = _committed_order(world)
    entry = compensation_start(call, actor=ACTOR, send=False)
    sandbox.fault(route=f"/orders/{call.provider_ref}/cancel", kind="commit_then_drop", times=1)

    compensation_send(entry.pk, worker="w1")
    entry.refresh_from_db()
    assert entry.state == "unknown" and _state(Call, call.pk) == "COMPENSATING"

    compensation_check(entry.pk, worker="w1")

    entry.refresh_from_db()
    (receipt,) = CompensationReceipt.objects.filter(entry=entry)
    assert (receipt.observed, receipt.state_before, receipt.state_after, receipt.applied) == (
        "committed",
        "unknown",
        "committed",
        True,
    )
    assert entry.state == "committed" and _state(Call, call.pk) == "COMPENSATED"
    assert len(_cancel_posts(sandbox, entry)) == 1  # the undo was never sent twice
    assert sandbox.ledger(entry.idempotency_key)["effects"] == 1


def _signed_callback(entry: CompensationEntry, status: str):
    body = json.dumps({"event_id": f"evt-{entry.pk}-{status}", "idempotency_key": entry.idempotency_key,
                       "status": status}).encode()  # fmt: skip
    return DjangoClient().post(
        "/api/v1/providers/sandbox/callbacks",
        body,
        content_type="application/json",
        headers={"Recovery-Signature": sign(CALLBACK_SECRET, body)},
    )


def test_a_providers_callback_about_an_undo_brings_its_check_forward_and_stores_nothing_of_its_own(world):
    """The sandbox tells of a cancellation as of any write: the callback names the entry's own key. It is not a 404
    (nothing of the call's matches it), nor taken at its word: the entry's status check, due at once, settles it."""
    sandbox = world["sandbox"]
    call, _ = _committed_order(world)
    entry = compensation_start(call, actor=ACTOR, send=False)
    sandbox.fault(route=f"/orders/{call.provider_ref}/cancel", kind="commit_then_drop", times=1)
    compensation_send(entry.pk, worker="w1")
    later = timezone.now() + timedelta(hours=1)
    CompensationEntry.objects.filter(pk=entry.pk).update(next_check_at=later)
    receipts = Receipt.objects.count()

    reply = _signed_callback(entry, "cancelled")

    assert reply.status_code == 202, reply.content
    assert reply.json() == {"compensation_entry_id": entry.pk, "call_id": call.pk, "entry_state": "unknown",
                            "check_brought_forward": True}  # fmt: skip
    entry.refresh_from_db()
    assert entry.next_check_at <= timezone.now()
    assert not CompensationReceipt.objects.filter(entry=entry).exists() and Receipt.objects.count() == receipts
    compensations_run_due(worker="w1")
    entry.refresh_from_db()
    assert entry.state == "committed" and _state(Call, call.pk) == "COMPENSATED"
    assert len(_cancel_posts(sandbox, entry)) == 1
    again = _signed_callback(entry, "cancelled")  # about a settled entry: acknowledged, nothing to bring forward
    assert again.status_code == 202 and again.json()["check_brought_forward"] is False
    assert _signed_callback(entry, "bogus").status_code == 400  # its tool's status_map still decides


def test_a_refused_cancellation_fails_the_entry_is_never_retried_and_nothing_is_undone(world):
    sandbox = world["sandbox"]
    call, _ = _committed_order(world)
    entry = compensation_start(call, actor=ACTOR, send=False)
    route = f"/orders/{call.provider_ref}/cancel"
    sandbox.fault(route=route, kind="error", status=409, code="not_cancellable")

    compensation_send(entry.pk, worker="w1")

    entry.refresh_from_db()
    assert (entry.state, entry.outcome) == ("failed", "refused")
    assert entry.attempts.get().row == "refusal"
    assert _state(Call, call.pk) == "COMPENSATION_FAILED"
    assert compensations_run_due(worker="w1") == 0  # never sent again, never checked
    assert len(_cancel_posts(sandbox, entry)) == 1
    assert sandbox.ledger(entry.idempotency_key)["effects"] == 0
    assert sandbox.ledger(call.idempotency_key)["effects"] == 1  # the order stands


def test_a_cancellation_lost_before_commit_is_sent_again_with_its_own_key(world):
    sandbox = world["sandbox"]
    call, _ = _committed_order(world)
    entry = compensation_start(call, actor=ACTOR, send=False)
    sandbox.fault(route=f"/orders/{call.provider_ref}/cancel", kind="drop_before_commit", times=1)

    compensation_send(entry.pk, worker="w1")
    entry.refresh_from_db()
    assert entry.state == "unknown"
    compensation_check(entry.pk, worker="w1")
    entry.refresh_from_db()
    assert entry.state == "not_committed"
    CompensationEntry.objects.filter(pk=entry.pk).update(send_at=None)  # the retry is due now

    assert compensations_run_due(worker="w1") == 1

    entry.refresh_from_db()
    assert (entry.state, entry.attempts_count) == ("committed", 2)
    keys = {r["key"] for r in _cancel_posts(sandbox, entry)}
    assert keys == {entry.idempotency_key} and len(_cancel_posts(sandbox, entry)) == 2
    assert sandbox.ledger(entry.idempotency_key)["effects"] == 1
    assert _state(Call, call.pk) == "COMPENSATED"


def test_a_pending_cancellation_stays_unknown_until_the_provider_confirms_it(world):
    sandbox = world["sandbox"]
    call, _ = _committed_order(world)
    entry = compensation_start(call, actor=ACTOR, send=False)
    sandbox.fault(route=f"/orders/{call.provider_ref}/cancel", kind="pending", checks=2, times=1)

    compensation_send(entry.pk, worker="w1")
    entry.refresh_from_db()
    assert entry.state == "unknown"  # 202: accepted, being checked
    seen = []
    for _ in range(3):
        receipt = compensation_check(entry.pk, worker="w1", force=True)
        seen.append(receipt.observed)
    entry.refresh_from_db()
    assert seen == ["pending", "pending", "committed"] and entry.checks_made == 3
    assert entry.state == "committed" and _state(Call, call.pk) == "COMPENSATED"


def test_while_an_entry_is_open_the_tasks_other_writes_are_refused(world):
    client = world["client"]
    call, task_id = _committed_order(world)
    other = client.add_call(
        task_id,
        step=2,
        tool="refund.create",
        arguments={"order_id": "O-77", "amount_cents": 900},
        idempotency_key="r-1",
    )
    compensation_start(call, actor=ACTOR, send=False)

    with pytest.raises(NotAdmitted) as denied:
        client.admit(other.call_id, "b1")

    assert denied.value.gate["reason"] == "compensation_in_progress"
    assert denied.value.required_next["action"] == "wait_for_reconcile"
    assert _state(Call, other.call_id) == "READY"


def test_a_template_needing_a_result_the_call_lacks_is_a_field_error_and_no_entry(world, monkeypatch):
    call, _ = _committed_order(world)
    tool = call.tool
    tool.compensation = {"tool": "order.cancel", "args": {"order_id": "{result.cancel_token}"}}
    tool.save(update_fields=["compensation"])

    with pytest.raises(Refusal) as refused:
        compensation_start(call, actor=ACTOR, send=False)

    assert refused.value.code == "compensation_unavailable"
    assert [e.field for e in refused.value.field_errors] == ["order_id"]
    assert not CompensationEntry.objects.filter(call=call).exists() and _state(Call, call.pk) == "COMMITTED"


def test_a_call_that_is_not_committed_cannot_start_a_compensation(world):
    call, _ = _committed_order(world)
    entry = compensation_start(call, actor=ACTOR, send=False)

    with pytest.raises(Refusal) as refused:
        compensation_start(call, actor=ACTOR, send=False)  # COMPENSATING now

    assert refused.value.code == "not_compensable"
    assert list(CompensationEntry.objects.filter(call=call)) == [entry]


def test_a_new_entry_after_a_failed_one_gets_the_next_number_and_its_own_key(world):
    sandbox = world["sandbox"]
    call, _ = _committed_order(world)
    first = compensation_start(call, actor=ACTOR, send=False)
    sandbox.fault(
        route=f"/orders/{call.provider_ref}/cancel", kind="error", status=409, code="not_cancellable", times=1
    )
    compensation_send(first.pk, worker="w1")
    assert _state(Call, call.pk) == "COMPENSATION_FAILED"

    second = compensation_start(call, actor=ACTOR, send=False)
    compensation_send(second.pk, worker="w1")

    second.refresh_from_db()
    assert second.number == 2 and second.idempotency_key == derive_key(call.idempotency_key, 2)
    assert second.state == "committed" and _state(Call, call.pk) == "COMPENSATED"


def test_a_real_rq_worker_sends_the_entry_and_the_periodic_job_settles_it(world, rq_queue):
    sandbox = world["sandbox"]
    call, _ = _committed_order(world)
    sandbox.fault(route=f"/orders/{call.provider_ref}/cancel", kind="commit_then_drop", times=1)

    entry = compensation_start(call, actor=ACTOR)  # enqueues its send on commit
    assert rq_queue.count == 1
    SimpleWorker([rq_queue], connection=rq_queue.connection).work(burst=True)
    assert _state(CompensationEntry, entry.pk) == "unknown"

    assert queueing.enqueue_now(jobs.reconcile_due, job_id="reconcile-due")
    SimpleWorker([rq_queue], connection=rq_queue.connection).work(burst=True)

    assert _state(CompensationEntry, entry.pk) == "committed" and _state(Call, call.pk) == "COMPENSATED"
    assert len(_cancel_posts(sandbox, entry)) == 1


@pytest.mark.postgres
def test_two_starts_at_once_make_one_entry(world):
    call, _ = _committed_order(world)
    barrier, results = threading.Barrier(2), []

    def start() -> None:
        try:
            barrier.wait()
            results.append(compensation_start(Call.objects.get(pk=call.pk), actor=ACTOR, send=False).pk)
        except Refusal as exc:
            results.append(exc.code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    entries = list(CompensationEntry.objects.filter(call=call).values_list("pk", flat=True))
    assert len(entries) == 1 and sorted(map(str, results)) == sorted([str(entries[0]), "not_compensable"])


# --- the entry's state table -----------------------------------------------------------------------------------

SPEC_EDGES = {
    "pending": {"sent", "failed"},
    "sent": {"committed", "unknown", "not_committed", "failed", "review"},
    "unknown": {"committed", "not_committed", "failed", "review"},
    "not_committed": {"sent", "failed"},
    "review": {"committed", "failed"},
    "committed": set(),
    "failed": set(),
}
PAIRS = [(a, b) for a in E for b in E if a != b]


def test_the_entry_table_is_the_specs():
    assert {str(a): {str(b) for b in bs} for a, bs in EDGES.items()} == SPEC_EDGES


@pytest.fixture
def make_entry(make_call, registry):
    def make(state: str) -> CompensationEntry:
        call = make_call("COMPENSATING")
        return CompensationEntry.objects.create(
            call=call,
            number=1,
            tool=registry["refund"],
            idempotency_key=f"{call.idempotency_key}.compensation-1",
            target="t",
            target_version=0,
            expected_effect="e",
            state=state,
        )

    return make


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_transition_entry_follows_the_table(make_entry, src, dst):
    entry = make_entry(src)
    if (str(src), str(dst)) in ALLOWED_PAIRS:
        transition_entry(entry, dst, actor=ACTOR, reason="table test")
        entry.refresh_from_db()
        assert (entry.state, entry.version) == (dst, 1)
        event = AuditEvent.objects.get(action=AuditAction.COMPENSATION_TRANSITION, call=entry.call)
        assert (event.from_state, event.to_state, event.evidence["compensation"]) == (src, dst, entry.pk)
    else:
        with pytest.raises(IllegalTransition):
            transition_entry(entry, dst, actor=ACTOR, reason="table test")
        entry.refresh_from_db()
        assert (entry.state, entry.version) == (src, 0)


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_the_database_refuses_any_other_edge(make_entry, src, dst):
    entry = make_entry(src)

    def raw(state: str, version: int) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE recovery_compensationentry SET state = %s, version = %s WHERE id = %s",
                [state, version, entry.pk],
            )

    if (str(src), str(dst)) in ALLOWED_PAIRS:
        with pytest.raises(IntegrityError):
            raw(dst, 0)  # a state change must bump the version
        raw(dst, 1)
        assert _state(CompensationEntry, entry.pk) == dst
    else:
        with pytest.raises(IntegrityError):
            raw(dst, 1)
        assert _state(CompensationEntry, entry.pk) == src


def test_a_stale_entry_is_a_conflict_and_changes_nothing(make_entry):
    entry = make_entry("sent")
    stale = CompensationEntry.objects.get(pk=entry.pk)
    transition_entry(entry, "unknown", actor=ACTOR, reason="first")

    with pytest.raises(TransitionConflict):
        transition_entry(stale, "committed", actor=ACTOR, reason="second")

    assert _state(CompensationEntry, entry.pk) == "unknown"


def test_one_call_holds_at_most_one_open_entry(make_entry, registry):
    entry = make_entry("unknown")
    with pytest.raises(IntegrityError), transaction.atomic():
        CompensationEntry.objects.create(
            call=entry.call,
            number=2,
            tool=registry["refund"],
            idempotency_key="another",
            target="t",
            target_version=0,
            expected_effect="e",
        )


def test_the_api_shows_the_calls_ledger_and_the_task_lists_it_as_compensated(world):
    client = world["client"]
    call, task_id = _committed_order(world)
    entry = compensation_start(call, actor=ACTOR, send=False)
    compensation_send(entry.pk, worker="w1")

    detail = client.get_call(call.pk)

    assert detail["state"] == "COMPENSATED"
    (shown,) = detail["compensations"]
    assert {k: shown[k] for k in ("compensation_id", "number", "tool", "state", "attempts_made")} == {
        "compensation_id": f"comp-{call.pk}-1",
        "number": 1,
        "tool": "order.cancel",
        "state": "committed",
        "attempts_made": 1,
    }
    assert shown["idempotency_key"] == entry.idempotency_key and shown["provider_ref"].startswith("ca_")
    assert [c["call_id"] for c in client.get_task(task_id).compensated] == [call.pk]


def _committed_payment(world, amount_cents: int) -> Call:
    client, sandbox = world["client"], world["sandbox"]
    task = client.create_task("demo", f"pay-{next(_n)}", agent="tests", goal="capture, then refund it")
    key, args = f"payment-{next(_n)}", {"order_id": f"O-{next(_n)}", "amount_cents": amount_cents}
    ref = client.add_call(task.id, step=1, tool="payment.capture", arguments=args, idempotency_key=key)
    admitted = client.admit(ref.call_id, "a1")
    reply = requests.post(f"{sandbox.url}/payments", json=args, headers=sandbox.headers(key), timeout=(2, 3))
    assert client.report(ref.call_id, admitted.attempt_id, facts_from_response(reply)).call_state == "COMMITTED"
    return Call.objects.select_related("tool", "task").get(pk=ref.call_id)


def test_a_refund_that_undoes_less_than_the_payment_ends_partial_and_the_next_entry_refunds_the_rest(world):
    sandbox = world["sandbox"]
    call = _committed_payment(world, 1250)
    first = compensation_start(call, actor=ACTOR, send=False)
    assert (first.tool.name, first.arguments["amount_cents"]) == ("refund.create", 1250)
    sandbox.fault(route="/refunds", key=first.idempotency_key, kind="partial", amount_cents=500, times=1)

    compensation_send(first.pk, worker="w1")  # the reply's amount breaks the tool's invariant: unknown
    first.refresh_from_db()
    assert first.state == "unknown"
    compensation_check(first.pk, worker="w1")  # the provider's record: a refund of 500

    first.refresh_from_db()
    assert (first.state, first.undone_amount, first.effects_observed) == ("committed", 500, 0)
    assert _state(Call, call.pk) == "PARTIAL_COMPENSATED"

    second = compensation_start(Call.objects.get(pk=call.pk), actor=ACTOR, send=False)
    assert second.arguments["amount_cents"] == 750  # what is left, never the whole amount again
    compensation_send(second.pk, worker="w1")

    second.refresh_from_db()
    assert second.state == "committed" and _state(Call, call.pk) == "COMPENSATED"
    refunded = [sandbox.ledger(e.idempotency_key)["effects"] for e in (first, second)]
    assert refunded == [1, 1]

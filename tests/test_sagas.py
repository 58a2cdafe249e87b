"""Sagas for runtimes (docs/compensation.md, docs/design/tasks.md): a task fails halfway and one call undoes what
stands, in reverse dependency order, each step settled before it is undone — through the client, against the real
sandbox process, in both executor modes: the console's worker sends each undo, or the runtime does (it asks for the next
entry, admits, sends and reports it like any attempt). The sandbox's ledger and request times are the judge."""

from __future__ import annotations

import pytest
import requests
from django.utils import timezone
from recovery_client import RecoveryClient, RecoveryError, facts_from_exception, facts_from_response
from rq.worker import SimpleWorker

from recovery.audit.chain import Actor
from recovery.jobs import inprocess
from recovery.models import Call, CompensationEntry, Task
from recovery.registry import load_registry
from recovery.services.compensations import compensation_check, compensation_send, compensations_run_due
from recovery.services.reconcile import reconcile_due
from recovery.services.sagas import saga_advance
from recovery.services.tokens import token_create
from tests.sandbox import sandbox_registry

pytestmark = pytest.mark.django_db(transaction=True)

API_KEY, CALLBACK_SECRET = "sandbox-test-key", "sandbox-test-secret"
ACTOR = Actor.system("tests")
_n = iter(range(1, 100_000))


class _Held:
    """Jobs enqueued on commit wait here (the test runs what they would run, in order): no job runs by itself."""

    def __init__(self) -> None:
        self.jobs: list[tuple] = []

    def submit(self, func, args=(), *, job_id: str) -> bool:
        self.jobs.append((func, args, job_id))
        return True


@pytest.fixture
def world(sandbox, live_server, monkeypatch, settings):
    settings.REDIS_URL = None  # in-process jobs, held: the test advances the saga itself
    monkeypatch.setattr(inprocess, "_runner", _Held())
    monkeypatch.setenv("SANDBOX_API_KEY", API_KEY)
    monkeypatch.setenv("SANDBOX_CALLBACK_SECRET", CALLBACK_SECRET)
    load_registry(sandbox_registry(sandbox.url, max_checks=4), actor=ACTOR)
    _, token = token_create(name="runtime", tenants=["demo"], actor=ACTOR)
    return {"client": RecoveryClient(live_server.url, token), "sandbox": sandbox}


def _run(world, task_id: int, step: int, tool: str, path: str, args: dict, *, depends_on=(), fault=None) -> int:
    """One step as a runtime runs it: add the call, admit, send the real request to the sandbox, report."""
    client, sandbox = world["client"], world["sandbox"]
    key = f"{tool}-{next(_n)}"
    call = client.add_call(task_id, step=step, tool=tool, arguments=args, idempotency_key=key, depends_on=depends_on)
    if fault:
        sandbox.fault(route=path, key=key, **fault)
    client.admit(call.call_id, "a1")
    try:
        facts = facts_from_response(
            requests.post(sandbox.url + path, json=args, headers=sandbox.headers(key), timeout=3)
        )
    except requests.RequestException as exc:
        facts = facts_from_exception(exc)
    client.report(call.call_id, "a1", facts)
    return call.call_id


def _three_steps(world, *, payment_fault=None) -> tuple[int, int, int, int]:
    """An order (1), its payment (2, after 1), its shipment (3, after 2) refused for good: (task, order, payment,
    shipment) call ids."""
    client = world["client"]
    task = client.create_task("demo", f"saga-{next(_n)}", agent="tests", goal="order, pay, ship")
    order = _run(
        world, task.id, 1, "order.create", "/orders", {"customer_id": "C-7", "items": [{"sku": "S", "quantity": 1}]}
    )
    order_id = Call.objects.get(pk=order).provider_ref
    payment = _run(
        world, task.id, 2, "payment.capture", "/payments", {"order_id": order_id, "amount_cents": 900},
        depends_on=[1], fault=payment_fault,
    )  # fmt: skip
    address = {"line1": "1 Main St", "city": "Lyon", "postcode": "69001", "country": "FR"}
    if payment_fault:  # the payment is in doubt: the shipment waits for it, and the runtime gives up meanwhile
        return task.id, order, payment, None
    shipping = {"order_id": order_id, "address": address, "service": "standard"}
    refused = {"kind": "error", "status": 422, "code": "address_rejected"}
    shipment = _run(world, task.id, 3, "shipment.create", "/shipments", shipping, depends_on=[2], fault=refused)
    return task.id, order, payment, shipment


def _work(task_id: int, rounds: int = 6) -> None:
    """What the jobs do for a console saga, run here one after the other: advance it, send what is pending, run
    the reconcile schedule's share (resends and checks)."""
    for _ in range(rounds):
        saga_advance(task_id)
        for entry in CompensationEntry.objects.filter(call__task_id=task_id, state="pending"):
            compensation_send(entry.pk, worker="w1")
        compensations_run_due(worker="w1")


def _undo_posts(sandbox) -> list[dict]:
    return [r for r in sandbox.requests() if r["method"] == "POST" and ".compensation-" in (r["key"] or "")]


def test_an_aborted_saga_undoes_its_committed_steps_in_reverse_order_by_the_consoles_worker(world):
    client, sandbox = world["client"], world["sandbox"]
    task_id, order, payment, shipment = _three_steps(world)
    assert [Call.objects.get(pk=c).state for c in (order, payment)] == ["COMMITTED", "COMMITTED"]
    assert Call.objects.get(pk=shipment).state in ("RETRYABLE", "FAILED_PERMANENT")

    saga = client.compensate_task(task_id, executor="console", reason="the shipment was refused for good")

    assert (saga["saga"], saga["executor"]) == ("running", "console")
    _work(task_id)
    done = client.task_compensation(task_id)
    assert (done["saga"], done["outcome"], done["next"]) == ("done", "compensated", None)
    assert [Call.objects.get(pk=c).state for c in (order, payment)] == ["COMPENSATED", "COMPENSATED"]
    undone = [r["path"] for r in _undo_posts(sandbox)]
    assert undone == ["/refunds", f"/orders/{Call.objects.get(pk=order).provider_ref}/cancel"]  # 2, then 1
    task = client.get_task(task_id)
    assert task.outcome == "compensated" and {c["call_id"] for c in task.compensated} == {order, payment}
    with pytest.raises(RecoveryError) as closed:
        client.add_call(task_id, step=4, tool="order.lookup", arguments={"order_id": "O-1"}, idempotency_key="late")
    assert closed.value.code == "task_closed"


def test_a_runtime_executes_the_undos_itself_one_entry_at_a_time(world):
    client, sandbox = world["client"], world["sandbox"]
    task_id, _order, _payment, _ = _three_steps(world)

    client.compensate_task(task_id, executor="runtime")
    sent = []
    for _ in range(4):
        saga_advance(task_id)  # what the abort and each entry's end enqueue
        saga = client.task_compensation(task_id)
        entry = saga["next"]
        if entry is None:
            break
        assert entry["state"] == "pending"
        admitted = client.admit_compensation(entry["compensation_id"], "u1")
        assert admitted == client.admit_compensation(entry["compensation_id"], "u1")  # a repeat: the same answer
        refund = entry["tool"] == "refund.create"
        path = "/refunds" if refund else f"/orders/{entry['arguments']['order_id']}/cancel"
        body = entry["arguments"] if refund else {"reason": entry["arguments"]["reason"]}
        reply = requests.post(
            sandbox.url + path, json=body, headers=sandbox.headers(entry["idempotency_key"]), timeout=3
        )
        answer = client.report_compensation(entry["compensation_id"], "u1", facts_from_response(reply))
        assert answer["state"] == "committed"
        sent.append(entry["tool"])
    assert sent == ["refund.create", "order.cancel"]  # reverse dependency order
    assert client.task_compensation(task_id)["saga"] == "done"
    assert Task.objects.get(pk=task_id).outcome == "compensated"
    assert compensations_run_due(worker="w1") == 0  # the console never sent a runtime's entry


def test_a_step_still_unknown_at_the_abort_is_settled_first_then_undone(world):
    client, _sandbox = world["client"], world["sandbox"]
    task_id, order, payment, _ = _three_steps(world, payment_fault={"kind": "commit_then_drop", "times": 1})
    assert Call.objects.get(pk=payment).state == "UNKNOWN"

    client.compensate_task(task_id)
    saga_advance(task_id)
    waiting = client.task_compensation(task_id)
    assert waiting["waiting_for"] == [payment] and waiting["next"] is None  # nothing is undone before it settles

    Call.objects.filter(pk=payment).update(next_check_at=timezone.now())  # due now, not in 3 s
    reconcile_due(worker="w1")  # the receipt: the payment did commit
    assert Call.objects.get(pk=payment).state == "COMMITTED"
    _work(task_id)
    assert client.task_compensation(task_id)["saga"] == "done"
    assert [Call.objects.get(pk=c).state for c in (order, payment)] == ["COMPENSATED", "COMPENSATED"]


def test_a_refused_undo_stops_the_chain_there_for_a_person(world):
    client, sandbox = world["client"], world["sandbox"]
    task_id, order, payment, _ = _three_steps(world)
    order_ref = Call.objects.get(pk=order).provider_ref
    sandbox.fault(route=f"/orders/{order_ref}/cancel", kind="error", status=409, code="not_cancellable")

    client.compensate_task(task_id)
    _work(task_id)

    saga = client.task_compensation(task_id)
    assert (saga["saga"], saga["stopped_at"]) == ("stopped", order)
    assert Call.objects.get(pk=order).state == "COMPENSATION_FAILED"
    assert Call.objects.get(pk=payment).state == "COMPENSATED"  # undone before the order, as it depends on it
    assert Task.objects.get(pk=task_id).outcome == "abandoned"  # what still stands is named, not "compensated"


def test_abort_refusals_change_nothing(world):
    client = world["client"]
    task_id, *_ = _three_steps(world)
    with pytest.raises(RecoveryError) as bad:
        client.compensate_task(task_id, executor="robot")
    assert bad.value.status == 422 and bad.value.field_errors[0]["field"] == "executor"
    client.compensate_task(task_id)
    with pytest.raises(RecoveryError) as again:
        client.compensate_task(task_id)
    assert again.value.code == "already_compensating"
    other = client.create_task("demo", f"plain-{next(_n)}", agent="tests", goal="g")
    client.complete_task(other.id, "nothing to do")
    with pytest.raises(RecoveryError) as closed:
        client.compensate_task(other.id)
    assert closed.value.code == "task_closed"


def test_a_step_without_a_compensation_is_a_field_error_and_nothing_is_aborted(world):
    client = world["client"]
    task = client.create_task("demo", f"ship-{next(_n)}", agent="tests", goal="ship")
    address = {"line1": "1 Main St", "city": "Lyon", "postcode": "69001", "country": "FR"}
    _run(
        world,
        task.id,
        1,
        "shipment.create",
        "/shipments",
        {"order_id": "O-1", "address": address, "service": "standard"},
    )

    with pytest.raises(RecoveryError) as refused:
        client.compensate_task(task.id)

    assert refused.value.code == "compensation_unavailable"
    assert [e["field"] for e in refused.value.field_errors] == ["steps.1"]
    assert Task.objects.get(pk=task.id).status == "open" and not Task.objects.get(pk=task.id).saga


def test_a_step_declares_its_own_compensation_when_its_call_is_added(world):
    client = world["client"]
    task = client.create_task("demo", f"own-{next(_n)}", agent="tests", goal="grant")
    call = client.add_call(
        task.id, step=1, tool="order.create", idempotency_key=f"o-{next(_n)}",
        arguments={"customer_id": "C-1", "items": [{"sku": "S", "quantity": 1}]},
        compensation={"tool": "order.cancel", "args": {"order_id": "{provider_ref}", "reason": "saga"}},
    )  # fmt: skip
    assert Call.objects.get(pk=call.call_id).step.compensation["args"]["reason"] == "saga"
    with pytest.raises(RecoveryError) as bad:
        client.add_call(
            task.id, step=2, tool="order.create", idempotency_key=f"o-{next(_n)}",
            arguments={"customer_id": "C-2", "items": [{"sku": "S", "quantity": 1}]},
            compensation={"tool": "order.lookup", "args": {}},
        )  # fmt: skip
    assert bad.value.code == "invalid_compensation" and bad.value.field_errors[0]["field"] == "compensation.tool"


def test_an_entry_left_unknown_by_a_runtime_is_reconciled_by_its_key(world):
    client, sandbox = world["client"], world["sandbox"]
    task_id, _order, payment, _ = _three_steps(world)
    client.compensate_task(task_id, executor="runtime")
    saga_advance(task_id)
    entry = client.task_compensation(task_id)["next"]
    client.admit_compensation(entry["compensation_id"], "u1")
    requests.post(
        sandbox.url + "/refunds", json=entry["arguments"], headers=sandbox.headers(entry["idempotency_key"]), timeout=3
    )
    lost = {"connection_opened": True, "sent": True, "error": {"kind": "read_timeout", "message": "timed out"}}
    assert client.report_compensation(entry["compensation_id"], "u1", lost)["state"] == "unknown"

    compensation_check(CompensationEntry.objects.get(call_id=payment).pk, worker="w1", force=True)

    assert CompensationEntry.objects.get(call_id=payment).state == "committed"
    assert Call.objects.get(pk=payment).state == "COMPENSATED"


def test_the_jobs_run_a_console_saga_to_its_end_on_a_real_rq_worker(world, rq_queue):
    client, sandbox = world["client"], world["sandbox"]
    task_id, order, payment, _ = _three_steps(world)

    client.compensate_task(task_id)  # enqueues the saga's first step on commit
    for _ in range(8):  # each job enqueues the next: advance → send → (the entry ends) advance → ...
        SimpleWorker([rq_queue], connection=rq_queue.connection).work(burst=True)
        if client.task_compensation(task_id)["saga"] == "done":
            break

    assert client.task_compensation(task_id)["saga"] == "done"
    assert [Call.objects.get(pk=c).state for c in (order, payment)] == ["COMPENSATED", "COMPENSATED"]
    order_ref = Call.objects.get(pk=order).provider_ref
    assert [r["path"] for r in _undo_posts(sandbox)] == ["/refunds", f"/orders/{order_ref}/cancel"]


def test_the_task_summary_names_what_became_of_each_step(world):
    client = world["client"]
    task_id, order, _payment, _shipment = _three_steps(world)
    world["sandbox"].fault(
        route=f"/orders/{Call.objects.get(pk=order).provider_ref}/cancel",
        kind="error",
        status=409,
        code="not_cancellable",
    )
    client.compensate_task(task_id)
    _work(task_id)

    summary = client.get_task(task_id)

    effects = {step["index"]: step["effect"] for step in summary.steps}
    assert effects == {1: "created, not cancelled: the undo failed", 2: "captured, then refunded", 3: "not executed"}
    assert summary.raw["saga"] == "stopped" and summary.outcome == "abandoned"


def test_the_task_page_says_the_saga_stopped_and_why(world, client, console_people):
    task_id, order, *_ = _three_steps(world)
    world["sandbox"].fault(
        route=f"/orders/{Call.objects.get(pk=order).provider_ref}/cancel",
        kind="error",
        status=409,
        code="not_cancellable",
    )
    world["client"].compensate_task(task_id)
    _work(task_id)
    client.force_login(console_people["viewer"])

    page = client.get(f"/tasks/{task_id}/").content.decode()

    assert "aborted: stopped" in page and "the rest waits for a person" in page
    assert "created, not cancelled: the undo failed" in page

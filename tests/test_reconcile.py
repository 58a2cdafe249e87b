"""Reconciliation end to end (docs/design/state-machine.md, docs/reconciliation.md): a runtime drives the real API, the
real sandbox process holds the truth, and reconciliation settles what the runtime could not know — never by a second
request to the provider."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
import requests
from django.db import connection
from django.utils import timezone
from recovery_client import NotAdmitted, RecoveryClient, facts_from_exception, facts_from_response
from rq.worker import SimpleWorker

from recovery.audit.chain import Actor
from recovery.jobs import inprocess, queueing
from recovery.jobs import tasks as jobs
from recovery.models import AuditEvent, Call, Receipt, StatusBreaker
from recovery.registry import load_registry
from recovery.services.callbacks import sign
from recovery.services.reconcile import claim_due, reconcile_due
from recovery.services.sweeper import sweep_sent
from recovery.services.tokens import token_create
from tests.sandbox import sandbox_registry

pytestmark = pytest.mark.django_db(transaction=True)

API_KEY, CALLBACK_SECRET = "sandbox-test-key", "sandbox-test-secret"
REFUND = {"order_id": "O-8848", "amount_cents": 1250}
_n = iter(range(1, 100_000))


class HeldChecks:
    """The in-process runner with the immediate status checks held back.

    A write that turns UNKNOWN enqueues its first check at once (the sandbox registry's first_check_s 0). With
    REDIS_URL that job waits in the test's Redis queue, where no worker runs; in the embedded mode the in-process
    runner would run it at once, racing the checks these tests make themselves (reconcile_due, a worker's lease).
    Held here, both modes see the same thing; `release()` gives them back to the real runner."""

    def __init__(self, runner: inprocess.Runner) -> None:
        self.runner = runner
        self.checks: list[str] = []

    def submit(self, func, args=(), *, job_id: str) -> bool:
        if job_id.startswith(("reconcile-call-", "reconcile-now-")):
            self.checks.append(job_id)
            return True
        return self.runner.submit(func, args, job_id=job_id)

    def __getattr__(self, name):
        return getattr(self.runner, name)


@pytest.fixture
def world(sandbox, live_server, monkeypatch):
    """The shipped sandbox registry pointed at the sandbox process, with a quick reconcile schedule; the status
    checks enqueued at UNKNOWN held back in the embedded mode as they are in Redis's (HeldChecks)."""
    held = HeldChecks(inprocess.get_runner())
    monkeypatch.setattr(inprocess, "_runner", held)
    monkeypatch.setenv("SANDBOX_API_KEY", API_KEY)
    monkeypatch.setenv("SANDBOX_CALLBACK_SECRET", CALLBACK_SECRET)
    load_registry(sandbox_registry(sandbox.url, max_checks=3), actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["demo"], actor=Actor.system("tests"))
    return {
        "client": RecoveryClient(live_server.url, token),
        "sandbox": sandbox,
        "url": live_server.url,
        "release_checks": lambda: monkeypatch.setattr(inprocess, "_runner", held.runner),
    }


def _post_refund(sandbox, key: str, body: dict | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": key}
    return requests.post(f"{sandbox.url}/refunds", json=body or REFUND, headers=headers, timeout=(2, 3))


def _refund_call(world, key: str | None = None) -> tuple[int, str]:
    client = world["client"]
    task = client.create_task("demo", f"task-{next(_n)}", agent="tests", goal="refund an order")
    key = key or f"refund-{next(_n)}"
    call = client.add_call(task.id, step=1, tool="refund.create", arguments=REFUND, idempotency_key=key)
    return call.call_id, key


def _attempt(world, call_id: int, key: str, *, evidence: tuple[str, ...] = ()) -> str:
    """Admit, send the real request to the sandbox, report what happened; the call's state after."""
    client = world["client"]
    attempt = client.admit(call_id, f"a-{next(_n)}", evidence=evidence)
    try:
        reply = _post_refund(world["sandbox"], key)
        facts = facts_from_response(reply)
    except requests.RequestException as exc:
        facts = facts_from_exception(exc)
    return client.report(call_id, attempt.attempt_id, facts).call_state


def _lose_reply(world, call_id: int, key: str, *, kind: str = "commit_then_drop") -> None:
    """The runtime's attempt loses its reply (after the provider committed, or before): the call is UNKNOWN."""
    world["sandbox"].fault(route="/refunds", key=key, kind=kind, times=1)
    assert _attempt(world, call_id, key) == "UNKNOWN"


def _due_now(call_id: int) -> None:
    """Skip the wait for the next scheduled check (a counter, not a state change)."""
    Call.objects.filter(pk=call_id).update(next_check_at=timezone.now())


def _state(call_id: int) -> str:
    return Call.objects.get(pk=call_id).state


def _status_queries(sandbox, key: str) -> list[dict]:
    return [r for r in sandbox.requests(key=key) if "/by-key/" in r["path"]]


def test_it_settles_a_refund_whose_reply_was_lost_as_committed_without_a_second_request(world):
    sandbox = world["sandbox"]
    call_id, key = _refund_call(world)
    _lose_reply(world, call_id, key)

    assert reconcile_due(worker="w1") == 1

    call = Call.objects.get(pk=call_id)
    assert call.state == "COMMITTED" and call.provider_ref.startswith("re_") and call.checks_made == 1
    (receipt,) = Receipt.objects.filter(call_id=call_id)
    seen = (receipt.source, receipt.observed, receipt.applied, receipt.effects_observed)
    assert seen == ("poll", "committed", True, 1)
    assert (receipt.local_state_before, receipt.local_state_after) == ("UNKNOWN", "COMMITTED")
    assert API_KEY not in json.dumps(receipt.request) and "[REDACTED]" in json.dumps(receipt.request)
    writes = [r for r in sandbox.requests(key=key) if r["method"] == "POST"]
    assert len(writes) == 1 and sandbox.ledger(key)["effects"] == 1
    assert world["client"].get_call(call_id)["state"] == "COMMITTED"


def test_it_finds_a_refund_lost_before_commit_not_committed_and_admits_the_same_key_retry_only_then(world):
    sandbox = world["sandbox"]
    call_id, key = _refund_call(world)
    _lose_reply(world, call_id, key, kind="drop_before_commit")
    with pytest.raises(NotAdmitted):  # no receipt yet: nothing proves the first request did nothing
        world["client"].admit(call_id, "too-early", evidence=("state_verified",))

    reconcile_due(worker="w1")

    assert _state(call_id) == "RETRYABLE"
    events = list(AuditEvent.objects.filter(call_id=call_id).order_by("seq").values_list("from_state", "to_state"))
    assert events[-2:] == [("UNKNOWN", "NOT_COMMITTED"), ("NOT_COMMITTED", "RETRYABLE")]
    assert _attempt(world, call_id, key, evidence=("state_verified",)) == "COMMITTED"
    assert sandbox.ledger(key)["effects"] == 1


def test_a_pending_answer_keeps_the_call_unknown_until_the_provider_decides(world):
    sandbox = world["sandbox"]
    call_id, key = _refund_call(world)
    sandbox.fault(route="/refunds", key=key, kind="pending", checks=2)
    _lose_reply(world, call_id, key)

    reconcile_due(worker="w1")
    _due_now(call_id)
    reconcile_due(worker="w1")
    assert _state(call_id) == "UNKNOWN"
    assert list(Receipt.objects.filter(call_id=call_id).values_list("observed", flat=True)) == ["pending", "pending"]
    assert reconcile_due(worker="w1") == 0  # the next check waits for its time
    _due_now(call_id)
    reconcile_due(worker="w1")
    assert _state(call_id) == "COMMITTED"
    assert sandbox.ledger(key)["effects"] == 1


def test_a_provider_whose_status_api_is_down_sends_the_call_to_human_review_at_the_poll_budget(world):
    sandbox = world["sandbox"]
    call_id, key = _refund_call(world)
    sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    sandbox.fault(route="/refunds/by-key", kind="status_down", status=503)
    assert _attempt(world, call_id, key) == "UNKNOWN"

    states = []
    for _ in range(3):
        _due_now(call_id)
        reconcile_due(worker="w1")
        states.append(_state(call_id))

    assert states == ["STILL_UNKNOWN", "STILL_UNKNOWN", "HUMAN_REVIEW"]
    call = Call.objects.get(pk=call_id)
    assert (call.outcome, call.checks_made, call.next_check_at) == ("poll_budget_exhausted", 3, None)
    assert set(Receipt.objects.filter(call_id=call_id).values_list("observed", flat=True)) == {"failed"}
    _due_now(call_id)
    assert reconcile_due(worker="w1") == 0  # nothing left to poll: it waits for a person


def test_an_open_status_breaker_skips_checks_as_unreachable_receipts_that_count(world):
    sandbox = world["sandbox"]
    sandbox.fault(route="/refunds/by-key", kind="status_down", status=503)
    calls = []
    for _ in range(6):
        call_id, key = _refund_call(world)
        _lose_reply(world, call_id, key)
        calls.append((call_id, key))

    reconcile_due(worker="w1", in_flight=1)  # one at a time: the breaker opens after its 5th failure

    observed = [Receipt.objects.get(call_id=call_id).observed for call_id, _ in calls]
    assert observed == ["failed"] * 5 + ["unreachable"]
    assert StatusBreaker.objects.get(provider__name="sandbox").state == "open"
    assert _status_queries(sandbox, calls[5][1]) == []  # skipped: no request reached the provider
    assert Call.objects.get(pk=calls[5][0]).checks_made == 1
    assert AuditEvent.objects.filter(action="status_breaker.opened").count() == 1


def test_a_duplicate_effect_reported_by_the_provider_sends_the_call_to_human_review(world):
    sandbox = world["sandbox"]
    call_id, key = _refund_call(world)
    sandbox.fault(route="/refunds", kind="ignore_keys")
    _post_refund(sandbox, key)  # a second execution the provider did not deduplicate
    _lose_reply(world, call_id, key)

    reconcile_due(worker="w1")

    call = Call.objects.get(pk=call_id)
    assert (call.state, call.outcome, call.duplicate_effect, call.effects_observed) == (
        "HUMAN_REVIEW",
        "duplicate_effect",
        True,
        2,
    )


def test_a_killed_workers_lease_expires_and_another_worker_takes_the_call(world):
    call_id, key = _refund_call(world)
    _lose_reply(world, call_id, key)

    assert claim_due(worker="killed", limit=10) == [call_id]  # ...and the worker dies before checking
    assert claim_due(worker="other", limit=10) == []
    later = timezone.now() + timedelta(seconds=61)
    assert claim_due(worker="other", limit=10, now=later) == [call_id]


@pytest.mark.postgres
def test_two_workers_racing_for_the_same_due_calls_never_check_one_call_twice(world):
    sandbox = world["sandbox"]
    sandbox.fault(route="/refunds/by-key", kind="latency", ms=30)
    ids = []
    for _ in range(16):
        call_id, key = _refund_call(world)
        _lose_reply(world, call_id, key)
        ids.append(call_id)

    counts: dict[str, int] = {}

    def work(name: str) -> None:
        try:
            while done := reconcile_due(worker=name, limit=3, in_flight=2):
                counts[name] = counts.get(name, 0) + done
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(name,)) for name in ("w1", "w2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(counts.values()) == 16 and len(counts) == 2
    for call_id in ids:
        assert Receipt.objects.filter(call_id=call_id).count() == 1
        assert _state(call_id) == "COMMITTED"


def _callback(world, key: str, *, status: str = "succeeded", event_id: str | None = None, secret=CALLBACK_SECRET):
    event = {"event_id": event_id or f"evt_{next(_n)}", "type": "refund.succeeded", "idempotency_key": key}
    body = json.dumps(event | {"status": status}).encode()
    headers = {"Content-Type": "application/json", "Recovery-Signature": sign(secret, body)}
    return requests.post(f"{world['url']}/api/v1/providers/sandbox/callbacks", data=body, headers=headers, timeout=10)


def test_a_signed_callback_settles_the_call_and_its_duplicates_change_nothing(world):
    call_id, key = _refund_call(world)
    _lose_reply(world, call_id, key)

    answers = [_callback(world, key, event_id="evt_same") for _ in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["duplicate"] for a in answers] == [False, True, True]
    assert _state(call_id) == "COMMITTED"
    assert Receipt.objects.filter(call_id=call_id).count() == 1
    assert AuditEvent.objects.filter(call_id=call_id, to_state="COMMITTED").count() == 1
    assert Call.objects.get(pk=call_id).checks_made == 0  # a callback is not a poll


def test_a_forged_or_stale_callback_gets_401_and_stores_nothing(world):
    call_id, key = _refund_call(world)
    forged = _callback(world, key, secret="not-the-secret")
    body = json.dumps({"event_id": "evt_old", "idempotency_key": key, "status": "succeeded"}).encode()
    stale = requests.post(
        f"{world['url']}/api/v1/providers/sandbox/callbacks",
        data=body,
        headers={"Recovery-Signature": sign(CALLBACK_SECRET, body, now=time.time() - 301)},
        timeout=10,
    )
    unsigned = requests.post(f"{world['url']}/api/v1/providers/sandbox/callbacks", data=body, timeout=10)
    assert [forged.status_code, stale.status_code, unsigned.status_code] == [401, 401, 401]
    assert forged.json()["error"]["code"] == "bad_signature"
    assert Receipt.objects.count() == 0 and _state(call_id) == "READY"


def test_the_sandboxs_own_signed_callback_settles_an_unknown_refund(world):
    sandbox = world["sandbox"]
    sandbox.configure(callback_url=f"{world['url']}/api/v1/providers/sandbox/callbacks")
    call_id, key = _refund_call(world)
    sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
    _attempt(world, call_id, key)
    deadline = time.monotonic() + 10
    while _state(call_id) != "COMMITTED" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _state(call_id) == "COMMITTED"
    assert Receipt.objects.get(call_id=call_id).source == "callback"


def _wait_claimed(call_id: int, worker: str, timeout_s: float = 10.0) -> None:
    """Until `worker`'s reconciliation has claimed the call (a sleep would race a loaded machine's thread start)."""
    deadline = time.monotonic() + timeout_s
    while not Call.objects.filter(pk=call_id, check_lease_owner=worker).exists():
        assert time.monotonic() < deadline, f"{worker} never claimed call {call_id}"
        time.sleep(0.002)


@pytest.mark.postgres
def test_a_callback_and_a_poll_arriving_together_leave_one_consistent_state(world):
    sandbox = world["sandbox"]
    sandbox.fault(route="/refunds/by-key", kind="latency", ms=50)
    for _ in range(5):
        call_id, key = _refund_call(world)
        _lose_reply(world, call_id, key)
        poller = threading.Thread(target=lambda: (reconcile_due(worker="w1"), connection.close()))
        poller.start()
        _wait_claimed(call_id, "w1")  # the poll holds the call, its status query in flight (50 ms)
        assert _callback(world, key).status_code == 200
        poller.join()
        assert _state(call_id) == "COMMITTED"
        assert AuditEvent.objects.filter(call_id=call_id, to_state="COMMITTED").count() == 1
        receipts = list(Receipt.objects.filter(call_id=call_id).values_list("source", "applied"))
        assert sorted(receipts) == [("callback", False), ("poll", True)] or sorted(receipts) == [
            ("callback", True),
            ("poll", False),
        ]


def test_the_sweeper_moves_a_silent_sent_write_to_unknown_and_a_read_to_retryable(world):
    client = world["client"]
    task = client.create_task("demo", f"task-{next(_n)}", agent="tests", goal="sweep")
    write = client.add_call(task.id, step=1, tool="refund.create", arguments=REFUND, idempotency_key="sw-1")
    read = client.add_call(task.id, step=2, tool="order.lookup", arguments={"order_id": "O-1"}, idempotency_key="sw-2")
    client.admit(write.call_id, "w-1")
    client.admit(read.call_id, "r-1")
    assert sweep_sent() == 0  # still within their outcome timeouts

    later = timezone.now() + timedelta(seconds=31)
    assert sweep_sent(now=later) == 2

    assert (_state(write.call_id), _state(read.call_id)) == ("UNKNOWN", "RETRYABLE")
    assert Call.objects.get(pk=write.call_id).next_check_at is not None


def test_reconcile_endpoint_checks_now_and_says_where_to_poll(world, settings):
    settings.REDIS_URL = None  # the embedded default: the job runs on the in-process runner
    client = world["client"]
    call_id, key = _refund_call(world)
    _lose_reply(world, call_id, key)
    world["release_checks"]()  # the endpoint's own check is what this test watches run

    answer = client.reconcile(call_id)

    assert answer["poll"] == f"/api/v1/calls/{call_id}" and answer["call_state"] == "UNKNOWN"
    deadline = time.monotonic() + 10
    while client.get_call(call_id)["state"] == "UNKNOWN" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.get_call(call_id)["state"] == "COMMITTED"


def test_reconcile_endpoint_refuses_a_call_with_nothing_to_reconcile(world):
    call_id, _ = _refund_call(world)
    reply = requests.post(
        f"{world['url']}/api/v1/calls/{call_id}/reconcile",
        headers={"Authorization": world["client"].session.headers["Authorization"]},
        timeout=10,
    )
    assert reply.status_code == 409 and reply.json()["error"]["code"] == "not_reconcilable"


def test_a_call_past_its_deadline_goes_to_human_review_whatever_the_provider_says_pending(world):
    sandbox = world["sandbox"]
    call_id, key = _refund_call(world)
    sandbox.fault(route="/refunds", key=key, kind="pending", checks=5)
    _lose_reply(world, call_id, key)
    Call.objects.filter(pk=call_id).update(sent_at=timezone.now() - timedelta(seconds=601))  # not a state change

    reconcile_due(worker="w1")

    call = Call.objects.get(pk=call_id)
    assert (call.state, call.outcome) == ("HUMAN_REVIEW", "deadline_exceeded")
    assert Receipt.objects.get(call_id=call_id).observed == "pending"


def test_a_real_rq_worker_settles_an_unknown_refund_asked_for_through_the_api(world, rq_queue):
    sandbox, client = world["sandbox"], world["client"]
    call_id, key = _refund_call(world)
    _lose_reply(world, call_id, key)

    client.reconcile(call_id)
    client.reconcile(call_id)  # asked twice before a worker ran: one job

    assert rq_queue.count == 1 and _state(call_id) == "UNKNOWN"
    SimpleWorker([rq_queue], connection=rq_queue.connection).work(burst=True)
    assert _state(call_id) == "COMMITTED"
    assert len([r for r in sandbox.requests(key=key) if r["method"] == "POST"]) == 1


def test_the_periodic_reconcile_job_on_a_real_rq_worker_settles_what_is_due(world, rq_queue):
    call_id, key = _refund_call(world)
    _lose_reply(world, call_id, key, kind="drop_before_commit")

    assert queueing.enqueue_now(jobs.reconcile_due, job_id="reconcile-due")
    SimpleWorker([rq_queue], connection=rq_queue.connection).work(burst=True)

    assert _state(call_id) == "RETRYABLE"
    assert Receipt.objects.get(call_id=call_id).observed == "not_committed"

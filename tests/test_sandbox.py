"""The sandbox provider over real HTTP, against its own subprocess: the contract the product's adapters rely on.

Routes are taken from recovery/fixtures/registry.example.json, so a registry path the sandbox does not serve fails
here rather than in a drill.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

import tests.sandbox as sandbox_fixtures
from tests.sandbox import SANDBOX_CALLBACK_SECRET_FOR_TESTS, SandboxProcess, sandbox_for_tests

# Bound by assignment, not imported: an imported fixture is "redefined" by every test argument of its name (F811).
sandbox = sandbox_fixtures.sandbox
sandbox_process = sandbox_fixtures.sandbox_process

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = json.loads((ROOT / "recovery" / "fixtures" / "registry.example.json").read_text())
TOOLS = {tool["name"]: tool for tool in REGISTRY["tools"]}
WRITE_TOOLS = sorted(name for name, tool in TOOLS.items() if tool["side_effect"] == "write")
READ_TOOLS = sorted(name for name, tool in TOOLS.items() if tool["side_effect"] == "read")

SAMPLE_ARGS: dict[str, dict[str, Any]] = {
    "order.lookup": {"order_id": "O-8848"},
    "order.lookup_replica": {"order_id": "O-8848"},
    "order.create": {"customer_id": "C-7", "items": [{"sku": "sku-1", "quantity": 2}]},
    "order.cancel": {"order_id": "O-100", "reason": "customer asked"},
    "payment.capture": {"order_id": "O-1", "amount_cents": 1200},
    "refund.create": {"order_id": "O-1", "amount_cents": 500},
    "shipment.create": {
        "order_id": "O-1",
        "address": {"line1": "1 Main St", "city": "Lyon", "postcode": "69001", "country": "FR"},
        "service": "standard",
    },
    "access.grant": {"user_id": "U-1", "role": "viewer", "resource": "repo:demo"},
    "access.revoke": {"grant_id": None},  # filled in with a real grant
}
BY_REF_PATHS = {
    "payment.capture": "/payments/{ref}",
    "refund.create": "/refunds/{ref}",
    "shipment.create": "/shipments/{ref}",
    "access.grant": "/access/grants/{ref}",
    "order.cancel": "/cancellations/{ref}",
}
REFUND = {"order_id": "O-1", "amount_cents": 500}


def render(template: Any, args: dict[str, Any]) -> Any:
    """The registry's request templates: "{name}" is the argument itself, other strings are interpolated."""
    if isinstance(template, dict):
        return {name: render(value, args) for name, value in template.items()}
    if isinstance(template, str) and template.startswith("{") and template.endswith("}") and template.count("{") == 1:
        return args.get(template[1:-1])
    if isinstance(template, str):
        return template.format(**args)
    return template


def call_tool(sandbox: SandboxProcess, name: str, key: str | None = None, **overrides: Any) -> requests.Response:
    tool = TOOLS[name]
    args = {**SAMPLE_ARGS[name], **overrides}
    if name == "access.revoke" and args["grant_id"] is None:
        args["grant_id"] = call_tool(sandbox, "access.grant", key=f"{key}-grant").json()["grant_id"]
    request = tool["request"]
    body = render(request["body"], args) if "body" in request else None
    return sandbox.call(request["method"], render(request["path"], args), key=key, json=body)


def status_by_key(sandbox: SandboxProcess, name: str, key: str) -> requests.Response:
    query = TOOLS[name]["status_query"]
    return sandbox.call(query["method"], query["path"].replace("{idempotency_key}", key))


def mapped(name: str, body: dict[str, Any]) -> str:
    query = TOOLS[name]["status_query"]
    return query["status_map"][body[query.get("status_field", "status")]]


def test_it_imports_neither_django_nor_the_product():
    code = (
        "import importlib, pkgutil, sys\n"
        "import recovery.devtools.sandbox as package\n"
        "for module in pkgutil.iter_modules(package.__path__):\n"
        "    importlib.import_module('recovery.devtools.sandbox.' + module.name)\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('django', 'ninja')"
        " or (m.startswith('recovery.') and m != 'recovery.devtools'"
        " and not m.startswith('recovery.devtools.sandbox'))]\n"
        "print(sorted(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("name", WRITE_TOOLS)
def test_it_serves_every_registry_write_and_its_status_by_key(sandbox, name):
    tool = TOOLS[name]
    response = call_tool(sandbox, name, key=f"key-{name}")
    assert response.status_code == 200, response.text
    result = response.json()
    ref = result[tool["provider_ref_field"]]
    assert ref
    for field in tool.get("result_schema", {}).get("required", []):
        assert field in result
    status = status_by_key(sandbox, name, f"key-{name}")
    assert status.status_code == 200
    body = status.json()
    assert mapped(name, body) == "committed"
    assert body[tool["provider_ref_field"]] == ref
    assert body[tool["status_query"].get("effects_field", "effects")] == 1
    assert body["idempotency_key"] == f"key-{name}"
    assert sandbox.ledger(f"key-{name}")["effects"] == 1


@pytest.mark.parametrize("name", WRITE_TOOLS)
def test_it_answers_not_found_for_an_unknown_key(sandbox, name):
    body = status_by_key(sandbox, name, "never-used").json()
    assert body["status"] == "not_found"
    assert mapped(name, body) == "not_committed"
    assert body["effects"] == 0
    assert body[TOOLS[name]["provider_ref_field"]] is None


@pytest.mark.parametrize("name", sorted(BY_REF_PATHS))
def test_it_answers_status_by_provider_reference(sandbox, name):
    ref_field = TOOLS[name]["provider_ref_field"]
    ref = call_tool(sandbox, name, key=f"ref-{name}").json()[ref_field]
    body = sandbox.call("GET", BY_REF_PATHS[name].format(ref=ref)).json()
    assert mapped(name, body) == "committed"
    assert body[ref_field] == ref
    assert body["effects"] == 1
    assert body["idempotency_key"] == f"ref-{name}"
    assert sandbox.call("GET", BY_REF_PATHS[name].format(ref="xx_unknown")).status_code == 404


@pytest.mark.parametrize("name", READ_TOOLS)
def test_it_serves_the_registry_reads(sandbox, name):
    tool = TOOLS[name]
    response = sandbox.call(tool["request"]["method"], render(tool["request"]["path"], SAMPLE_ARGS[name]))
    assert response.status_code == 200
    body = response.json()
    assert set(tool["result_schema"]["required"]) <= set(body)
    assert body["order_id"] == "O-8848"
    age = datetime.now(UTC) - datetime.fromisoformat(body["as_of"])
    assert age.total_seconds() < tool["max_result_age_s"]


def test_it_shows_created_and_cancelled_orders_in_reads(sandbox):
    order_id = call_tool(sandbox, "order.create", key="create-1").json()["order_id"]
    assert sandbox.call("GET", f"/orders/{order_id}").json()["status"] == "open"
    call_tool(sandbox, "order.cancel", key="cancel-1", order_id=order_id)
    assert sandbox.call("GET", f"/orders/{order_id}").json()["status"] == "cancelled"
    assert sandbox.call("GET", "/orders/not-an-order").status_code == 404


def test_it_marks_a_revoked_grant(sandbox):
    grant_id = call_tool(sandbox, "access.grant", key="grant-1").json()["grant_id"]
    assert call_tool(sandbox, "access.revoke", key="revoke-1", grant_id=grant_id).json()["status"] == "revoked"
    assert sandbox.call("GET", f"/access/grants/{grant_id}").json()["revoked"] is True
    missing = call_tool(sandbox, "access.revoke", key="revoke-2", grant_id="gr_missing")
    assert missing.status_code == 404
    assert sandbox.ledger("revoke-2")["effects"] == 0


def test_it_replays_the_same_key_and_body_without_a_second_effect(sandbox):
    first = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    second = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert first.status_code == second.status_code == 200
    assert second.json() == first.json()
    assert second.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert sandbox.ledger("k-1")["effects"] == 1
    assert [r["outcome"] for r in sandbox.requests(key="k-1")] == ["answered", "replayed"]


def test_it_refuses_a_reused_key_with_a_different_body(sandbox):
    sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    response = sandbox.call("POST", "/refunds", key="k-1", json={**REFUND, "amount_cents": 501})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_refuses_a_key_still_in_flight(sandbox):
    sandbox.fault(route="/refunds", kind="latency", ms=1000, times=1)
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(sandbox.call, "POST", "/refunds", key="k-1", json=REFUND)
        time.sleep(0.3)
        racing = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
        assert racing.status_code == 409
        assert racing.json()["error"]["code"] == "idempotency_key_in_flight"
        assert status_by_key(sandbox, "refund.create", "k-1").json()["status"] == "pending"
        assert slow.result().status_code == 200
    assert sandbox.call("POST", "/refunds", key="k-1", json=REFUND).headers["Idempotent-Replayed"] == "true"
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_requires_the_api_key(sandbox):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sandbox-test-key"}):
        response = requests.post(f"{sandbox.url}/refunds", json=REFUND, headers={"Idempotency-Key": "k", **headers})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
    assert requests.get(f"{sandbox.url}/orders/O-1", timeout=5).status_code == 401
    assert requests.get(f"{sandbox.url}/_sandbox/health", timeout=5).json() == {"ok": True}
    assert sandbox.ledger()["effects"] == 0


def test_it_requires_an_idempotency_key_on_writes(sandbox):
    response = sandbox.call("POST", "/refunds", json=REFUND)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "idempotency_key_required"
    assert sandbox.ledger()["effects"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"order_id": "O-1"}, "amount_cents"),
        ({**REFUND, "amount_cents": -5}, "amount_cents"),
        ({"amount_cents": 5}, "order_id"),
    ],
)
def test_it_rejects_invalid_requests_without_an_effect_or_a_record(sandbox, body, field):
    response = sandbox.call("POST", "/refunds", key="k-1", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["field"] == field
    assert sandbox.ledger("k-1")["effects"] == 0
    # Nothing was stored for the key: the repaired request under the same key executes.
    assert sandbox.call("POST", "/refunds", key="k-1", json=REFUND).status_code == 200
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_records_the_effect_when_it_drops_the_reply_after_commit(sandbox):
    sandbox.fault(route="/refunds", kind="commit_then_drop")
    with pytest.raises(requests.ConnectionError):
        sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert sandbox.ledger("k-1")["effects"] == 1
    assert mapped("refund.create", status_by_key(sandbox, "refund.create", "k-1").json()) == "committed"
    assert sandbox.requests(key="k-1")[0]["outcome"] == "dropped_after_commit"
    # A replay with the same key is answered from the record (not dropped: nothing new commits).
    replay = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_executes_nothing_when_it_drops_before_commit(sandbox):
    sandbox.fault(route="/refunds", kind="drop_before_commit", times=1)
    with pytest.raises(requests.ConnectionError):
        sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert sandbox.ledger("k-1")["effects"] == 0
    assert status_by_key(sandbox, "refund.create", "k-1").json()["status"] == "not_found"
    assert sandbox.call("POST", "/refunds", key="k-1", json=REFUND).status_code == 200
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_answers_pending_for_n_checks_then_the_final_status(sandbox):
    sandbox.fault(route="/refunds", kind="pending", checks=2)
    accepted = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert accepted.status_code == 202
    assert accepted.json()["status"] == "pending"
    answers = [status_by_key(sandbox, "refund.create", "k-1").json() for _ in range(3)]
    assert [a["status"] for a in answers] == ["pending", "pending", "succeeded"]
    assert [a["effects"] for a in answers] == [0, 0, 1]
    assert answers[2]["refund_id"] == accepted.json()["refund_id"]
    assert status_by_key(sandbox, "refund.create", "k-1").json()["status"] == "succeeded"
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_can_resolve_a_pending_write_as_failed(sandbox):
    sandbox.fault(route="/access/grants", kind="pending", checks=0, final="failed")
    grant_id = call_tool(sandbox, "access.grant", key="k-1").json()["grant_id"]
    body = sandbox.call("GET", f"/access/grants/{grant_id}").json()
    assert body["status"] == "denied"
    assert mapped("access.grant", body) == "not_committed"
    assert sandbox.ledger("k-1")["effects"] == 0


def test_it_takes_the_status_api_down(sandbox):
    sandbox.fault(route="/refunds", kind="status_down", status=503)
    created = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert created.status_code == 200
    assert status_by_key(sandbox, "refund.create", "k-1").status_code == 503
    assert sandbox.call("GET", f"/refunds/{created.json()['refund_id']}").status_code == 503
    assert status_by_key(sandbox, "payment.capture", "k-1").status_code == 200


def test_it_rate_limits_with_retry_after(sandbox):
    sandbox.fault(route="/orders", kind="rate_limit", retry_after_s=2, times=2)
    answers = [sandbox.call("GET", "/orders/O-1") for _ in range(3)]
    assert [a.status_code for a in answers] == [429, 429, 200]
    assert answers[0].headers["Retry-After"] == "2"
    assert answers[0].json()["error"]["code"] == "rate_limited"
    assert [r["outcome"] for r in sandbox.requests(path_prefix="/orders")] == [
        "rate_limited",
        "rate_limited",
        "answered",
    ]


def test_it_injects_5xx_without_an_effect(sandbox):
    sandbox.fault(route="/refunds", kind="error", status=503, times=1)
    assert sandbox.call("POST", "/refunds", key="k-1", json=REFUND).status_code == 503
    assert sandbox.ledger("k-1")["effects"] == 0
    assert sandbox.call("POST", "/refunds", key="k-1", json=REFUND).status_code == 200
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_mangles_a_read_answer_once_when_asked_for_a_bad_result(sandbox):
    sandbox.fault(route="/orders/O-1", kind="bad_result", drop="status", set={"order_id": "O-2"}, times=1)
    bad = sandbox.call("GET", "/orders/O-1")
    assert bad.status_code == 200
    assert "status" not in bad.json() and bad.json()["order_id"] == "O-2"
    assert "total_cents" in bad.json()  # only the named fields change
    good = sandbox.call("GET", "/orders/O-1").json()
    assert (good["order_id"], good["status"]) == ("O-1", "paid")
    assert sandbox.call("GET", "/orders/O-3").json()["status"] == "paid"  # another route: untouched
    assert [r["outcome"] for r in sandbox.requests(path_prefix="/orders/O-1")] == ["bad_result", "answered"]


def test_it_mangles_a_write_reply_but_keeps_the_effect_and_the_true_record(sandbox):
    sandbox.fault(route="/refunds", key="k-1", kind="bad_result", set={"amount_cents": 1})
    reply = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert reply.status_code == 200 and reply.json()["amount_cents"] == 1
    assert sandbox.ledger("k-1")["effects"] == 1
    # The status API is not mangled, and tells the truth the reply did not.
    status = status_by_key(sandbox, "refund.create", "k-1").json()
    assert (status["status"], status["amount_cents"]) == ("succeeded", 500)
    # A fault on its route with no `times` mangles every 2xx reply, replays included; the record stays true.
    replay = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert replay.headers["Idempotent-Replayed"] == "true" and replay.json()["amount_cents"] == 1
    sandbox.clear_faults()
    assert sandbox.call("POST", "/refunds", key="k-1", json=REFUND).json()["amount_cents"] == 500
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_leaves_error_answers_alone_under_a_bad_result_fault(sandbox):
    sandbox.fault(route="/refunds", kind="bad_result", drop=["refund_id"], times=1)
    sandbox.fault(route="/refunds", kind="error", status=503, times=1)
    assert sandbox.call("POST", "/refunds", key="k-1", json=REFUND).json()["error"]["code"] == "injected_error"
    assert "refund_id" not in sandbox.call("POST", "/refunds", key="k-1", json=REFUND).json()  # still pending
    assert "refund_id" in sandbox.call("POST", "/refunds", key="k-1", json=REFUND).json()


def test_it_adds_injected_latency(sandbox):
    sandbox.fault(route="/orders/O-1", kind="latency", ms=400)
    started = time.monotonic()
    assert sandbox.call("GET", "/orders/O-1").status_code == 200
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    sandbox.call("GET", "/orders/O-2")
    assert time.monotonic() - started < 0.4


def test_it_serves_slow_status_queries_concurrently(sandbox):
    sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    sandbox.fault(route="/refunds/by-key", kind="latency", ms=300)
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: status_by_key(sandbox, "refund.create", "k-1"), range(8)))
    assert all(a.json()["status"] == "succeeded" for a in answers)
    assert time.monotonic() - started < 1.5  # serialized, eight would take 2.4 s


def test_it_executes_every_request_anew_when_it_ignores_keys(sandbox):
    sandbox.fault(route="/refunds", kind="ignore_keys")
    first = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    second = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert first.json()["refund_id"] != second.json()["refund_id"]
    assert "Idempotent-Replayed" not in second.headers
    assert sandbox.ledger("k-1")["effects"] == 2
    assert status_by_key(sandbox, "refund.create", "k-1").json()["effects"] == 2


def test_it_applies_a_fault_only_as_many_times_as_asked(sandbox):
    sandbox.fault(route="/refunds", kind="error", status=500, times=1, key="k-2")
    assert sandbox.call("POST", "/refunds", key="k-1", json=REFUND).status_code == 200  # another key: untouched
    assert sandbox.call("POST", "/refunds", key="k-2", json=REFUND).status_code == 500
    assert sandbox.call("POST", "/refunds", key="k-2", json=REFUND).status_code == 200
    assert sandbox.faults() == []


def test_it_refuses_a_malformed_fault(sandbox):
    for spec in (
        {"route": "/refunds", "kind": "nope"},
        {"route": "refunds", "kind": "latency", "ms": 5},
        {"route": "/x", "kind": "latency"},
        {"route": "/orders", "kind": "bad_result"},
        {"route": "/orders", "kind": "bad_result", "drop": [1]},
        {"route": "/orders", "kind": "bad_result", "set": ["status"]},
    ):
        response = requests.post(f"{sandbox.url}/_sandbox/faults", json=spec, timeout=5)
        assert response.status_code == 400
    assert sandbox.faults() == []


def test_it_logs_every_request_with_microsecond_times(sandbox):
    sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    sandbox.call("GET", "/refunds/by-key/k-1")
    sandbox.call("GET", "/orders/O-1")
    sandbox.ledger()
    log = sandbox.requests()
    assert [(r["method"], r["path"], r["key"], r["status"]) for r in log] == [
        ("POST", "/refunds", "k-1", 200),
        ("GET", "/refunds/by-key/k-1", "k-1", 200),
        ("GET", "/orders/O-1", None, 200),
    ]
    times = [datetime.fromisoformat(r["at"]) for r in log]
    assert times == sorted(times)
    assert all(len(r["at"].split(".")[1]) == len("123456Z") for r in log)
    assert len(sandbox.requests(path_prefix="/refunds")) == 2
    assert len(sandbox.requests(key="k-1")) == 2


def test_it_resets_everything(sandbox):
    sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    sandbox.fault(route="/refunds", kind="error")
    sandbox.reset()
    assert sandbox.ledger() == {"effects": 0, "by_key": {}, "entries": []}
    assert sandbox.requests() == [] and sandbox.faults() == []
    assert status_by_key(sandbox, "refund.create", "k-1").json()["status"] == "not_found"


class Receiver:
    """A callback receiver: a tiny HTTP server that records what it is sent."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.deliveries.append((dict(self.headers), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/callbacks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 10) -> list[tuple[dict[str, str], bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.deliveries) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.deliveries


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


def verify(headers: dict[str, str], body: bytes) -> None:
    parts = dict(part.split("=", 1) for part in headers["Recovery-Signature"].split(","))
    expected = hmac.new(
        SANDBOX_CALLBACK_SECRET_FOR_TESTS.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256
    ).hexdigest()
    assert hmac.compare_digest(parts["v1"], expected)
    assert abs(time.time() - int(parts["t"])) < 300


def test_it_sends_signed_callbacks(sandbox, receiver):
    sandbox.configure(callback_url=receiver.url)
    refund_id = sandbox.call("POST", "/refunds", key="k-1", json=REFUND).json()["refund_id"]
    [(headers, body)] = receiver.wait_for(1)
    verify(headers, body)
    event = json.loads(body)
    assert event["event_id"].startswith("evt_")
    assert event["type"] == "refunds.succeeded"
    assert (event["idempotency_key"], event["status"], event["provider_ref"], event["effects"]) == (
        "k-1", "succeeded", refund_id, 1,
    )  # fmt: skip
    datetime.fromisoformat(event["occurred_at"])
    time.sleep(0.2)
    [logged] = sandbox.callbacks()
    assert (logged["event_id"], logged["url"], logged["status"]) == (event["event_id"], receiver.url, 200)


def test_it_calls_back_when_a_pending_write_resolves(sandbox, receiver):
    sandbox.configure(callback_url=receiver.url)
    sandbox.fault(route="/refunds", kind="pending", checks=1)
    sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    time.sleep(0.3)
    assert receiver.deliveries == []
    status_by_key(sandbox, "refund.create", "k-1")
    status_by_key(sandbox, "refund.create", "k-1")
    [(_, body)] = receiver.wait_for(1)
    assert json.loads(body)["status"] == "succeeded"
    assert json.loads(body)["effects"] == 1


def test_it_duplicates_callbacks_with_one_event_id(sandbox, receiver):
    sandbox.configure(callback_url=receiver.url)
    sandbox.fault(route="/refunds", kind="duplicate_callbacks", copies=3)
    sandbox.fault(route="/refunds", kind="commit_then_drop")
    with pytest.raises(requests.ConnectionError):
        sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    deliveries = receiver.wait_for(3)
    time.sleep(0.2)
    assert len(deliveries) == 3
    assert len({body for _, body in deliveries}) == 1
    assert len({headers["Recovery-Signature"] for headers, _ in deliveries}) == 1
    verify(*deliveries[0])
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_holds_back_the_callbacks_of_a_key_when_asked(sandbox, receiver):
    sandbox.configure(callback_url=receiver.url)
    sandbox.fault(route="/refunds", key="k-1", kind="delayed_callbacks", ms=700)
    sandbox.fault(route="/refunds", key="k-1", kind="commit_then_drop")
    with pytest.raises(requests.ConnectionError):
        sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    sandbox.call("POST", "/refunds", key="k-2", json=REFUND)  # another key: called back at once
    [(_, first)] = receiver.wait_for(1)
    assert json.loads(first)["idempotency_key"] == "k-2"
    time.sleep(0.3)
    assert len(receiver.deliveries) == 1  # k-1 committed, its callback still held back
    [_, (headers, late)] = receiver.wait_for(2)
    verify(headers, late)
    assert (json.loads(late)["idempotency_key"], json.loads(late)["status"]) == ("k-1", "succeeded")


def test_it_drops_held_back_callbacks_when_the_faults_are_cleared(sandbox, receiver):
    sandbox.configure(callback_url=receiver.url)
    sandbox.fault(route="/refunds", kind="delayed_callbacks", ms=300)
    sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    sandbox.clear_faults()
    time.sleep(0.6)
    assert receiver.deliveries == []


def test_it_sends_no_callbacks_without_a_url(sandbox):
    sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    time.sleep(0.2)
    assert sandbox.callbacks() == []


def test_it_keeps_the_ledger_across_a_restart(sandbox):
    refund_id = sandbox.call("POST", "/refunds", key="k-1", json=REFUND).json()["refund_id"]
    url = sandbox.url
    sandbox.restart()
    assert sandbox.url == url
    assert sandbox.ledger("k-1")["effects"] == 1
    assert status_by_key(sandbox, "refund.create", "k-1").json()["refund_id"] == refund_id
    replay = sandbox.call("POST", "/refunds", key="k-1", json=REFUND)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert sandbox.ledger("k-1")["effects"] == 1


def test_it_serves_without_an_api_key_when_none_is_configured(tmp_path):
    process = sandbox_for_tests(tmp_path / "open.sqlite3", api_key=None).start()
    try:
        assert requests.get(f"{process.url}/orders/O-1", timeout=5).status_code == 200
    finally:
        process.stop()
    assert process.process is None


def test_a_body_nested_a_thousand_levels_deep_is_a_400_not_a_crash(sandbox):
    deep = ('{"order_id": "O-1", "amount_cents": 5, "x": ' + "[" * 1000 + "]" * 1000 + "}").encode()
    headers = sandbox.headers("k-deep") | {"Content-Type": "application/json"}
    response = requests.post(sandbox.url + "/refunds", data=deep, headers=headers, timeout=10)
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_request")
    assert sandbox.ledger("k-deep")["effects"] == 0

import json
import pytest
import requests
from tests.test_api_fuzz import world, World  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_probe(world):
    s = requests.Session()
    s.headers.update(world.auth | {"Content-Type": "application/json"})
    u = world.url + "/api/v1"
    T = {"tenant": "acme", "agent": "a", "goal": "g"}
    n = iter(range(1000))
    def post(path, body, raw=False):
        data = body if raw else json.dumps(body)
        r = s.post(u + path, data=data.encode() if isinstance(data, str) else data, timeout=10)
        return r.status_code, r.text[:160]
    def call(args, tool="order.lookup"):
        return post(f"/tasks/{world.task_id}/calls", {"step": 5, "tool": tool, "arguments": args, "idempotency_key": f"p{next(n)}"})
    probes = {
        "task goal NUL": lambda: post("/tasks", T | {"external_id": f"x{next(n)}", "goal": "a\x00b"}),
        "task ext NUL": lambda: post("/tasks", T | {"external_id": "x\x00"}),
        "task tenant NUL": lambda: post("/tasks", T | {"tenant": "ac\x00me", "external_id": "y"}),
        "find ext NUL": lambda: (lambda r: (r.status_code, r.text[:100]))(s.get(u + "/tasks", params={"tenant": "acme", "external_id": "a\x00"})),
        "find tenant NUL": lambda: (lambda r: (r.status_code, r.text[:100]))(s.get(u + "/capabilities", params={"tenant": "a\x00"})),
        "token_budget huge": lambda: post("/tasks", T | {"external_id": f"x{next(n)}", "budget": {"token_budget": 2**40}}),
        "token_budget 2**70": lambda: post("/tasks", T | {"external_id": f"x{next(n)}", "budget": {"token_budget": 2**70}}),
        "deadline 9999-": lambda: post("/tasks", T | {"external_id": f"x{next(n)}", "budget": {"deadline": "9999-12-31T23:59:59-05:00"}}),
        "deadline 0001+": lambda: post("/tasks", T | {"external_id": f"x{next(n)}", "budget": {"deadline": "0001-01-01T00:00:00+05:00"}}),
        "args NUL value": lambda: call({"order_id": "a\x00"}),
        "args NUL key": lambda: call({"order_id": "a", "\x00": 1}),
        "args NaN": lambda: post(f"/tasks/{world.task_id}/calls", '{"step": 5, "tool": "order.lookup", "arguments": {"order_id": NaN}, "idempotency_key": "nan"}', raw=True),
        "args Infinity": lambda: post(f"/tasks/{world.task_id}/calls", '{"step": 5, "tool": "order.lookup", "arguments": {"order_id": Infinity}, "idempotency_key": "inf"}', raw=True),
        "args surrogate": lambda: post(f"/tasks/{world.task_id}/calls", '{"step": 5, "tool": "order.lookup", "arguments": {"order_id": "\\ud800"}, "idempotency_key": "sur"}', raw=True),
        "key surrogate": lambda: post(f"/tasks/{world.task_id}/calls", '{"step": 5, "tool": "order.lookup", "arguments": {"order_id": "x"}, "idempotency_key": "\\ud800"}', raw=True),
        "goal surrogate": lambda: post("/tasks", '{"tenant": "acme", "agent": "a", "goal": "\\udfff", "external_id": "sur"}', raw=True),
        "args bigint": lambda: call({"order_id": "a", "amount_cents": 10**30}),
        "args huge digits": lambda: post(f"/tasks/{world.task_id}/calls", '{"step": 5, "tool": "order.lookup", "arguments": {"order_id": ' + "9" * 5000 + '}, "idempotency_key": "big"}', raw=True),
        "deep nest": lambda: post(f"/tasks/{world.task_id}/calls", '{"step": 5, "tool": "order.lookup", "arguments": {"order_id": ' + "[" * 100000 + "]" * 100000 + '}, "idempotency_key": "deep"}', raw=True),
        "deep nest 900": lambda: call({"order_id": json.loads("[" * 900 + "]" * 900)}),
        "cred huge": lambda: post(f"/calls/{world.ready_call}/gate", {"attempt_id": "g1", "credential_version": 2**40}),
        "attempt cred huge": lambda: post(f"/calls/{world.ready_call}/attempts", {"attempt_id": "c1", "credential_version": 2**40}),
        "attempt cred 2**70": lambda: post(f"/calls/{world.ready_call}/attempts", {"attempt_id": "c2", "credential_version": 2**70}),
        "attempt args NUL": lambda: post(f"/calls/{world.ready_call}/attempts", {"attempt_id": "c3", "arguments": {"order_id": "\x00"}, "evidence": ["args_changed"]}),
        "gate args NUL": lambda: post(f"/calls/{world.ready_call}/gate", {"attempt_id": "g\x01", "arguments": {"order_id": "\x00"}}),
        "outcome started 0001+": lambda: post(f"/calls/{world.sent_call}/attempts/a1/outcome", {"http_status": 200, "result": {"status": "ok"}, "started_at": "0001-01-01T00:00:00+05:00"}),
        "complete NUL": lambda: post(f"/tasks/{world.task_id}/complete", {"summary": "s\x00", "deliverable": {"a\x00": "\x00"}}),
        "abandon NUL": lambda: post(f"/calls/{world.ready_call}/abandon", {"reason": "r\x00"}),
        "task abandon NUL": lambda: post(f"/tasks/{world.task_id}/abandon", {"reason": "r\x00"}),
        "task id huge": lambda: (lambda r: (r.status_code, r.text[:100]))(s.get(u + f"/tasks/{2**70}")),
        "task id 2**40": lambda: (lambda r: (r.status_code, r.text[:100]))(s.get(u + f"/tasks/{2**40}")),
        "call id huge": lambda: post(f"/calls/{2**70}/gate", {"attempt_id": "x"}),
        "tenant latin": lambda: (lambda r: (r.status_code, r.text[:100]))(s.get(u + "/capabilities", params={"tenant": "é" * 70})),
    }
    for name, fn in probes.items():
        try:
            print("PROBE", name, *fn())
        except Exception as e:
            print("PROBE", name, "EXC", repr(e)[:200])

"""Schema-driven fuzzing of the machine API (SPEC §19 "Bad input"): schemathesis over the served OpenAPI document.

Each operation of /api/v1/openapi.json gets its own test, run through Django's live server with a valid bearer
token, against data created for it first (a task, a READY call, a call with an admitted attempt); the path
parameters are pinned to those ids. Schemathesis generates schema-valid (positive) and schema-invalid (negative)
requests; every answer must be a non-5xx that conforms to the document, schema-invalid requests must be refused
with a 4xx, and each operation must have answered at least one 2xx by the end of its run. Generation is
derandomized and bounded (MAX_EXAMPLES per operation), so a run is deterministic and CI-sized.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.hooks import HookDispatcher, HookScope
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from recovery.audit import Actor
from recovery.client import RecoveryClient
from recovery.registry import load_registry
from recovery.services.tokens import token_create

pytestmark = pytest.mark.django_db(transaction=True)

MAX_EXAMPLES = 40

# Every operation of the served document; test_every_served_operation_is_fuzzed keeps this list complete.
OPERATIONS = [
    "POST /api/v1/tasks",
    "GET /api/v1/tasks",
    "GET /api/v1/tasks/{task_id}",
    "POST /api/v1/tasks/{task_id}/complete",
    "POST /api/v1/tasks/{task_id}/abandon",
    "POST /api/v1/tasks/{task_id}/calls",
    "GET /api/v1/calls/{call_id}",
    "POST /api/v1/calls/{call_id}/abandon",
    "POST /api/v1/calls/{call_id}/gate",
    "POST /api/v1/calls/{call_id}/attempts",
    "POST /api/v1/calls/{call_id}/attempts/{attempt_id}/outcome",
    "GET /api/v1/capabilities",
]

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
]

ARGS = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer", "minimum": 1}},
    "required": ["order_id"],
    "additionalProperties": False,
}
TOOLS = ["refund.create", "order.lookup"]
REGISTRY = {
    "tenants": [{"name": "acme", "tools": "*"}, {"name": "other", "tools": ["order.lookup"]}],
    "providers": [{"name": "shop", "base_url": "http://127.0.0.1:9"}],
    "tools": [
        {
            "name": "refund.create",
            "provider": "shop",
            "side_effect": "write",
            "risk": "high",
            "request": {"method": "POST", "path": "/refunds"},
            "args_schema": ARGS,
            "provider_ref_field": "refund_id",
            "required_result_fields": ["refund_id"],
            "status_query": {"method": "GET", "path": "/status/{idempotency_key}", "status_map": {"ok": "committed"}},
            "budgets": {"max_attempts": 3},
        },
        {
            "name": "order.lookup",
            "provider": "shop",
            "side_effect": "read",
            "request": {"method": "GET", "path": "/orders"},
            "args_schema": ARGS,
            "required_result_fields": ["status"],
            "budgets": {"max_attempts": 3},
        },
    ],
}


@dataclass(frozen=True)
class World:
    """What the fuzzed operations need to exist: a token, a task, a READY call, a SENT call with attempt a1."""

    url: str
    token: str
    tenant: str
    task_id: int
    external_id: str
    ready_call: int
    sent_call: int
    attempt_id: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def path_parameters(self, path: str) -> dict:
        """Pin the path parameters to existing objects: an outcome goes to the call that has the attempt."""
        pins: dict = {}
        if "{task_id}" in path:
            pins["task_id"] = self.task_id
        if "{call_id}" in path:
            pins["call_id"] = self.sent_call if "{attempt_id}" in path else self.ready_call
        if "{attempt_id}" in path:
            pins["attempt_id"] = self.attempt_id
        return pins


@pytest.fixture
def world(live_server) -> World:
    load_registry(REGISTRY, actor=Actor.system("tests"))
    _, token = token_create(name="fuzzer", tenants=["acme"], actor=Actor.system("tests"))
    client = RecoveryClient(live_server.url, token)
    task = client.create_task("acme", "fuzz-task", agent="fuzzer", goal="refund order O-1")
    ready = client.add_call(
        task.id, step=1, tool="refund.create", arguments={"order_id": "O-1"}, idempotency_key="k-ready"
    )
    sent = client.add_call(task.id, step=2, tool="order.lookup", arguments={"order_id": "O-1"}, idempotency_key="k-sent")
    client.admit(sent.call_id, "a1")
    return World(
        url=live_server.url,
        token=token,
        tenant="acme",
        task_id=task.id,
        external_id="fuzz-task",
        ready_call=ready.call_id,
        sent_call=sent.call_id,
        attempt_id="a1",
    )


def known_values(world: World) -> HookDispatcher:
    """Positive cases only: mix the values an operation can succeed with (the token's tenant, an existing task's
    external id, a registered tool) into the generated ones, which a fuzzer would otherwise never guess."""
    hooks = HookDispatcher(scope=HookScope.TEST)

    def flatmap_query(context, query):
        if not isinstance(query, dict) or "tenant" not in query:
            return st.just(query)
        known = {"tenant": world.tenant} | ({"external_id": world.external_id} if "external_id" in query else {})
        return st.sampled_from([query, query | known])

    def flatmap_body(context, body):
        if not isinstance(body, dict):
            return st.just(body)
        if "tenant" in body:
            return st.sampled_from([body, body | {"tenant": world.tenant}])
        if "tool" in body:
            return st.sampled_from([body, *(body | {"tool": tool} for tool in TOOLS)])
        return st.just(body)

    hooks.register_hook_with_name(flatmap_query, "flatmap_query")
    hooks.register_hook_with_name(flatmap_body, "flatmap_body")
    return hooks


@pytest.fixture
def api_schema(world):
    schema = schemathesis.openapi.from_url(f"{world.url}/api/v1/openapi.json")
    # The token is sent explicitly with every request; no generated Authorization headers.
    schema.config.generation.update(with_security_parameters=False)
    return schema


@pytest.mark.parametrize("label", OPERATIONS)
def test_fuzzing_finds_no_server_error_and_reaches_a_2xx(label, api_schema, world):
    operation = api_schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is not in the served OpenAPI document"
    pins = world.path_parameters(operation.path)
    strategy = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE, path_parameters=pins, hooks=known_values(world)),
        operation.as_strategy(GenerationMode.NEGATIVE, path_parameters=pins),
    )
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def fuzz(case):
        response = case.call_and_validate(base_url=world.url, headers=world.auth, checks=CHECKS)
        statuses[response.status_code] += 1
        import os
        if os.environ.get('FUZZ_DEBUG'): print('CASE', case.meta.generation.mode if case.meta else None, case.query, repr(case.body)[:300], response.status_code, response.text[:200])

    fuzz()
    print('\nSTATUS', label, dict(statuses))
    assert any(200 <= status < 300 for status in statuses), f"{label} never answered a 2xx: {dict(statuses)}"


def test_every_served_operation_is_fuzzed(world):
    document = requests.get(f"{world.url}/api/v1/openapi.json", timeout=5).json()
    served = {f"{method.upper()} {path}" for path, methods in document["paths"].items() for method in methods}
    assert served == set(OPERATIONS)

"""The `otlp` benchmark: OpenTelemetry `execute_tool` spans ingested per second (in-process, and through the whole
stack) beside single-shot attempts per second for the same intents, in one run. The series: docs/benchmarks.md; the
figures: docs/otlp-ingest.md ("Cost").
"""

from __future__ import annotations

import gzip
import itertools
import time
from contextlib import nullcontext

from django.conf import settings
from django.db import connection
from django.test import Client, override_settings
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from recovery.api import otlp_decode as otlp
from recovery.audit.chain import Actor
from recovery.registry import load_registry
from recovery.services import tasks
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.calls import call_add
from recovery.services.observed import spans_ingest
from recovery.services.outcomes import facts_of
from recovery.services.tokens import token_create
from recovery.statemachine.hot_path import call_for_attempt

BATCH = 50  # spans per export request (the SDK's BatchSpanProcessor sends up to 512)
NEVER_OPENS = {"min_calls": 1_000_000}
REGISTRY = {
    "tenants": [{"name": "bench-otlp", "tools": "*"}],
    "providers": [{"name": "bench-otlp", "base_url": "http://127.0.0.1:9"}],
    "tools": [
        {
            "name": "bench.refund",
            "provider": "bench-otlp",
            "side_effect": "write",
            "request": {"method": "POST", "path": "/refunds"},
            "args_schema": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer", "minimum": 1}},
                "required": ["order_id", "amount_cents"],
            },
            "status_query": {
                "method": "GET",
                "path": "/refunds/by-key/{idempotency_key}",
                "status_map": {"succeeded": "committed"},
            },
            "provider_ref_field": "refund_id",
            "required_result_fields": ["refund_id"],
            "breaker": NEVER_OPENS,
        }
    ],
}
ACTOR = Actor.system("bench")
_ids = itertools.count(1)


def _result(n: int) -> dict:
    return {"refund_id": f"re_{n}", "status": "succeeded"}


def _request(count: int) -> ExportTraceServiceRequest:
    """`count` execute_tool spans, each of a trace of its own, as an exporter would send them."""
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add()
    scope.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="bench-agent")))
    spans = scope.scope_spans.add()
    now = time.time_ns()
    for _ in range(count):
        n = next(_ids)
        span = spans.spans.add(
            trace_id=n.to_bytes(16, "big"),
            span_id=n.to_bytes(8, "big"),
            name="execute_tool bench.refund",
            start_time_unix_nano=now,
            end_time_unix_nano=now + 1_000_000,
        )
        for key, value in (
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", "bench.refund"),
            ("gen_ai.tool.call.arguments", f'{{"order_id": "O-{n}", "amount_cents": {n}}}'),
            ("gen_ai.tool.call.result", f'{{"refund_id": "re_{n}", "status": "succeeded"}}'),
            ("recovery.idempotency_key", f"bench-span-{n}"),
        ):
            span.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
        span.attributes.append(KeyValue(key="http.response.status_code", value=AnyValue(int_value=200)))
    return request


class _Statements:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def _single_shots(tenant, count: int, counter: _Statements | None = None) -> float:
    """Single shots on fresh READY calls made beforehand (not timed), as the ingest benchmark makes them."""
    made = []
    for _ in range(count):
        n = next(_ids)
        task, _ = tasks.task_create(
            tenant=tenant, external_id=f"bench-ss-{n}", agent="bench-agent", goal="bench", budget={}, actor=ACTOR
        )
        added = call_add(
            task=task,
            step_index=1,
            depends_on=[],
            tool_name="bench.refund",
            arguments={"order_id": f"O-{n}", "amount_cents": n},
            idempotency_key=f"bench-ss-{n}",
            actor=ACTOR,
        )
        outcome = facts_of({"http_status": 200, "connection_opened": True, "sent": True, "result": _result(n)})
        made.append((added.call.pk, AttemptRequest(attempt_id="a1", outcome=outcome)))
    tenant_ids = [tenant.pk]
    with connection.execute_wrapper(counter) if counter else nullcontext():
        start = time.perf_counter()
        for call_id, request in made:
            call, read = call_for_attempt(call_id, tenant_ids, attempt_id=request.attempt_id)
            admission = attempt_admit(call=call, read=read, request=request, actor=ACTOR)
            assert admission.response["call_state"] == "COMMITTED", admission.response
        return time.perf_counter() - start


def _spans(tenant, count: int) -> float:
    requests = [_request(BATCH).SerializeToString() for _ in range(count // BATCH)]
    start = time.perf_counter()
    for body in requests:
        batch = otlp.read_spans(otlp.decode(body, otlp.MEDIA_PROTOBUF))
        report = spans_ingest(batch=batch, tenants=[tenant], actor=ACTOR)
        assert report.outcomes["recorded"] == BATCH and not report.rejected, report.message()
    return time.perf_counter() - start


def _spans_http(token: str, count: int) -> float:
    with override_settings(ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"]):  # the test client's host
        return _post_spans(token, count)


def _post_spans(token: str, count: int) -> float:
    client = Client()
    bodies = [gzip.compress(_request(BATCH).SerializeToString()) for _ in range(count // BATCH)]
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", "HTTP_CONTENT_ENCODING": "gzip"}
    start = time.perf_counter()
    for body in bodies:
        answer = client.post("/api/v1/otlp/v1/traces", body, content_type=otlp.MEDIA_PROTOBUF, **headers)
        assert answer.status_code == 200 and answer.content == b"", answer.content
    return time.perf_counter() - start


def bench_otlp(count: int = 1000) -> dict:
    count = max(BATCH, count // BATCH * BATCH)
    load_registry(REGISTRY, actor=ACTOR)
    from recovery.models import Tenant

    tenant = Tenant.objects.get(name="bench-otlp")
    _, token = token_create(name="bench-otlp", tenants=[tenant.name], actor=ACTOR)
    _single_shots(tenant, 20), _spans(tenant, BATCH)  # warm both paths
    single = _single_shots(tenant, count)
    spans = _spans(tenant, count)
    http = _spans_http(token, count)
    per_shot, per_span = _Statements(), _Statements()
    _single_shots(tenant, 10, per_shot)
    with connection.execute_wrapper(per_span):
        _spans(tenant, BATCH)
    return {
        "benchmark": "otlp",
        "database": connection.vendor,
        "count": count,
        "batch": BATCH,
        "single_shots_per_s": round(count / single, 1),
        "spans_per_s": round(count / spans, 1),
        "spans_http_per_s": round(count / http, 1),
        "ratio_spans_to_single_shots": round(single / spans, 2),  # spans per s / single shots per s
        "statements_per_single_shot": round(per_shot.count / 10, 1),
        "statements_per_span": round(per_span.count / BATCH, 1),
    }

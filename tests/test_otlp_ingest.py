"""OpenTelemetry trace ingest (docs/otlp-ingest.md; docs/otlp-ingest.md) from the real OpenTelemetry SDK and its
OTLP/HTTP exporter, against the live server, with a runtime that calls the real sandbox provider and never asks for
admission.

The runtime (`Agent`) sends each tool call with `requests` and records it as a GenAI `execute_tool` span, the way the
OpenTelemetry GenAI conventions describe; the spans are collected in memory and exported by `OTLPSpanExporter` (the
exporter deployments use) or, where a test needs to read the answer or send OTLP/JSON, encoded by the SDK's own OTLP
encoder and posted as they are. What the tests check is what a person sees: the calls, their states, the receipts
that settled them, the sandbox's own ledger, the OTLP answer, and what was not stored.
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import threading
import time
from dataclasses import dataclass, field

import pytest
import requests
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from recovery.audit.chain import Actor
from recovery.models import (
    Attempt,
    Call,
    GateDecision,
    ObservedSpan,
    ObservedTally,
    ObservedTool,
    Receipt,
    Task,
)
from recovery.registry import load_registry
from recovery.services.tokens import token_create
from tests import test_action_services as base
from tests.sandbox import sandbox_registry

held_jobs = base.held_jobs

pytestmark = pytest.mark.django_db(transaction=True)

API_KEY = base.API_KEY
REFUND = {"order_id": "O-8848", "amount_cents": 1250}
PROTOBUF, JSON = "application/x-protobuf", "application/json"
_n = itertools.count(1)


# --- the runtime: real spans of real tool calls ----------------------------------------------------------------------


@dataclass
class Agent:
    """A runtime that calls the sandbox without admission and traces each tool call with the OpenTelemetry SDK."""

    sandbox: object
    service: str = "refund-agent"
    tenant: str | None = "demo"
    spans: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)

    def __post_init__(self) -> None:
        resource = {"service.name": self.service}
        if self.tenant is not None:
            resource["recovery.tenant"] = self.tenant
        self.provider = TracerProvider(resource=Resource.create(resource))
        self.provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = self.provider.get_tracer("tests.agent")

    def run(self, name: str = "invoke_agent refunds"):
        """A trace: the agent's own span (not a tool call), under which the tool calls are made."""
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": self.service}
        return self.tracer.start_as_current_span(name, attributes=attributes)

    def tool(self, name: str, method: str, path: str, *, arguments=None, key=None, timeout=(2, 3), **extra):
        """Send one tool call to the sandbox inside an execute_tool span: what was sent, and what came back."""
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        attributes["gen_ai.tool.call.id"] = f"call_{next(_n)}"
        if arguments is not None:
            attributes["gen_ai.tool.call.arguments"] = json.dumps(arguments)
        if key is not None:
            attributes["recovery.idempotency_key"] = key
        attributes.update(extra)
        headers = {"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": key or f"agent-{next(_n)}"}
        with self.tracer.start_as_current_span(f"execute_tool {name}", attributes=attributes) as span:
            try:
                reply = requests.request(
                    method, self.sandbox.url + path, json=arguments, headers=headers, timeout=timeout
                )
            except requests.RequestException as exc:
                span.set_attribute("error.type", f"{type(exc).__module__}.{type(exc).__qualname__}")
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                return None
            span.set_attribute("http.response.status_code", reply.status_code)
            span.set_attribute("gen_ai.tool.call.result", reply.text)
            if reply.status_code >= 400:
                span.set_attribute("error.type", str(reply.status_code))
                span.set_status(Status(StatusCode.ERROR))
            return reply

    def refund(self, *, key=None, arguments=REFUND, **extra):
        return self.tool("refund.create", "POST", "/refunds", arguments=arguments, key=key, **extra)

    def lookup(self, order_id: str = "O-8848"):
        return self.tool("order.lookup", "GET", f"/orders/{order_id}", arguments={"order_id": order_id})

    def finished(self) -> list:
        """The spans ended so far (and forgets them): what the next export sends."""
        spans = list(self.spans.get_finished_spans())
        self.spans.clear()
        return spans


@pytest.fixture
def world(sandbox, live_server, monkeypatch, held_jobs):
    monkeypatch.setenv("SANDBOX_API_KEY", API_KEY)
    registry = sandbox_registry(sandbox.url)
    registry["tenants"].append({"name": "other", "tools": "*"})
    load_registry(registry, actor=Actor.system("tests"))
    _, token = token_create(name="otel", tenants=["demo"], actor=Actor.system("tests"))
    _, other = token_create(name="otel-other", tenants=["other"], actor=Actor.system("tests"))
    return World(url=live_server.url, token=token, other=other, sandbox=sandbox, jobs=held_jobs)


@dataclass
class World:
    url: str
    token: str
    other: str
    sandbox: object
    jobs: object

    @property
    def endpoint(self) -> str:
        return f"{self.url}/api/v1/otlp/v1/traces"

    def agent(self, **kwargs) -> Agent:
        return Agent(self.sandbox, **kwargs)

    def export(self, spans, *, token=None, compression=None) -> tuple[SpanExportResult, list[requests.Response]]:
        """The real OTLP/HTTP exporter's export of `spans`, and the answers it got (read through its session)."""
        session, answers = requests.Session(), []
        session.hooks["response"].append(lambda reply, *args, **kwargs: answers.append(reply))
        exporter = OTLPSpanExporter(
            endpoint=self.endpoint,
            headers={"Authorization": f"Bearer {token or self.token}"},
            compression=compression,
            session=session,
            timeout=10,
        )
        try:
            return exporter.export(spans), answers
        finally:
            exporter.shutdown()
            session.close()  # the live server's thread keeps its database connection while ours is open

    def post(self, body: bytes, media: str = PROTOBUF, *, token=None, **headers) -> requests.Response:
        headers = {"Authorization": f"Bearer {token or self.token}", "Content-Type": media, **headers}
        return requests.post(self.endpoint, data=body, headers=headers, timeout=10)


def protobuf_of(spans) -> bytes:
    """The body the exporter sends for `spans`: the SDK's own OTLP encoding."""
    return encode_spans(spans).SerializeToString()


def json_of(spans) -> bytes:
    """The same spans in OTLP/JSON as the specification writes it: lowerCamelCase, ids in hex, enums as numbers."""
    data = json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource in data["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for name in ("traceId", "spanId", "parentSpanId"):
                    if name in span:
                        span[name] = base64.b64decode(span[name]).hex()
    return json.dumps(data).encode()


def partial(reply: requests.Response) -> tuple[int, str]:
    """The OTLP answer's partial_success: (rejected spans, message), read in the encoding the answer came in."""
    assert reply.status_code == 200, reply.text
    if reply.headers["Content-Type"].startswith(PROTOBUF):
        answer = ExportTraceServiceResponse.FromString(reply.content)
        return answer.partial_success.rejected_spans, answer.partial_success.error_message
    body = reply.json().get("partialSuccess", {})
    return int(body.get("rejectedSpans", 0)), body.get("errorMessage", "")


def trace_of(span) -> str:
    return f"{span.context.trace_id:032x}"


def calls_of(trace_id: str) -> list[Call]:
    return list(Call.objects.filter(task__external_id=trace_id).select_related("tool", "task").order_by("pk"))


def states(trace_id: str) -> list[tuple[str, str]]:
    return [(c.tool.name, c.state) for c in calls_of(trace_id)]


def nothing_stored() -> bool:
    return not (Task.objects.exists() or Call.objects.exists() or ObservedSpan.objects.exists())


# --- a runtime's tool calls become observed calls --------------------------------------------------------------------


def test_it_records_a_read_and_a_committed_write_as_observed_calls(world):
    agent = world.agent()
    with agent.run():
        assert agent.lookup().status_code == 200
        assert agent.refund(key="refund-8848").status_code == 200
    spans = agent.finished()

    result, answers = world.export(spans, compression=Compression.Gzip)

    assert result == SpanExportResult.SUCCESS
    assert answers[0].request.headers["Content-Encoding"] == "gzip"
    assert partial(answers[0]) == (0, "1 span without gen_ai.operation.name execute_tool counted and ignored")
    trace = trace_of(spans[0])
    task = Task.objects.get(external_id=trace)
    assert (task.tenant.name, task.agent) == ("demo", "refund-agent")
    lookup, refund = calls_of(trace)
    assert [(c.tool.name, c.state, c.observed) for c in (lookup, refund)] == [
        ("order.lookup", "COMMITTED", True),
        ("refund.create", "COMMITTED", True),
    ]
    assert refund.idempotency_key == "refund-8848" and refund.arguments == REFUND and refund.provider_ref
    attempt = Attempt.objects.get(call=refund)
    assert not attempt.policy_bypassed and attempt.http_status == 200
    gate = GateDecision.objects.get(call=refund)
    assert (gate.allowed, gate.reason, gate.attempt_id) == (True, "first_attempt", attempt.pk)  # what admission said
    receipt = Receipt.objects.get(call=refund)
    assert (receipt.source, receipt.observed, receipt.provider_ref) == ("runtime", "committed", refund.provider_ref)
    rows = ObservedSpan.objects.order_by("started_at")
    assert [(r.tool_name, r.outcome, r.call_id) for r in rows] == [
        ("order.lookup", "recorded", lookup.pk),
        ("refund.create", "recorded", refund.pk),
    ]
    assert world.sandbox.ledger("refund-8848")["effects"] == 1


def test_a_write_that_timed_out_after_send_turns_unknown_and_is_settled_by_a_receipt(world):
    agent = world.agent()
    world.sandbox.fault(route="/refunds", key="refund-slow", kind="latency", ms=1500, times=1)
    with agent.run():
        assert agent.refund(key="refund-slow", timeout=(2, 0.5)) is None  # the reply never came in time
    spans = agent.finished()
    assert dict(spans[0].attributes)["error.type"] == "requests.exceptions.ReadTimeout"

    assert world.export(spans)[0] == SpanExportResult.SUCCESS

    [call] = calls_of(trace_of(spans[0]))
    assert (call.state, call.observed) == ("UNKNOWN", True)
    assert Attempt.objects.get(call=call).error_kind == "read_timeout"
    deadline = time.monotonic() + 10
    while world.sandbox.ledger("refund-slow")["effects"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # the provider finishes the write it was sent after the client gave up
    assert world.jobs.run_checks() == 1  # the status check the UNKNOWN enqueued: by key, against the sandbox

    call.refresh_from_db()
    assert call.state == "COMMITTED" and call.provider_ref
    receipt = Receipt.objects.get(call=call, applied=True)
    assert (receipt.source, receipt.observed, receipt.local_state_before) == ("poll", "committed", "UNKNOWN")
    assert world.sandbox.ledger("refund-slow")["effects"] == 1
    assert len([r for r in world.sandbox.requests(key="refund-slow") if r["method"] == "POST"]) == 1


def test_a_repeated_write_goes_to_human_review_as_a_possible_duplicate(world):
    agent = world.agent()
    with agent.run():
        agent.refund()  # no key attribute: each send gets a key of its own at the provider
        agent.refund()  # the same refund again, as a model that "tries again" would
    first_trace = agent.finished()
    with agent.run():
        agent.refund(key="refund-once", arguments={"order_id": "O-9", "amount_cents": 10})
    with agent.run():
        agent.refund(key="refund-once", arguments={"order_id": "O-9", "amount_cents": 10})  # another trace, same key
    later = agent.finished()

    _, answers = world.export(first_trace + later)

    rejected, message = partial(answers[0])
    assert rejected == 0 and "2 repeated writes sent to human review as possible duplicates" in message
    [call] = calls_of(trace_of(first_trace[0]))  # one intent, executed twice
    assert (call.state, call.outcome) == ("HUMAN_REVIEW", "human_review_required")
    first, second = Attempt.objects.filter(call=call).order_by("number")
    assert (first.policy_bypassed, second.policy_bypassed) == (False, True)
    denied = GateDecision.objects.get(call=call, attempt=second)
    assert (denied.allowed, denied.reason) == (False, "committed")  # what admission would have answered
    outcomes = list(ObservedSpan.objects.filter(call=call).order_by("started_at").values_list("outcome", flat=True))
    assert outcomes == ["recorded", "possible_duplicate"]
    keyed = Call.objects.get(idempotency_key="refund-once")
    assert keyed.state == "HUMAN_REVIEW" and keyed.attempts.count() == 2
    assert calls_of(trace_of(later[-1])) == []  # the second trace's refund is the first one's intent
    assert ObservedSpan.objects.get(trace_id=trace_of(later[-1]), tool_name="refund.create").call_id == keyed.pk


def test_the_registrys_key_template_names_the_intent_of_spans_without_a_key(world):
    registry = sandbox_registry(world.sandbox.url)
    refund = next(tool for tool in registry["tools"] if tool["name"] == "refund.create")
    refund["key_template"] = "refund-{order_id}"
    load_registry(registry, actor=Actor.system("tests"))
    agent = world.agent()
    with agent.run():
        agent.refund(arguments={"order_id": "O-77", "amount_cents": 500})
        # The model tries again with another amount: another fingerprint, the same order's refund by the template.
        agent.refund(arguments={"order_id": "O-77", "amount_cents": 700})
        agent.refund(arguments={"amount_cents": 300})  # the template's argument is missing: a key of its own
    spans = agent.finished()

    _, answers = world.export(spans)

    trace = trace_of(spans[0])
    assert "1 repeated write sent to human review as possible duplicates" in partial(answers[0])[1]
    templated, own = calls_of(trace)
    assert templated.idempotency_key == f"{trace}:refund-O-77"
    assert (templated.state, templated.attempts.count()) == ("HUMAN_REVIEW", 2)
    assert own.idempotency_key.startswith(f"otlp-{trace}-") and own.attempts.count() == 1
    outcomes = list(ObservedSpan.objects.order_by("started_at").values_list("idempotency_key", "outcome"))
    assert outcomes == [
        (templated.idempotency_key, "recorded"),
        (templated.idempotency_key, "possible_duplicate"),
        (own.idempotency_key, "recorded"),
    ]


def test_spans_with_neither_arguments_nor_a_key_are_never_taken_for_a_repeat(world):
    agent = world.agent()
    with agent.run():
        agent.tool("refund.create", "POST", "/refunds")  # what was sent is not in the span: a 4xx, twice
        agent.tool("refund.create", "POST", "/refunds")
    spans = agent.finished()

    world.export(spans)

    calls = calls_of(trace_of(spans[0]))
    assert [(c.state, c.arguments, c.attempts.count()) for c in calls] == [("RETRYABLE", {}, 1)] * 2
    assert set(ObservedSpan.objects.values_list("outcome", "has_arguments")) == {("recorded", False)}
    assert not Attempt.objects.filter(policy_bypassed=True).exists()


def test_a_resent_batch_is_stored_once(world):
    agent = world.agent()
    with agent.run():
        agent.refund(key="refund-resent")
    spans = agent.finished()

    assert world.export(spans)[0] == SpanExportResult.SUCCESS
    result, answers = world.export(spans)  # the exporter's retry after a lost answer: the same batch again

    assert result == SpanExportResult.SUCCESS
    assert "1 span already stored (a resent batch): kept once" in partial(answers[0])[1]
    [call] = calls_of(trace_of(spans[0]))
    assert call.state == "COMMITTED" and call.attempts.count() == 1
    assert ObservedSpan.objects.count() == 1 and ObservedTool.objects.get(tool_name="refund.create").spans == 1


@pytest.mark.postgres
def test_the_same_batch_sent_twice_at_once_is_stored_once(world):
    agent = world.agent()
    with agent.run():
        agent.refund(key="refund-raced")
        agent.lookup()
    body = protobuf_of(agent.finished())
    replies = []

    threads = [threading.Thread(target=lambda: replies.append(world.post(body))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert [reply.status_code for reply in replies] == [200, 200]
    assert sorted(partial(reply)[0] for reply in replies) == [0, 0]  # nothing rejected: one stored, one resent
    assert ObservedSpan.objects.count() == 2 and Call.objects.count() == 2 and Attempt.objects.count() == 2
    assert Task.objects.count() == 1


def test_an_unknown_tool_is_recorded_with_its_name(world):
    agent = world.agent()
    with agent.run():
        agent.tool("weather.lookup", "GET", "/orders/O-1", arguments={"city": "Oslo"})
    spans = agent.finished()

    _, answers = world.export(spans)

    assert "1 span of tools not registered for the tenant recorded: weather.lookup" in partial(answers[0])[1]
    row = ObservedSpan.objects.get()
    assert (row.tool_name, row.outcome, row.call_id, row.task.external_id) == (
        "weather.lookup",
        "unknown_tool",
        None,
        trace_of(spans[0]),
    )
    assert not Call.objects.exists()
    assert ObservedTool.objects.get(tool_name="weather.lookup").tool_id is None


def test_spans_without_genai_attributes_are_counted_and_ignored(world):
    agent = world.agent()
    with agent.run():
        with agent.tracer.start_as_current_span("GET /orders", attributes={"http.request.method": "GET"}):
            pass
        with agent.tracer.start_as_current_span("chat gpt", attributes={"gen_ai.operation.name": "chat"}):
            pass
    spans = agent.finished()

    _, answers = world.export(spans)

    assert partial(answers[0]) == (0, "3 spans without gen_ai.operation.name execute_tool counted and ignored")
    assert nothing_stored()
    assert ObservedTally.objects.get(tenant__name="demo").spans_ignored == 3
    world.export(spans)
    assert ObservedTally.objects.get(tenant__name="demo").spans_ignored == 6


def test_otlp_json_is_read_as_protobuf_is(world):
    agent = world.agent()
    with agent.run():
        agent.refund(key="refund-json")
    spans = agent.finished()

    reply = world.post(json_of(spans), JSON)

    assert reply.headers["Content-Type"] == JSON
    assert partial(reply) == (0, "1 span without gen_ai.operation.name execute_tool counted and ignored")
    [call] = calls_of(trace_of(spans[0]))
    assert (call.idempotency_key, call.state, call.observed) == ("refund-json", "COMMITTED", True)
    resent = world.post(gzip.compress(json_of(spans)), JSON, **{"Content-Encoding": "gzip"})
    assert "already stored" in partial(resent)[1] and ObservedSpan.objects.count() == 1


def test_a_span_with_bad_attributes_is_rejected_alone(world):
    agent = world.agent()
    with agent.run():
        agent.refund(key="refund-good")
        agent.tool("refund.create", "POST", "/refunds", key="refund-bad", **{"gen_ai.tool.call.arguments": "[1, 2]"})
        agent.refund(key="has spaces")
    spans = agent.finished()

    for media, body in ((PROTOBUF, protobuf_of(spans)), (JSON, json_of(spans))):
        rejected, message = partial(world.post(body, media))
        assert rejected == 2, message
        assert "gen_ai.tool.call.arguments: must be a JSON object" in message
        assert "recovery.idempotency_key: must be 1 to 255 printable ASCII characters" in message
    assert list(Call.objects.values_list("idempotency_key", flat=True)) == ["refund-good"]
    assert ObservedSpan.objects.count() == 1


# --- bodies refused whole -------------------------------------------------------------------------------------------


def test_a_body_over_the_limit_once_decompressed_is_refused_and_nothing_is_stored(world, settings):
    settings.RECOVERY_API_MAX_BODY = 64 * 1024
    agent = world.agent()
    with agent.run():
        agent.refund(key="refund-big", **{"app.note": "x" * 200_000})
    whole = protobuf_of(agent.finished())
    body = gzip.compress(whole)
    assert len(body) < 64 * 1024 < len(whole), (len(body), len(whole))  # small on the wire only

    reply = world.post(body, **{"Content-Encoding": "gzip"})

    assert reply.status_code == 413 and reply.json()["error"]["code"] == "body_too_large"
    bomb = gzip.compress(b"\0" * 50_000_000)  # 50 MB of zeros in about 50 kB: never inflated past the limit
    started = time.monotonic()
    assert world.post(bomb, **{"Content-Encoding": "gzip"}).status_code == 413
    assert time.monotonic() - started < 5
    assert nothing_stored()
    assert world.sandbox.ledger("refund-big")["effects"] == 1  # it happened; the trace was refused, not the refund


@pytest.mark.parametrize(
    "media, body, headers, status, code, field",
    [
        (PROTOBUF, b"\xff\xff\xff not protobuf", {}, 400, "invalid_otlp", "body"),
        (JSON, b"[1, 2]", {}, 400, "invalid_otlp", "body"),
        (JSON, b"{not json", {}, 400, "invalid_otlp", "body"),
        (JSON, b'{"resourceSpans": 5}', {}, 400, "invalid_otlp", "resourceSpans"),
        # protobuf's JSON parser would read a null as "not set": a span without an id, an empty request
        (JSON, b'{"resourceSpans": null}', {}, 400, "invalid_otlp", "resourceSpans"),
        (
            JSON,
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", '
            b'"spanId": null}]}]}]}',
            {},
            400,
            "invalid_otlp",
            "resourceSpans[0].scopeSpans[0].spans[0].spanId",
        ),
        (
            JSON,
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [7]}]}]}',
            {},
            400,
            "invalid_otlp",
            "resourceSpans[0].scopeSpans[0].spans[0]",
        ),
        (JSON, b'{"resourceSpans": [{"resource": null}]}', {}, 400, "invalid_otlp", "resourceSpans[0].resource"),
        (
            JSON,
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "00f067aa0ba902b7"}]}]}]}',
            {},
            400,
            "invalid_otlp",
            "resourceSpans[0].scopeSpans[0].spans[0].traceId",
        ),
        (PROTOBUF, b"\x1f\x8b\x08\x00 truncated gzip", {"Content-Encoding": "gzip"}, 400, "invalid_otlp", "body"),
        (PROTOBUF, b"", {"Content-Encoding": "br"}, 415, "unsupported_encoding", "Content-Encoding"),
        ("text/plain", b"hello", {}, 415, "unsupported_media_type", "Content-Type"),
    ],
)
def test_a_malformed_body_gets_a_clear_error_and_stores_nothing(world, media, body, headers, status, code, field):
    reply = world.post(body, media, **headers)

    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["field_errors"][0]["field"]) == (code, field)
    assert nothing_stored()


# --- tokens and tenants ----------------------------------------------------------------------------------------------


def test_a_token_reaches_only_its_own_tenants_calls(world):
    agent = world.agent()
    with agent.run():
        agent.refund(key="refund-mine")
    spans = agent.finished()
    world.export(spans)
    [call] = calls_of(trace_of(spans[0]))

    # Another tenant's token can neither read the observed call nor write into the tenant through a trace.
    assert (
        requests.get(f"{world.url}/api/v1/calls/{call.pk}", headers=_bearer(world.other), timeout=5).status_code == 404
    )
    attempt = {"attempt_id": "a-2", "outcome": {"http_status": 200}}
    sent = requests.post(
        f"{world.url}/api/v1/calls/{call.pk}/attempts", json=attempt, headers=_bearer(world.other), timeout=5
    )
    assert sent.status_code == 404
    intruder = world.agent(service="intruder")  # its resource names tenant "demo"
    with intruder.run():
        intruder.refund(key="refund-mine")
    rejected, message = partial(world.post(protobuf_of(intruder.finished()), token=world.other))
    assert rejected == 1 and "recovery.tenant: this token is not scoped to tenant 'demo'" in message
    assert Call.objects.count() == 1 and call.attempts.count() == 1
    mine = requests.get(f"{world.url}/api/v1/calls/{call.pk}", headers=_bearer(world.token), timeout=5)
    assert mine.status_code == 200 and mine.json()["observed"] is True  # the API says how it came to be known
    assert world.post(b"", token="not-a-token").status_code == 401


def test_a_token_of_several_tenants_needs_the_spans_tenant(world):
    _, both = token_create(name="otel-both", tenants=["demo", "other"], actor=Actor.system("tests"))
    agent = world.agent(tenant=None)
    with agent.run():
        agent.refund(key="refund-which")
    rejected, message = partial(world.post(protobuf_of(agent.finished()), token=both))
    assert rejected == 1 and "recovery.tenant: required: this token is scoped to 2 tenants" in message
    assert not Call.objects.exists()


def test_the_trace_of_a_call_admission_protects_is_linked_not_counted_again(world):
    from recovery_client import RecoveryClient

    client = RecoveryClient(world.url, world.token)
    task = client.create_task("demo", "protected-run", agent="refund-agent", goal="refund once")
    added = client.add_call(task.id, step=1, tool="refund.create", arguments=REFUND, idempotency_key="refund-admitted")
    client.single_shot(
        added.call_id, "a1", {"http_status": 200, "result": {"refund_id": "re_1", "status": "succeeded", **REFUND}}
    )
    agent = world.agent()
    with agent.run():
        agent.refund(key="refund-admitted")  # the same call, traced by the same runtime
    world.export(agent.finished())
    client.session.close()  # the live server's thread keeps its database connection while ours is open

    call = Call.objects.get(pk=added.call_id)
    assert (call.observed, call.state, call.attempts.count()) == (False, "COMMITTED", 1)
    assert ObservedSpan.objects.get().outcome == "protected" and ObservedSpan.objects.get().call_id == call.pk


def _bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}

"""Observed calls in the console (docs/otlp-ingest.md), without a browser: the call page, the queue rows and the task
page mark a call made from OpenTelemetry spans "observed (from traces)" with what admission would have answered, the
task page lists its trace's spans (tools not in the registry included), and the breakers page shows each runtime's tools
as protected, observed only or not in the registry. Spans are made by the real OpenTelemetry SDK, encoded by its OTLP
encoder, and recorded by the ingest's own reading and service (tests/test_otlp_ingest.py sends them over HTTP).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from recovery.api import otlp_decode as otlp
from recovery.audit.chain import Actor
from recovery.models import Call, Tenant
from recovery.registry import load_registry
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.calls import call_add
from recovery.services.observed import spans_ingest
from recovery.services.tasks import task_create
from tests.console import HOSTILE_SCRIPT, REVIEWER, page_text, signed_in, statements

REGISTRY = Path(__file__).resolve().parent.parent / "recovery" / "fixtures" / "registry.example.json"
REFUND = {"order_id": "O-8848", "amount_cents": 1250}
REFUNDED = {"refund_id": "re_1", "status": "succeeded", **REFUND}
RUNTIME = Actor.system("runtime")
VIEWER = "viewer"


@pytest.fixture
def registry(db):
    load_registry(json.loads(REGISTRY.read_text()), actor=Actor.system("tests"))


def record(*tools: tuple[str, dict, dict | None], agent: str = "refund-agent") -> str:
    """One trace of tool spans (name, arguments, result) made by the SDK and recorded by the ingest: its trace id."""
    spans = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": agent, "recovery.tenant": "demo"}))
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
        for name, arguments, result in tools:
            attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
            attributes["gen_ai.tool.call.arguments"] = json.dumps(arguments)
            attributes["http.response.status_code"] = 200
            if result is not None:
                attributes["gen_ai.tool.call.result"] = json.dumps(result)
            tracer.start_span(f"execute_tool {name}", attributes=attributes).end()
    finished = spans.get_finished_spans()
    batch = otlp.read_spans(otlp.decode(encode_spans(finished).SerializeToString(), otlp.MEDIA_PROTOBUF))
    spans_ingest(batch=batch, tenants=[Tenant.objects.get(name="demo")], actor=RUNTIME)
    return f"{finished[0].context.trace_id:032x}"


def refunded_twice() -> Call:
    """A refund the runtime sent twice (a possible duplicate, in human review), observed."""
    trace = record(("refund.create", REFUND, REFUNDED), ("refund.create", REFUND, REFUNDED))
    call = Call.objects.get(task__external_id=trace)
    assert (call.state, call.observed, call.attempts.count()) == ("HUMAN_REVIEW", True, 2)
    return call


def test_the_call_page_says_observed_and_what_admission_would_have_answered(people, registry):
    call = refunded_twice()

    html = signed_in(people, VIEWER).get(f"/calls/{call.pk}/").content.decode()

    observed = page_text(html[html.index('id="observed"') : html.index("</section>", html.index('id="observed"'))])
    assert "observed (from traces)" in observed
    assert "attempt 1 otlp-" in observed and "admission would have allowed it (first_attempt)" in observed
    assert "admission would have refused it (committed): policy bypassed" in observed
    for span in call.observed_spans.all():
        assert f"trace {span.trace_id} span {span.span_id} ({span.outcome}" in observed


def test_an_ordinary_call_page_says_nothing_of_traces_and_reads_no_more(people, registry):
    observed = refunded_twice()
    task, _ = task_create(tenant=observed.tenant, external_id="t-1", agent="a", goal="g", budget={}, actor=RUNTIME)
    added = call_add(
        task=task, step_index=1, depends_on=[], tool_name="refund.create", arguments=REFUND, idempotency_key="k-1",
        actor=RUNTIME,
    )  # fmt: skip
    client = signed_in(people, VIEWER)
    client.get(f"/calls/{added.call.pk}/")

    plain, page = statements(client, f"/calls/{added.call.pk}/")
    with_spans, _ = statements(client, f"/calls/{observed.pk}/")

    assert "observed (from traces)" not in page.content.decode()
    assert with_spans == plain + 1  # the observed call's spans: one statement, for observed calls only


def test_queue_rows_mark_observed_calls_with_the_admission_answer(people, registry):
    call = refunded_twice()

    html = signed_in(people, REVIEWER).get("/queues/human-review/").content.decode()

    row = html[html.index(f'id="call-{call.pk}"') : html.index("</tr>", html.index(f'id="call-{call.pk}"'))]
    assert "observed (from traces)" in row
    assert 'title="admission would have refused it (committed): policy bypassed"' in row


def test_the_task_page_marks_observed_calls_and_lists_the_traces_spans(people, registry):
    trace = record(("order.lookup", {"order_id": "O-1"}, None), (HOSTILE_SCRIPT, {"city": "Oslo"}, None))
    task_id = Call.objects.get(task__external_id=trace).task_id

    html = signed_in(people, VIEWER).get(f"/tasks/{task_id}/").content.decode()

    assert HOSTILE_SCRIPT not in html and "&lt;script&gt;" in html  # an agent's tool name is text
    text = page_text(html)
    assert "order.lookup observed (from traces)" in text
    assert "admission would have allowed it (first_attempt)" in text
    spans = page_text(html[html.index('id="observed-spans"') :])
    assert "recorded: call" in spans and "unknown tool" in spans and "not in the registry" in spans
    assert f"Tools not in the registry: {HOSTILE_SCRIPT}." in spans


def test_the_breakers_page_shows_each_runtimes_tools_protected_or_observed_only(people, registry):
    record(("refund.create", REFUND, REFUNDED), ("order.lookup", {"order_id": "O-1"}, None), ("weather.now", {}, None))
    task, _ = task_create(
        tenant=Tenant.objects.get(name="demo"), external_id="guarded", agent="refund-agent", goal="g", budget={},
        actor=RUNTIME,
    )  # fmt: skip
    added = call_add(
        task=task, step_index=1, depends_on=[], tool_name="order.lookup", arguments={"order_id": "O-2"},
        idempotency_key="lookup-2", actor=RUNTIME,
    )  # fmt: skip
    attempt_admit(call=added.call, request=AttemptRequest(attempt_id="a1"), actor=RUNTIME)  # through admission

    html = signed_in(people, VIEWER).get("/operations/breakers/").content.decode()

    section = html[html.index('id="runtimes"') :]
    rows = section.split("<tr data-standing=")[1:]
    standings = {page_text(row.split(">", 1)[1].split("</th>")[0]): row.split('"')[1] for row in rows}
    assert standings == {
        "order.lookup": "protected",
        "refund.create": "observed only",
        "weather.now": "not in the registry",
    }
    assert "refund-agent · tenant demo · 1 span of the tenant without GenAI attributes" in page_text(section)

"""The served OpenAPI document describes every answer, and the client's types agree with it field by field.

The document (/api/v1/openapi.json) is what a runtime in any language reads; the client (`recovery_client`, the
distribution in clients/python, as installed) is what a Python runtime uses. Both are checked here against the
document as the server serves it:

- every status of every operation has a JSON schema, every 2xx one an object whose fields all carry a one-line
  description; the decision card and the failure object carry examples that are valid against their own schemas;
- every result type of the client (its dataclasses and TypedDicts) has exactly the fields of the schema it mirrors,
  with the same JSON types, nested objects mapped to the same schemas — so a field the server adds, renames or
  drops fails here until the client knows it (test_the_comparison_sees_an_added_a_renamed_and_a_dropped_field
  shows the comparison failing on each);
- the client imports without Django, and the one checked here is the installed distribution (recovery-console-client,
  what agents pip install), not a source tree on the path.

That the answers really conform to the document is checked on live answers by the fuzzer (tests/test_api_fuzz.py,
schemathesis' response_schema_conformance on every operation).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
import recovery_client as c
from jsonschema import Draft202012Validator

# Each result type of the client and the schema of the document it mirrors.
MIRRORS: dict[Any, str] = {
    c.FieldErrorInfo: "FieldErrorOut",
    c.RequiredNext: "RequiredNextOut",
    c.Check: "CheckOut",
    c.Gate: "GateOut",
    c.Wire: "WireOut",
    c.Failure: "FailureOut",
    c.BudgetView: "BudgetViewOut",
    c.DecisionCard: "DecisionOut",
    c.Preflight: "PreflightOut",
    c.TaskBudget: "TaskBudgetOut",
    c.StepSummary: "StepOut",
    c.CallBrief: "CallBriefOut",
    c.AttemptRecord: "AttemptRecordOut",
    c.GateRecord: "GateRecordOut",
    c.ReceiptRecord: "ReceiptOut",
    c.CallDetail: "CallOut",
    c.CompensationRecord: "CompensationOut",
    c.NextCompensation: "NextCompensationOut",
    c.Saga: "SagaOut",
    c.CompensationAttempt: "CompensationAttemptOut",
    c.ReconcileAccepted: "ReconcileAcceptedOut",
    c.Capability: "CapabilityOut",
    c.Task: "TaskOut",
    c.CallRef: "CallAdmittedOut",
    c.NotAdmittedDetail: "NotAdmittedDetail",
    c.ReportTerms: "ReportTermsOut",
    c.EarlierVerdict: "EarlierVerdictOut",
    c.Admission: "AdmittedOut",
    c.OutcomeAnswer: "OutcomeOut",
}

# Operations the client leaves out, and why: it is an agent runtime's client, and these are read by something else.
NOT_FOR_RUNTIMES = {
    "GET /api/v1/metrics": (
        "the metrics (docs/metrics.md), read by dashboards and scrapers; tested in test_metrics_endpoints"
    ),
    "POST /api/v1/otlp/v1/traces": (
        "OpenTelemetry trace ingest (docs/otlp-ingest.md), sent by OTLP exporters; test_otlp_ingest"
    ),
}

# What each client method returns, for the operation it sends: (operation, status) -> the client's type.
METHODS: dict[tuple[str, int], Any] = {
    ("POST /api/v1/tasks", 201): c.Task,
    ("POST /api/v1/tasks", 200): c.Task,
    ("GET /api/v1/tasks", 200): c.Task,
    ("GET /api/v1/tasks/{task_id}", 200): c.Task,
    ("POST /api/v1/tasks/{task_id}/complete", 200): c.Task,
    ("POST /api/v1/tasks/{task_id}/abandon", 200): c.Task,
    ("POST /api/v1/tasks/{task_id}/calls", 201): c.CallRef,
    ("POST /api/v1/tasks/{task_id}/calls", 200): c.CallRef,
    ("GET /api/v1/calls/{call_id}", 200): c.CallDetail,
    ("POST /api/v1/calls/{call_id}/abandon", 200): c.CallDetail,
    ("POST /api/v1/calls/{call_id}/reconcile", 202): c.ReconcileAccepted,
    ("POST /api/v1/calls/{call_id}/gate", 200): c.Gate,
    ("POST /api/v1/calls/{call_id}/attempts/{attempt_id}/outcome", 200): c.OutcomeAnswer,
    ("POST /api/v1/tasks/{task_id}/compensate", 202): c.Saga,
    ("GET /api/v1/tasks/{task_id}/compensation", 200): c.Saga,
    ("POST /api/v1/compensations/{compensation_id}/attempts", 201): c.CompensationAttempt,
    ("POST /api/v1/compensations/{compensation_id}/attempts", 200): c.CompensationAttempt,
    ("POST /api/v1/compensations/{compensation_id}/attempts/{attempt_id}/outcome", 200): c.CompensationAttempt,
}


@pytest.fixture(scope="module")
def document(django_db_blocker) -> dict:
    from django.test import Client

    with django_db_blocker.unblock():
        response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def operations(document: dict):
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            yield f"{method.upper()} {path}", operation


def schema_of(operation: dict, status: int | str) -> dict:
    return operation["responses"][str(status)]["content"]["application/json"]["schema"]


def ref_name(schema: dict) -> str:
    return schema["$ref"].rsplit("/", 1)[1]


def resolve(document: dict, schema: dict) -> dict:
    return document["components"]["schemas"][ref_name(schema)] if "$ref" in schema else schema


# --- the document ---------------------------------------------------------------------------------------------------


def test_every_answer_of_every_operation_has_a_schema(document):
    described = 0
    for label, operation in operations(document):
        statuses = {int(s) for s in operation["responses"]}
        assert any(200 <= s < 300 for s in statuses), f"{label} declares no 2xx answer"
        assert {401, 404, 422, 500, 503} <= statuses, f"{label} does not declare the error statuses"
        for status in statuses:
            schema = schema_of(operation, status)
            alternatives = schema.get("anyOf", [schema])
            for alternative in alternatives:
                body = resolve(document, alternative)
                assert body.get("type") == "object" and body.get("properties"), f"{label} {status}: {alternative}"
                if status >= 400:
                    assert "error" in body["properties"], f"{label} {status} is not the error envelope"
                described += 1
    assert described >= 13 * 9


def test_every_field_of_every_answer_has_a_one_line_description(document):
    missing = []
    for name, schema in document["components"]["schemas"].items():
        if not name.endswith(("Out", "Body", "Detail")):
            continue  # request bodies
        for field, prop in schema["properties"].items():
            text = prop.get("description", "")
            if not text or "\n" in text:
                missing.append(f"{name}.{field}")
    assert missing == []


def test_answers_are_closed_objects(document):
    """An answer lists every field it carries (additionalProperties false), so a runtime knows them all."""
    open_ = [
        name
        for name, schema in document["components"]["schemas"].items()
        if name.endswith("Out") and schema.get("additionalProperties") is not False
    ]
    assert open_ == []


@pytest.mark.parametrize("name", ["DecisionOut", "FailureOut"])
def test_the_decision_card_and_the_failure_carry_a_valid_example(document, name):
    schema = document["components"]["schemas"][name]
    example = schema["example"]
    rewritten = _local_refs({**schema, "$defs": document["components"]["schemas"]})
    errors = list(Draft202012Validator(rewritten).iter_errors(example))
    assert errors == []
    assert set(example) == set(schema["properties"])  # the example shows every field
    broken = dict(example, route="retry_forever") if name == "DecisionOut" else dict(example, **{"class": "oops"})
    assert list(Draft202012Validator(rewritten).iter_errors(broken)) != []


def _local_refs(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {
            k: (v.replace("#/components/schemas/", "#/$defs/") if k == "$ref" else _local_refs(v))
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_local_refs(v) for v in schema]
    return schema


def test_the_failure_is_named_class_on_the_wire(document):
    failure = document["components"]["schemas"]["FailureOut"]["properties"]
    assert "class" in failure and "failure_class" not in failure
    assert set(failure["class"]["enum"]) == {
        "invalid_arguments",
        "transient",
        "authentication",
        "authorization",
        "capability_missing",
        "outcome_unknown",
        "invalid_result",
        "unrecoverable",
    }


def test_a_denied_admission_is_described_with_its_gate(document):
    attempts = dict(operations(document))["POST /api/v1/calls/{call_id}/attempts"]
    names = {ref_name(s) for s in schema_of(attempts, 409)["anyOf"]}
    assert names == {"NotAdmittedOut", "ErrorOut"}
    assert {ref_name(s) for s in schema_of(attempts, 201)["anyOf"]} == {"AdmittedOut", "OutcomeOut"}


def test_every_operation_declares_the_wrong_scope_refusal(document):
    """A token of the wrong scope (a metrics token on a runtime endpoint) is a 403 wrong_token_scope: declared."""
    assert [label for label, operation in operations(document) if "403" not in operation["responses"]] == []


def test_the_metrics_answer_is_described_whole(document):
    from recovery.engine.metrics import FIGURES, HOLD_FIGURES

    metrics = dict(operations(document))["GET /api/v1/metrics"]
    assert ref_name(schema_of(metrics, 200)) == "MetricsOut"
    assert {p["name"]: p["in"] for p in metrics["parameters"]} == {
        "window": "query",
        "tool": "query",
        "tenant": "query",
    }
    schemas = document["components"]["schemas"]
    assert set(schemas["MetricsOut"]["properties"]) == {
        "window", "start", "end", "folded_at", "lag_s", "step_s", "queues", "figures",
    }  # fmt: skip
    figure = schemas["MetricFigureOut"]["properties"]
    assert set(figure) == {
        "key", "title", "kind", "doc", "unit", "value", "numerator", "denominator", "median", "count", "by_label",
        "series",
    }  # fmt: skip
    # a closed vocabulary: every figure (the folded ones, then the MCP holds'), no other
    assert figure["key"]["enum"] == [f.key for f in FIGURES + HOLD_FIGURES]
    assert set(schemas["MetricLabelOut"]["properties"]) == {"label", "value"}
    assert set(schemas["MetricPointOut"]["properties"]) == {"start", "value"}


# --- the client against the document --------------------------------------------------------------------------------


def client_fields(kind: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(kind):
        hints = get_type_hints(kind, vars(c))
        return {f.name: hints[f.name] for f in dataclasses.fields(kind) if f.name != "raw"}
    return get_type_hints(kind, vars(c))


def client_kinds(annotation: Any) -> frozenset[str]:
    """The JSON types a client annotation stands for; a nested result type as "ref:<the schema it mirrors>"."""
    if annotation is Any:
        return frozenset({"any"})
    if annotation is type(None):
        return frozenset({"null"})
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return frozenset().union(*(client_kinds(a) for a in get_args(annotation)))
    if origin is list:
        (item,) = get_args(annotation)
        return frozenset({"array:" + ",".join(sorted(client_kinds(item)))})
    if origin is dict or annotation is dict:
        return frozenset({"object"})
    if annotation in MIRRORS:
        return frozenset({f"ref:{MIRRORS[annotation]}"})
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    assert annotation in simple, f"the client uses a type the comparison does not know: {annotation!r}"
    return frozenset({simple[annotation]})


def document_kinds(schema: dict) -> frozenset[str]:
    if "$ref" in schema:
        return frozenset({f"ref:{ref_name(schema)}"})
    if "anyOf" in schema:
        return frozenset().union(*(document_kinds(s) for s in schema["anyOf"]))
    kind = schema.get("type")
    if kind is None and "enum" in schema:
        kind = {type(v) for v in schema["enum"]}.pop().__name__
        kind = {"str": "string", "bool": "boolean", "int": "integer"}[kind]
    if kind is None and "const" in schema:
        kind = {bool: "boolean", str: "string", int: "integer"}[type(schema["const"])]
    if kind is None:
        return frozenset({"any"})
    if kind == "array":
        return frozenset({"array:" + ",".join(sorted(document_kinds(schema.get("items", {}))))})
    return frozenset({kind})


def differences(document: dict, kind: Any, name: str) -> list[str]:
    """How the client's `kind` differs from the document's schema `name`: missing, unknown and mistyped fields."""
    properties = document["components"]["schemas"][name]["properties"]
    fields = client_fields(kind)
    found = [f"{name}.{f}: the server sends it, the client does not know it" for f in properties.keys() - fields]
    found += [f"{name}.{f}: the client expects it, the server does not send it" for f in fields.keys() - properties]
    for field in fields.keys() & properties.keys():
        theirs, ours = document_kinds(properties[field]), client_kinds(fields[field])
        if theirs != ours:
            found.append(f"{name}.{field}: the document says {sorted(theirs)}, the client {sorted(ours)}")
    return sorted(found)


@pytest.mark.parametrize("kind", list(MIRRORS), ids=lambda k: k.__name__)
def test_each_client_type_has_exactly_the_fields_of_its_schema(document, kind):
    assert differences(document, kind, MIRRORS[kind]) == []


def test_each_client_method_returns_the_type_of_its_operations_answer(document):
    served = dict(operations(document))
    for (label, status), kind in METHODS.items():
        assert ref_name(schema_of(served[label], status)) == MIRRORS[kind], label
    admitted = {ref_name(s) for s in schema_of(served["POST /api/v1/calls/{call_id}/attempts"], 201)["anyOf"]}
    assert admitted == {MIRRORS[c.Admission], MIRRORS[c.OutcomeAnswer]}  # admit() and single_shot()
    capabilities = resolve(document, schema_of(served["GET /api/v1/capabilities"], 200))
    assert document_kinds(capabilities["properties"]["tools"]) == client_kinds(list[c.Capability])
    not_admitted = document["components"]["schemas"]["NotAdmittedDetail"]["properties"]
    assert document_kinds(not_admitted["gate"]) == client_kinds(c.Gate)  # NotAdmitted.gate
    mirrored = {label for label, _ in METHODS} | {
        "POST /api/v1/calls/{call_id}/attempts",
        "GET /api/v1/capabilities",
    }
    assert mirrored == set(served) - set(NOT_FOR_RUNTIMES), "an operation the client does not cover"


def test_every_nested_schema_of_an_answer_has_a_client_type(document):
    mirrored = set(MIRRORS.values())
    reached = set()
    pending = [MIRRORS[kind] for kind in METHODS.values()] + ["CapabilityOut"]
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        reached.add(name)
        for prop in document["components"]["schemas"][name]["properties"].values():
            for kind in document_kinds(prop):
                ref = kind.split("ref:", 1)[1] if "ref:" in kind else None
                if ref:
                    pending.append(ref.rstrip(","))
    assert reached <= mirrored, reached - mirrored


def test_the_comparison_sees_an_added_a_renamed_and_a_dropped_field(document):
    changed = copy.deepcopy(document)
    schemas = changed["components"]["schemas"]
    schemas["TaskOut"]["properties"]["priority"] = {"type": "integer", "description": "new"}
    failure = schemas["FailureOut"]["properties"]
    failure["failure_kind"] = failure.pop("class")
    del schemas["DecisionOut"]["properties"]["delay_ms"]
    schemas["CallBriefOut"]["properties"]["step"] = {"type": "string", "description": "now text"}
    assert differences(changed, c.Task, "TaskOut") == [
        "TaskOut.priority: the server sends it, the client does not know it"
    ]
    assert differences(changed, c.Failure, "FailureOut") == [
        "FailureOut.class: the client expects it, the server does not send it",
        "FailureOut.failure_kind: the server sends it, the client does not know it",
    ]
    assert differences(changed, c.DecisionCard, "DecisionOut") == [
        "DecisionOut.delay_ms: the client expects it, the server does not send it"
    ]
    assert differences(changed, c.CallBrief, "CallBriefOut") == [
        "CallBriefOut.step: the document says ['string'], the client ['integer']"
    ]


def test_the_client_imports_without_django():
    code = (
        "import sys; import recovery_client; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'ninja', 'pydantic')); "
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_client_checked_here_is_the_installed_distribution():
    installed = importlib.metadata.distribution("recovery-console-client")
    files = {Path(installed.locate_file(f)).resolve() for f in installed.files or ()}
    assert Path(c.__file__).resolve() in files
    assert installed.version == c.__version__


def test_the_client_builds_its_answers_from_every_field(document):
    """_answer fills each dataclass field from the body of that name: a field the body carries is never lost."""
    body = {name: f"value of {name}" for name in document["components"]["schemas"]["OutcomeOut"]["properties"]}
    answer = c._answer(c.OutcomeAnswer, body)
    assert {f.name: getattr(answer, f.name) for f in dataclasses.fields(answer) if f.name != "raw"} == body
    assert answer.raw is body

"""OTLP/HTTP trace export requests (docs/otlp-ingest.md), read into the spans the ingest records
(recovery.services.observed): protobuf or OTLP/JSON, gzip allowed, the size limit applied after decompression.
A GenAI `execute_tool` span maps onto a call and its attempt as that page's table says; a span that breaks a rule is
rejected alone, a body that does not parse is refused whole (400). Nothing here imports Django.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from recovery.engine.storable import check_storable, loads
from recovery.engine.types import ERROR_KINDS

MEDIA_PROTOBUF = "application/x-protobuf"
MEDIA_JSON = "application/json"
MEDIA_TYPES = (MEDIA_PROTOBUF, MEDIA_JSON)

# An OTLP/JSON body nesting deeper than this is refused whole, before the protobuf parser walks it.
MAX_BODY_DEPTH = 128
# The attributes' own limits: what the columns they land in hold.
MAX_NAME = 200
KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")

EXECUTE_TOOL = "execute_tool"
ATTEMPT_PREFIX = "otlp-"  # attempt ids and derived keys: `otlp-<trace id>-<span or tool call id>`


class OtlpError(ValueError):
    """The body cannot be read as an export request at all: refused whole (400), naming where."""

    def __init__(self, message: str, *, field: str = "body") -> None:
        super().__init__(message)
        self.field = field


class BodyTooLarge(Exception):
    """The body is over the size limit once decompressed (413)."""


# --- the body --------------------------------------------------------------------------------------------------------


def inflate(body: bytes, *, encoding: str, limit: int) -> bytes:
    """The body as sent, or gunzipped; BodyTooLarge as soon as the output passes `limit` bytes (never more is held)."""
    if encoding in ("", "identity"):
        if len(body) > limit:
            raise BodyTooLarge
        return body
    if encoding != "gzip":
        raise OtlpError(f"Content-Encoding {encoding!r} is not supported: send gzip or none", field="Content-Encoding")
    out, rest = bytearray(), body
    while rest:  # one gzip member after another, as gzip.decompress reads them
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += member.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise OtlpError(f"the body is not valid gzip: {exc}") from None
        if len(out) > limit or member.unconsumed_tail:
            raise BodyTooLarge
        if not member.eof:
            raise OtlpError("the gzip stream ends early: send the whole body again")
        rest = member.unused_data
    return bytes(out)


def decode(body: bytes, media: str) -> ExportTraceServiceRequest:
    """The export request in `body`, in `media` (one of MEDIA_TYPES); OtlpError when it does not parse."""
    if media == MEDIA_PROTOBUF:
        try:
            return ExportTraceServiceRequest.FromString(body)
        except (DecodeError, RecursionError) as exc:
            raise OtlpError(f"not an OTLP ExportTraceServiceRequest in protobuf: {exc}") from None
    try:
        data = loads(body, max_depth=MAX_BODY_DEPTH)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OtlpError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise OtlpError("an OTLP/JSON ExportTraceServiceRequest is a JSON object with resourceSpans")
    _check_unicode(data)
    _check_shape(data)
    _ids_to_base64(data)
    try:
        return json_format.ParseDict(data, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, TypeError, ValueError) as exc:
        raise OtlpError(f"not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None


def _check_unicode(data: dict) -> None:
    """JSON may escape a lone surrogate, which is no text at all: refused before the protobuf parser meets it (its
    C code fails on one in a key). Other storage rules (NUL...) are the spans' own:
    recovery.api.otlp_decode._attributes."""
    pending: list[Any] = [data]
    while pending:
        item = pending.pop()
        texts = list(item) if isinstance(item, dict) else [item]
        for text in texts:
            if isinstance(text, str) and not text.isascii():
                try:
                    text.encode()
                except UnicodeEncodeError:
                    raise OtlpError("text must be valid Unicode, not a lone surrogate escape") from None
        pending.extend(item.values() if isinstance(item, dict) else item if isinstance(item, list) else [])


def _check_shape(data: dict) -> None:
    """Objects where the API's document says objects go, arrays where arrays go, ids as text: checked here, because
    protobuf's JSON parser reads a `null` anywhere as "not set" and would take `"spanId": null` for a span without an
    id, or `"resourceSpans": null` for an empty request, where the sender sent something else."""
    for r, resource in _each(_expect(data, ("resourceSpans", "resource_spans"), list, ""), "resourceSpans"):
        _expect(resource, ("resource",), dict, r)
        for s, scope in _each(_expect(resource, ("scopeSpans", "scope_spans"), list, r), f"{r}scopeSpans"):
            _expect(scope, ("scope",), dict, s)
            for n, span in _each(_expect(scope, ("spans",), list, s), f"{s}spans"):
                _check_ids(span, n)


def _expect(parent: dict, names: tuple[str, ...], kind: type, where: str) -> list:
    """The first of `names` present in `parent`, which must be a `kind`: as a list of items (none when absent)."""
    for name in names:
        if name in parent:
            value = parent[name]
            if not isinstance(value, kind):
                what = "an object" if kind is dict else "an array"
                raise OtlpError(f"{where}{name} must be {what}", field=f"{where}{name}")
            return value if kind is list else [value]
    return []


def _each(items: list, where: str) -> list[tuple[str, dict]]:
    """The items, each an object, with its path as the prefix of its own fields' paths."""
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise OtlpError(f"{where}[{i}] must be an object", field=f"{where}[{i}]")
    return [(f"{where}[{i}].", item) for i, item in enumerate(items)]


def _check_ids(span: dict, where: str) -> None:
    for name, size in _ID_FIELDS.items():
        if name in span and not isinstance(span[name], str):
            raise OtlpError(
                f"{name} must be {size * 2} hexadecimal digits (OTLP/JSON ids are hex), not "
                f"{type(span[name]).__name__ if span[name] is not None else 'null'}",
                field=f"{where}{name}",
            )


_ID_FIELDS = {"traceId": 16, "spanId": 8, "parentSpanId": 8, "trace_id": 16, "span_id": 8, "parent_span_id": 8}


def _ids_to_base64(data: dict) -> None:
    """OTLP/JSON writes ids in hex where protobuf's JSON reads bytes in base64: rewritten in place, path by path."""
    for r, resource in _items(data, "resourceSpans", "resource_spans"):
        for s, scope in _items(resource, "scopeSpans", "scope_spans"):
            for n, span in _items(scope, "spans"):
                where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{n}]"
                _hex_ids(span, where)
                for k, link in _items(span, "links"):
                    _hex_ids(link, f"{where}.links[{k}]")


def _items(parent: Any, *names: str) -> list[tuple[int, dict]]:
    if not isinstance(parent, dict):
        return []
    for name in names:
        if isinstance(parent.get(name), list):
            return [(i, item) for i, item in enumerate(parent[name]) if isinstance(item, dict)]
    return []


def _hex_ids(obj: dict, where: str) -> None:
    for name, size in _ID_FIELDS.items():
        value = obj.get(name)
        if not isinstance(value, str) or (not value and name in ("parentSpanId", "parent_span_id")):
            continue  # not text: the protobuf parser says so; no parent: a root span
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raw = b""
        if len(raw) != size:
            raise OtlpError(
                f"{name} must be {size * 2} hexadecimal digits (OTLP/JSON ids are hex)", field=f"{where}.{name}"
            )
        obj[name] = base64.b64encode(raw).decode()


def answer(*, rejected: int, message: str, media: str) -> bytes:
    """The ExportTraceServiceResponse in `media`: `partial_success` when spans were rejected or something is worth a
    warning (OTLP allows a message with 0 rejected), else empty — the full success."""
    response = ExportTraceServiceResponse()
    if rejected or message:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if media == MEDIA_PROTOBUF:
        return response.SerializeToString()
    if not (rejected or message):
        return b"{}"
    # OTLP/JSON: lowerCamelCase names, an int64 as text; both fields written out, whatever their value.
    return json.dumps({"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}}).encode()


# --- the spans -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ToolSpan:
    """One `execute_tool` span, read: where it belongs, what it called, and the outcome's facts as the API takes
    them (an OutcomeIn body: recovery.services.outcomes.facts_of reads it)."""

    trace_id: str
    span_id: str
    tenant: str | None  # recovery.tenant; None: the token's only tenant
    agent: str
    tool: str
    tool_call_id: str
    idempotency_key: str | None  # recovery.idempotency_key; None: derive one (key_for)
    arguments: dict | None  # None: the span did not carry them
    facts: dict
    started_at: datetime | None
    template_key: str | None = None  # the tool's key template filled (recovery.services.observed)

    @property
    def attempt_id(self) -> str:
        return f"{ATTEMPT_PREFIX}{self.trace_id}-{self.span_id}"

    @property
    def derived_key(self) -> str:
        """The key of a span without one: its tool call's within the trace when it says what it did, else its own."""
        if self.arguments is not None and self.tool_call_id and KEY_PATTERN.match(self.tool_call_id):
            return f"{ATTEMPT_PREFIX}{self.trace_id}-{self.tool_call_id}"[:255]
        return self.attempt_id

    @property
    def key(self) -> str:
        return self.idempotency_key or self.template_key or self.derived_key


@dataclass(frozen=True, kw_only=True)
class RejectedSpan:
    trace_id: str
    span_id: str
    field: str  # the attribute (or id) at fault
    problem: str


@dataclass(kw_only=True)
class Batch:
    """A request's spans: the tool spans in start-time order, the rejected ones, and the others per tenant name
    (None: no `recovery.tenant`)."""

    tool_spans: list[ToolSpan] = field(default_factory=list)
    rejected: list[RejectedSpan] = field(default_factory=list)
    ignored: Counter = field(default_factory=Counter)


class _Reject(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field, self.problem = field, problem


def read_spans(request: ExportTraceServiceRequest) -> Batch:
    batch = Batch()
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                _read(span, resource, batch)
    batch.tool_spans.sort(key=lambda s: (s.started_at or datetime.min.replace(tzinfo=UTC), s.trace_id, s.span_id))
    return batch


def _read(span: Span, resource: dict[str, Any], batch: Batch) -> None:
    trace_id, span_id = span.trace_id.hex(), span.span_id.hex()
    try:
        attributes = _attributes(span.attributes)
    except _Reject as reject:
        batch.rejected.append(
            RejectedSpan(trace_id=trace_id, span_id=span_id, field=reject.field, problem=reject.problem)
        )
        return
    tenant = attributes.get("recovery.tenant", resource.get("recovery.tenant"))
    if attributes.get("gen_ai.operation.name") != EXECUTE_TOOL:
        batch.ignored[tenant if isinstance(tenant, str) else None] += 1
        return
    try:
        batch.tool_spans.append(_tool_span(span, trace_id, span_id, tenant, attributes, resource))
    except _Reject as reject:
        batch.rejected.append(
            RejectedSpan(trace_id=trace_id, span_id=span_id, field=reject.field, problem=reject.problem)
        )


def _tool_span(span: Span, trace_id: str, span_id: str, tenant: Any, attrs: dict, resource: dict) -> ToolSpan:
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise _Reject("traceId", "a trace id is 16 bytes, not all zero")
    if len(span.span_id) != 8 or not any(span.span_id):
        raise _Reject("spanId", "a span id is 8 bytes, not all zero")
    if tenant is not None and not isinstance(tenant, str):
        raise _Reject("recovery.tenant", "must be a tenant's name (text)")
    tool = _text(attrs, "gen_ai.tool.name", required=True)
    agent = _text(attrs, "gen_ai.agent.name") or _text(resource, "gen_ai.agent.name")
    agent = agent or _text(resource, "service.name") or "unknown_service"
    key = _text(attrs, "recovery.idempotency_key", limit=255)
    if key is not None and not KEY_PATTERN.match(key):
        raise _Reject("recovery.idempotency_key", "must be 1 to 255 printable ASCII characters without spaces")
    return ToolSpan(
        trace_id=trace_id,
        span_id=span_id,
        tenant=tenant,
        agent=agent,
        tool=tool,
        tool_call_id=_text(attrs, "gen_ai.tool.call.id") or "",
        idempotency_key=key,
        arguments=_arguments(attrs.get("gen_ai.tool.call.arguments")),
        facts=_facts(span, attrs),
        started_at=_time(span.start_time_unix_nano),
    )


def _text(attrs: dict, name: str, *, required: bool = False, limit: int = MAX_NAME) -> str | None:
    value = attrs.get(name)
    if value is None or value == "":
        if required:
            raise _Reject(name, "required on an execute_tool span")
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise _Reject(name, f"must be text of at most {limit} characters")
    return value


def _arguments(value: Any) -> dict | None:
    name = "gen_ai.tool.call.arguments"
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = loads(value)
        except ValueError as exc:
            raise _Reject(name, f"must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise _Reject(name, "must be a JSON object (the tool's arguments by name)")
    return value


def _facts(span: Span, attrs: dict) -> dict:
    """The outcome's facts (an OutcomeIn body) from the span's attributes and status."""
    facts: dict[str, Any] = {}
    status = _status_code(attrs.get("http.response.status_code"))
    error_type = _text(attrs, "error.type", limit=100)
    if status is not None:
        facts.update(http_status=status, connection_opened=True, sent=True)
    elif error_type is not None or span.status.code == Status.STATUS_CODE_ERROR:
        error = {"kind": error_kind(error_type or ""), "code": error_type, "message": span.status.message or None}
        facts["error"] = {k: v for k, v in error.items() if v is not None} or {"code": "span_status_error"}
    else:
        facts["http_status"] = 200  # the span ended without an error: the tool returned
    sent = attrs.get("recovery.sent")
    if sent is not None:
        if not isinstance(sent, bool):
            raise _Reject("recovery.sent", "must be a boolean")
        facts["sent"] = sent
    provider_ref = _text(attrs, "recovery.provider_request_id", limit=255)
    if provider_ref is not None:
        facts["provider_request_id"] = provider_ref
    if "gen_ai.tool.call.result" in attrs:
        facts["result"] = _result(attrs["gen_ai.tool.call.result"])
    for name, nanos in (("started_at", span.start_time_unix_nano), ("finished_at", span.end_time_unix_nano)):
        at = _time(nanos)
        if at is not None:
            facts[name] = at.isoformat()
    message = facts.get("error", {}).get("message")
    if message is not None:
        facts["error"]["message"] = message[:20_000]
    return facts


def _status_code(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 100 <= value <= 599:
        raise _Reject("http.response.status_code", "must be an HTTP status code, 100 to 599")
    return value


def _result(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return loads(value)
        except ValueError:
            return value  # text the tool returned: kept as text
    return value


def _time(nanos: int) -> datetime | None:
    if not nanos:
        return None
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=nanos // 1000)


_KIND_WORDS = (
    ("connecttimeout", "connect_timeout"),
    ("refused", "connection_refused"),
    ("nameresolution", "dns"),
    ("gaierror", "dns"),
    ("getaddrinfo", "dns"),
    ("dns", "dns"),
    ("ssl", "tls"),
    ("tls", "tls"),
    ("certificate", "tls"),
    ("timeout", "read_timeout"),
    ("timedout", "read_timeout"),
    ("deadlineexceeded", "read_timeout"),
    ("reset", "reset"),
    ("remotedisconnected", "reset"),
    ("brokenpipe", "reset"),
    ("aborted", "reset"),
    ("incompleteread", "reset"),
    ("chunkedencoding", "reset"),
    ("jsondecode", "invalid_response"),
    ("invalidresponse", "invalid_response"),
    ("badstatusline", "invalid_response"),
)


def error_kind(error_type: str) -> str | None:
    """The transport error kind of docs/design/classification.md that `error.type` names, or None (sent unknown)."""
    if error_type in ERROR_KINDS:
        return error_type
    words = re.sub(r"[^a-z0-9]", "", error_type.lower())
    return next((kind for word, kind in _KIND_WORDS if word in words), None)


# --- attribute values ------------------------------------------------------------------------------------------------


def _attributes(pairs) -> dict[str, Any]:
    """Key-value attributes as plain values (the last of a repeated key wins); a value storage cannot keep rejects
    the span."""
    values = {}
    for pair in pairs:
        value = _value(pair.value)
        try:
            check_storable(value, pair.key)
            check_storable(pair.key)
        except ValueError as exc:
            raise _Reject(pair.key[:100] or "attributes", str(exc)) from None
        values[pair.key] = value
    return values


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {pair.key: _value(pair.value) for pair in value.kvlist_value.values}
    if kind == "bytes_value":
        return binascii.hexlify(value.bytes_value).decode()
    return getattr(value, kind)

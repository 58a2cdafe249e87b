"""`POST /api/v1/otlp/v1/traces`: OpenTelemetry trace ingest (docs/otlp-ingest.md). What OTLP/HTTP exporters send,
authenticated with a runtime token like the rest of the API, answered with OTLP's own `ExportTraceServiceResponse`
(`partial_success` naming what was rejected or is worth a warning); a body that cannot be read is refused whole with
the API's error envelope. Reading the body is recovery.api.otlp_decode; recording the spans, recovery.services.observed.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from ninja import Router
from pydantic import Field

from recovery.api import otlp_decode as otlp
from recovery.api.answers import Answer, ErrorOut
from recovery.audit.chain import Actor
from recovery.services.errors import Refusal
from recovery.services.observed import spans_ingest

router = Router(tags=["otlp"])

ERRORS = {code: ErrorOut for code in (400, 401, 403, 404, 409, 413, 415, 422, 426, 500, 503)}

_HEX_32 = {"type": "string", "pattern": "^[0-9a-fA-F]{32}$", "description": "32 hexadecimal digits."}
_HEX_16 = {"type": "string", "pattern": "^[0-9a-fA-F]{16}$", "description": "16 hexadecimal digits."}
# OTLP/JSON as far as the API checks it before the protobuf parser reads the rest (unknown fields are ignored, as
# OTLP asks of receivers): objects where objects go, and the ids in hex.
_SPAN = {"type": "object", "properties": {"traceId": _HEX_32, "spanId": _HEX_16}}
_JSON_REQUEST = {
    "type": "object",
    "description": "An OTLP/JSON ExportTraceServiceRequest (ids in hex, enums as numbers).",
    "properties": {
        "resourceSpans": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "resource": {"type": "object"},
                    "scopeSpans": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"scope": {"type": "object"}, "spans": {"type": "array", "items": _SPAN}},
                        },
                    },
                },
            },
        }
    },
}
_BINARY = {"type": "string", "format": "binary", "description": "An ExportTraceServiceRequest in protobuf."}
OPENAPI = {
    "requestBody": {
        "required": True,
        "description": "The spans, as an OTLP exporter sends them; `Content-Encoding: gzip` is accepted.",
        "content": {otlp.MEDIA_PROTOBUF: {"schema": _BINARY}, otlp.MEDIA_JSON: {"schema": _JSON_REQUEST}},
    },
    "responses": {
        200: {  # an int, as the document builder keys the answers (a "200" would replace its JSON one)
            "content": {
                otlp.MEDIA_PROTOBUF: {
                    "schema": {**_BINARY, "description": "An ExportTraceServiceResponse in protobuf."}
                }
            }
        }
    },
}


class OtlpPartialSuccessOut(Answer):
    rejectedSpans: str = Field(  # OTLP/JSON's own names
        "0", description="How many spans were rejected: an int64, as text as OTLP/JSON writes it."
    )
    errorMessage: str = Field(
        "", description="Each rejected span with its reason, then the spans ignored or kept apart, and why."
    )


class OtlpExportOut(Answer):
    """OTLP's ExportTraceServiceResponse in OTLP/JSON: empty when every span was recorded as an observed call."""

    partialSuccess: OtlpPartialSuccessOut | None = Field(
        None, description="Present when spans were rejected, or with 0 rejected as a warning."
    )


def _media(request: HttpRequest) -> str:
    media = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if media not in otlp.MEDIA_TYPES:
        raise Refusal(
            "unsupported_media_type",
            f"send OTLP traces as {otlp.MEDIA_PROTOBUF} or {otlp.MEDIA_JSON}",
            status=415,
            field_errors=[_field("Content-Type", " or ".join(otlp.MEDIA_TYPES), media or None, "Set the header.")],
        )
    return media


def _field(name: str, expected: str, received, suggestion: str) -> dict:
    return {"field": name, "expected": expected, "received": received, "suggestion": suggestion}


def _body(request: HttpRequest, media: str):
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    limit = settings.RECOVERY_API_MAX_BODY
    try:
        return otlp.decode(otlp.inflate(request.body, encoding=encoding, limit=limit), media)
    except otlp.BodyTooLarge:
        raise Refusal(
            "body_too_large",
            f"the request body is over {limit} bytes once decompressed: send fewer spans per request",
            status=413,
            detail={"limit": limit},
        ) from None
    except otlp.OtlpError as exc:
        if exc.field == "Content-Encoding":
            field = _field(exc.field, "gzip, identity or none", encoding, "Compress with gzip or not at all.")
            raise Refusal("unsupported_encoding", str(exc), status=415, field_errors=[field]) from None
        expected = f"an OTLP ExportTraceServiceRequest in {media}"
        field = _field(exc.field, expected, None, "Send what an OTLP/HTTP exporter sends.")
        message = f"the body is not an OTLP trace export: {exc}"
        raise Refusal("invalid_otlp", message, status=400, field_errors=[field]) from None


@router.post(
    "/v1/traces",
    response={200: OtlpExportOut, **ERRORS},
    openapi_extra=OPENAPI,
    summary="Export traces (OTLP/HTTP)",
    by_alias=True,
)
def export_traces(request: HttpRequest):
    """OpenTelemetry `execute_tool` spans become observed calls and their after-the-fact attempts; other spans are
    counted and ignored. Protobuf or OTLP/JSON, gzip allowed; the answer in the request's encoding."""
    media = _media(request)
    export = _body(request, media)
    token = request.api_token
    report = spans_ingest(batch=otlp.read_spans(export), tenants=list(token.tenant_list), actor=Actor.for_token(token))
    body = otlp.answer(rejected=len(report.rejected), message=report.message(), media=media)
    return HttpResponse(body, content_type=media, status=200)

"""One error envelope for every answer under /api/v1/ (docs/api.md), whoever produces it.
An unhandled exception is `internal_error` (500) with the request id the log line carries, or `database_unavailable`
(503 with Retry-After) when the database does not answer.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, JsonResponse

from recovery.api.inputs import MAX_BODY_DEPTH
from recovery.engine.storable import NotUtf8
from recovery.services.errors import Refusal

logger = logging.getLogger("recovery.api")

# How long a runtime should wait before resending after a 503: a database failover or restart takes seconds.
RETRY_AFTER_S = 2


def envelope(code: str, message: str, *, field_errors: Iterable[dict] = (), detail: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "field_errors": list(field_errors), "detail": detail or {}}}


def error_response(
    status: int, code: str, message: str, *, field_errors: Iterable[dict] = (), detail: dict | None = None
) -> JsonResponse:
    return JsonResponse(envelope(code, message, field_errors=field_errors, detail=detail), status=status)


def request_id(request: HttpRequest) -> str:
    """This request's id (made once): in the X-Request-Id header of every API answer, in 5xx bodies and logs."""
    rid = getattr(request, "request_id", None)
    if rid is None:
        rid = request.request_id = uuid.uuid4().hex
    return rid


def is_database_unavailable(exc: BaseException) -> bool:
    # Django wraps the driver's errors: a refused or dropped connection is an OperationalError (or, on a connection
    # already closed under it, an InterfaceError) — never a bug in the request.
    return isinstance(exc, OperationalError | InterfaceError)


def exception_response(request: HttpRequest, exc: BaseException) -> JsonResponse:
    """The answer to an exception nothing else handled, logged on one line with the request id."""
    rid = request_id(request)
    if is_database_unavailable(exc):
        logger.warning(
            "API %s %s: database_unavailable request_id=%s (%s: %s)",
            request.method,
            request.path,
            rid,
            type(exc).__name__,
            str(exc).strip().splitlines()[0] if str(exc).strip() else "",
        )
        response = error_response(
            503,
            "database_unavailable",
            f"the database is not answering: nothing was stored; send the request again in {RETRY_AFTER_S} s",
            detail={"request_id": rid, "retry_after_s": RETRY_AFTER_S},
        )
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
    logger.error("API %s %s: internal_error request_id=%s", request.method, request.path, rid, exc_info=exc)
    return error_response(
        500,
        "internal_error",
        "the server failed on this request; it is logged under this request id",
        detail={"request_id": rid},
    )


# What a status means when the answer came from Django rather than the API (a URL no route matches, a method the
# route does not take, a body over DATA_UPLOAD_MAX_MEMORY_SIZE...).
_BY_STATUS: dict[int, tuple[str, str]] = {
    400: (
        "bad_request",
        "the request is malformed (its line or a header, such as a Content-Length that is not a number)",
    ),
    401: ("unauthenticated", "send a valid, unrevoked API token: Authorization: Bearer <token>"),
    403: ("forbidden", "this request is not allowed"),
    404: ("not_found", "no such URL or object for this token's tenants (ids are plain decimal numbers)"),
    405: ("method_not_allowed", "this URL does not take this HTTP method"),
    413: ("body_too_large", "the request body is over the size limit"),
    # The web server's own refusals (console/gunicorn_worker.py; nginx's error pages in deploy/nginx.conf say the
    # same): what it cannot parse never reaches the application.
    414: ("uri_too_long", "the request line is over the web server's limit (8 KiB): shorten the URL"),
    417: ("expectation_failed", "the Expect header is not one the server meets: send the request without it"),
    431: (
        "headers_too_large",
        "the request's headers are over the web server's limits (8 KiB a header line; 100 headers, or 32 KiB in all "
        "through nginx): send fewer or smaller headers",
    ),
    501: ("not_implemented", "the request's transfer coding is not supported: send the body with Content-Length"),
}


def status_envelope(status: int, *, request_id: str, detail: dict[str, Any] | None = None) -> dict:
    """The envelope for a bare status: a non-JSON answer produced outside the API's handlers, or the web server's
    refusal of a request it could not parse. A 5xx carries the request id its log line has."""
    if status >= 500 and status not in _BY_STATUS:
        code, message = "internal_error", "the server failed on this request; it is logged under this request id"
        detail = {**(detail or {}), "request_id": request_id}
    else:
        code, message = _BY_STATUS.get(status, (f"http_{status}", f"the request was refused with HTTP {status}"))
    return envelope(code, message, detail=detail)


def status_response(request: HttpRequest, status: int, detail: dict[str, Any] | None = None) -> JsonResponse:
    """status_envelope as the application's answer."""
    return JsonResponse(status_envelope(status, request_id=request_id(request), detail=detail), status=status)


def unreadable_body(cause: ValueError | UnicodeDecodeError) -> Refusal:
    """The 400 for a body no schema could read: `invalid_encoding` naming what it is when it is not UTF-8, else
    `invalid_json` with the parser's word (not JSON, nested deeper than MAX_BODY_DEPTH)."""
    if isinstance(cause, NotUtf8):
        return Refusal(
            "invalid_encoding",
            str(cause),
            status=400,
            field_errors=[
                {
                    "field": "body",
                    "expected": "UTF-8 JSON without a byte order mark",
                    "received": cause.encoding,
                    "suggestion": "Encode the body as UTF-8 (Content-Type: application/json, or charset=utf-8).",
                }
            ],
            detail={"encoding": cause.encoding},
        )
    message = cause.msg if isinstance(cause, json.JSONDecodeError) else str(cause)
    field = {
        "field": "body",
        "expected": f"a JSON object nesting at most {MAX_BODY_DEPTH} levels",
        "received": None,
        "suggestion": "Send the body as UTF-8 JSON.",
    }
    return Refusal(
        "invalid_json", f"the request body is not acceptable JSON: {message}", status=400, field_errors=[field]
    )

"""gunicorn's worker for the console (deploy/gunicorn.conf.py): its own refusals of what it cannot parse are the API's
JSON envelope under /api/ (docs/api.md), as the application's answers are.

gunicorn answers a request it refuses before the application sees it — a header over limit_request_field_size, more
than limit_request_fields headers or over their total (431), a request line over limit_request_line (414), a
Content-Length that is not a number (400), a transfer coding it does not take (501) — with an HTML page of its own.
This worker keeps gunicorn's decision (the status, the access-log line, the warning) and writes the envelope instead,
with `Recovery-Api-Version` and `X-Request-Id` as every API answer has them. A request whose path gunicorn read and
that is not under /api/ keeps gunicorn's HTML; one whose path it could not read (a request line too long or
malformed) gets the envelope: browsers do not send those, API clients' bugs do.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from gunicorn import util
from gunicorn.http.message import Request
from gunicorn.workers.gthread import ThreadWorker

API_PREFIX = "/api/"
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3}) ")


class _Captured:
    """A socket stand-in that keeps what gunicorn's handle_error writes (its HTML page), for its status line."""

    def __init__(self) -> None:
        self.data = b""

    def gettimeout(self) -> float:
        return 0.0

    def sendall(self, data: bytes) -> None:
        self.data += data


def request_path(req: Any, exc: BaseException) -> str | None:
    """The path of the request gunicorn refused, if it read that far. The parser raises from inside the Request's
    constructor, so the half-built Request is reached through the traceback (or the error's `req`, which some carry)."""
    for found in (req, getattr(exc, "req", None)):
        if isinstance(found, Request) and found.path is not None:
            return found.path
    trace = exc.__traceback__
    while trace is not None:
        candidate = trace.tb_frame.f_locals.get("self")
        if isinstance(candidate, Request) and candidate.path is not None:
            return candidate.path
        trace = trace.tb_next
    return None


def refusal_answer(status: int, reason: str) -> bytes:
    """The whole HTTP answer: the envelope of recovery.api.errors for gunicorn's status, the API's headers."""
    from recovery.api.errors import status_envelope  # loaded in the worker, after Django's settings
    from recovery.api.versions import HEADER, api_version

    rid = uuid.uuid4().hex
    body = json.dumps(status_envelope(status, request_id=rid)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{HEADER}: {api_version()}\r\nX-Request-Id: {rid}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class ApiErrorWorker(ThreadWorker):
    """gunicorn's threaded worker (gthread), its refusals under /api/ written as the API's JSON envelope."""

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        path = request_path(req, exc)
        if path is not None and not path.startswith(API_PREFIX):
            super().handle_error(req, client, addr, exc)
            return
        captured = _Captured()
        super().handle_error(req, captured, addr, exc)  # gunicorn's status, log and access line; its page kept here
        found = _STATUS_LINE.match(captured.data)
        status = int(found.group(1)) if found else 500
        reason = captured.data.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)[-1] if found else "Error"
        try:
            util.write_nonblock(client, refusal_answer(status, reason))
        except Exception:  # the client is gone, as gunicorn's own write_error allows
            self.log.debug("Failed to send error message.")

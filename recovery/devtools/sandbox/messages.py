"""The sandbox's request and response values, independent of the HTTP server that carries them."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from recovery.devtools.sandbox.kinds import Rejection


@dataclass(frozen=True, kw_only=True)
class Request:
    method: str
    path: str  # decoded
    segments: tuple[str, ...]  # decoded one by one, so an encoded '/' inside a key stays inside its segment
    query: dict[str, str]
    headers: Mapping[str, str]  # case-insensitive lookups (http.server's message object)
    body: bytes
    received: float = field(default_factory=time.monotonic)  # when it arrived: injected latency counts from here

    @classmethod
    def from_target(cls, *, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Request:
        url = urlsplit(target)
        raw_segments = [part for part in url.path.split("/") if part]
        return cls(
            method=method.upper(),
            path=unquote(url.path),
            segments=tuple(unquote(part) for part in raw_segments),
            query=dict(parse_qsl(url.query)),
            headers=headers,
            body=body,
        )

    def json(self) -> Any:
        """The body as JSON; an empty body is an empty object. Raises Rejection for anything else."""
        if not self.body.strip():
            return {}
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # RecursionError: nested ~1,000 deep
            raise Rejection(400, "invalid_request", "The body must be JSON.", "body") from None


@dataclass(frozen=True, kw_only=True)
class Response:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    outcome: str = "answered"  # what the request log records; never sent

    def encode(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode()


@dataclass(frozen=True, kw_only=True)
class Drop:
    """Close the connection without writing a byte: the client sees the server disconnect."""

    outcome: str


def error(status: int, code: str, message: str, *, outcome: str = "rejected", **extra: Any) -> Response:
    return Response(status=status, body={"error": {"code": code, "message": message, **extra}}, outcome=outcome)


def rejected(rejection: Rejection) -> Response:
    return Response(status=rejection.status, body=rejection.body(), outcome="rejected")

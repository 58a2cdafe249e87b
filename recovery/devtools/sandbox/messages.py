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
        """The body as JSON — or, sent form-encoded, as Stripe reads its bracketed fields; an empty body is an empty
        object. Raises Rejection for anything else."""
        if not self.body.strip():
            return {}
        if (self.headers.get("Content-Type") or "").startswith("application/x-www-form-urlencoded"):
            return form_body(self.body)
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # RecursionError: nested ~1,000 deep
            raise Rejection(400, "invalid_request", "The body must be JSON.", "body") from None


def _form_value(text: str) -> Any:
    """A form field's text as the JSON value a typed API reads from it: true/false, integers, else the text."""
    if text in ("true", "false"):
        return text == "true"
    if text.isdigit() or (text.startswith("-") and text[1:].isdigit()):
        return int(text)
    return text


def _listed(node: Any) -> Any:
    """Objects whose keys are all indexes 0..n-1 become lists (`expand[0]`, `items[1][sku]`)."""
    if not isinstance(node, dict):
        return node
    items = {key: _listed(value) for key, value in node.items()}
    if items and all(key.isdigit() for key in items) and sorted(map(int, items)) == list(range(len(items))):
        return [items[str(i)] for i in range(len(items))]
    return items


def form_body(raw: bytes) -> dict[str, Any]:
    """A form-encoded body with Stripe's bracketed nesting (`metadata[order_id]=O-1&expand[0]=x`) as an object."""
    try:
        pairs = parse_qsl(raw.decode(), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        raise Rejection(400, "invalid_request", "The body must be JSON or form-encoded.", "body") from None
    root: dict[str, Any] = {}
    for name, text in pairs:
        head, _, rest = name.partition("[")
        parts = [head, *[part.rstrip("]") for part in rest.split("[")]] if rest else [head]
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise Rejection(400, "invalid_request", f"The field {name} is both a value and an object.", name)
        node[parts[-1]] = _form_value(text)
    listed = _listed(root)
    return listed if isinstance(listed, dict) else root


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


def shaped_error(status: int, code: str, message: str, shape: str, *, outcome: str) -> Response:
    """An error reply written as a real provider writes its own (docs/providers.md)."""
    if shape == "square":
        body: dict[str, Any] = {"errors": [{"category": "PAYMENT_METHOD_ERROR", "code": code, "detail": message}]}
    elif shape == "stripe":
        body = {"error": {"type": "card_error" if status == 402 else "invalid_request_error", "code": code}}
        body["error"]["message"] = message
    elif shape == "paypal":
        body = {"name": "UNPROCESSABLE_ENTITY", "message": message, "details": [{"issue": code}]}
    else:
        return error(status, code, message, outcome=outcome)
    return Response(status=status, body=body, outcome=outcome)


def rejected(rejection: Rejection) -> Response:
    return Response(status=rejection.status, body=rejection.body(), outcome="rejected")

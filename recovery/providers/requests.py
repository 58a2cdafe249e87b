"""A tool's own provider request (docs/actions.md, docs/registry.md, docs/providers.md): what a same-key replay sends,
and the masked copy a dry run shows. The body must be exactly what a runtime sends (recovery/devtools/agent.py): a
provider that keeps a fingerprint of a key's request refuses another. JSON or Stripe's form encoding, the key in a
header, a body field or nowhere, as the registry's `request` says. Explicit timeouts, no retry underneath; the wire
facts come from the client distribution's public helpers (`recovery_client.facts_from_response` /
`facts_from_exception`).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import requests
from recovery_client import facts_from_exception, facts_from_response
from requests.adapters import HTTPAdapter

from recovery.engine.validation import MISSING, resolve
from recovery.engine.wire import form_encode, form_scalar
from recovery.models import Call, Tool
from recovery.providers.status import outbound_headers
from recovery.registry.lookup import marker_paths

IDEMPOTENCY_HEADER = "Idempotency-Key"
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_WHOLE = re.compile(r"^\{([^{}]+)\}$")
NO_BODY = frozenset({"GET", "DELETE", "HEAD"})
JSON, FORM = "application/json", "application/x-www-form-urlencoded"


class TemplateError(ValueError):
    """The tool's request template needs a value the call does not have."""


@dataclass(frozen=True, kw_only=True)
class ProviderRequest:
    method: str
    url: str  # the query string included
    headers: dict[str, str] = field(repr=False)  # as sent: credentials included, never stored or shown
    shown_headers: dict[str, str]  # the same with secrets masked
    body: Any  # the body as a JSON value (what the encoding encodes), or None
    data: bytes | None = None  # the body's bytes, exactly as sent
    timeout: tuple[float, float]  # (connect, read) seconds
    request_id_header: str = "X-Request-Id"  # the reply header with the provider's request id

    def shown(self) -> dict:
        """What a plan lists: method, URL, masked headers and body, and a body that is not JSON as its very bytes."""
        shown = {"method": self.method, "url": self.url, "headers": dict(self.shown_headers), "body": self.body}
        if self.data is not None and self.shown_headers.get("Content-Type") != JSON:
            shown["body_text"] = self.data.decode()
        return shown


def filled_key(template: str, arguments: dict) -> str:
    """A tool's key template (the registry's `key_template`) filled with a call's arguments as a path is filled, not
    quoted; TemplateError when an argument it names is missing or null."""
    return fill_text(template, arguments, quoted=False)


def _values(call: Call) -> dict:
    # The key wins over an argument of the same name: it is the one thing a replay must not change.
    return {**(call.arguments if isinstance(call.arguments, dict) else {}), "idempotency_key": call.idempotency_key}


def _lookup(values: dict, name: str) -> Any:
    return resolve(values, name.strip())


def fill_text(text: str, values: dict, *, quoted: bool) -> str:
    """Every {placeholder} in `text` replaced by its value ({{ and }} are literal braces)."""

    def one(match: re.Match) -> str:
        value = _lookup(values, match.group(1))
        if value is MISSING or value is None:
            raise TemplateError(f"the request template needs {{{match.group(1)}}}, which the call's arguments lack")
        # str() for scalars, as the runtime fills a path (True -> "True"); JSON for objects and lists.
        text = json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else str(value)
        return quote(text, safe="") if quoted else text

    parts = text.split("{{")
    return "{".join("}".join(_PLACEHOLDER.sub(one, piece) for piece in part.split("}}")) for part in parts)


def fill_body(template: Any, values: dict) -> Any:
    if isinstance(template, dict):
        return {key: fill_body(value, values) for key, value in template.items()}
    if isinstance(template, list):
        return [fill_body(value, values) for value in template]
    if isinstance(template, str):
        whole = _WHOLE.match(template)
        if whole:
            value = _lookup(values, whole.group(1))
            return None if value is MISSING else value  # a missing optional argument is null, as the runtime sends
        if "{" in template:
            return fill_text(template, values, quoted=False)
    return template


def query_string(template: Any, values: dict) -> str:
    """The query string of the registry's `query` (lists as repeated parameters), without the '?'."""
    if not isinstance(template, dict):
        return ""
    pairs = []
    for name, item in fill_body(template, values).items():
        for value in item if isinstance(item, list) else [item]:
            if value is not None:
                pairs.append((name, form_scalar(value)))
    return urlencode(pairs, safe="[]")


def _key_place(template: dict, side_effect: str) -> dict | None:
    """Where the key goes (docs/providers.md): the registry's `request.key`, else a write's Idempotency-Key header."""
    if "key" in template:
        return template["key"] if isinstance(template["key"], dict) else None
    return {"header": IDEMPOTENCY_HEADER} if side_effect == "write" else None


def wire_of(tool: Tool) -> dict[str, str]:
    """What a runtime needs to send an admitted attempt of `tool` as the registry describes it (the admission answer's
    `wire`, docs/api.md): the header or body field of the key (empty: not that way), the body paths that carry the
    key as a marker a listing lookup matches (docs/providers.md) and the request id's header."""
    template = tool.request if isinstance(tool.request, dict) else {}
    place = _key_place(template, tool.side_effect) or {}
    return {
        "key_header": place.get("header", ""),
        "key_field": place.get("field", ""),
        "key_markers": marker_paths(template),
        "request_id_header": tool.provider.request_id_header or "X-Request-Id",
    }


def _encoded(body: Any, encoding: str) -> tuple[bytes | None, str]:
    """The body's bytes and content type; TemplateError (before anything is admitted or sent) when it cannot be."""
    if body is None:
        return None, ""
    if encoding == "form":
        if not isinstance(body, dict):
            raise TemplateError("a form body is an object of fields")
        return form_encode(body).encode(), FORM
    try:
        return json.dumps(body, allow_nan=False).encode(), JSON
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"the request body is not JSON ({exc})") from None


def tool_request(tool: Tool, call: Call) -> ProviderRequest:
    """The request `call` makes to its tool's provider, with the call's original idempotency key, encoded and keyed as
    the registry describes it (docs/providers.md): exactly what a runtime's recovered tool sends."""
    template = tool.request if isinstance(tool.request, dict) else {}
    method = str(template.get("method") or "POST").upper()
    encoding = template.get("encoding") or "json"
    values = _values(call)
    path = fill_text(str(template.get("path") or ""), values, quoted=True)
    if method in NO_BODY or encoding == "none":
        body = None
    elif template.get("body") is None:
        body = dict(call.arguments) if isinstance(call.arguments, dict) else call.arguments
    else:
        body = fill_body(template["body"], values)
    headers, shown = outbound_headers(tool.provider)
    place = _key_place(template, call.side_effect)
    if place and place.get("header"):
        headers[place["header"]] = shown[place["header"]] = call.idempotency_key
    elif place and place.get("field") and isinstance(body, dict):
        body = {**body, place["field"]: call.idempotency_key}
    data, content_type = _encoded(body, encoding)
    if content_type:
        headers["Content-Type"] = shown["Content-Type"] = content_type
    query = query_string(template.get("query"), values)
    if query:
        path += ("&" if "?" in path else "?") + query
    provider = tool.provider
    return ProviderRequest(
        method=method,
        url=provider.base_url.rstrip("/") + path,
        headers=headers,
        shown_headers=shown,
        body=body,
        data=data,
        timeout=(float(provider.connect_timeout_s), float(provider.read_timeout_s)),
        request_id_header=provider.request_id_header or "X-Request-Id",
    )


_local = threading.local()


def _session() -> requests.Session:
    """One keep-alive session per thread, retries off: only one layer retries (docs/design/budgets.md), and it is not
    this one."""
    session = getattr(_local, "session", None)
    if session is None:
        session = requests.Session()
        adapter = HTTPAdapter(max_retries=0)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        _local.session = session
    return session


def send(request: ProviderRequest) -> dict:
    """Send it once; the outcome facts (docs/design/classification.md) of what happened: a reply's status and result, or
    the exception's kind (a read timeout after sending is `read_timeout`: the effect may exist). Never raises for the
    network."""
    try:
        response = _session().request(
            request.method,
            request.url,
            headers=request.headers,
            data=request.data,
            timeout=request.timeout,
            allow_redirects=False,
        )
    except requests.RequestException as exc:
        return facts_from_exception(exc)
    facts = facts_from_response(response, provider_ref_header=request.request_id_header)
    if isinstance(facts.get("provider_request_id"), str):
        facts["provider_request_id"] = facts["provider_request_id"][:255]
    return facts

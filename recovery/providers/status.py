"""Status queries (docs/reconciliation.md): ask a provider what became of a call, by idempotency key or reference.
One request per check with the provider's timeouts and no retry underneath; the answer goes through the tool's
`status_map`, and what is kept for the receipt has its secrets masked.
"""

from __future__ import annotations

import os
import threading
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

import requests
from requests.adapters import HTTPAdapter

from recovery.engine.reconcile import Observation
from recovery.engine.redact import MASK, redact, redact_data
from recovery.engine.storable import loads
from recovery.engine.validation import MISSING, resolve
from recovery.models import Call, Provider, Tool

MAX_BODY = 64 * 1024  # what a receipt keeps of an answer; a status answer is small, a runaway one is cut


@dataclass(frozen=True, kw_only=True)
class StatusAnswer:
    observed: str  # an Observation: committed, not_committed, pending, failed, ambiguous
    provider_status: str = ""
    provider_ref: str = ""
    effects: int | None = None
    http_status: int | None = None
    request: dict = field(default_factory=dict)  # method, url, headers (secrets masked)
    response: dict = field(default_factory=dict)  # status, body (redacted)
    error: str = ""  # what went wrong, redacted: for the receipt's diagnostic
    endpoint_failed: bool = False  # counts against the status endpoint's breaker


_local = threading.local()


def status_session() -> requests.Session:
    """One keep-alive session per thread (checks run on worker threads); retries off: max_retries=0."""
    session = getattr(_local, "session", None)
    if session is None:
        session = requests.Session()
        # The environment's proxies read once, here, instead of requests scanning the environment (and looking for a
        # .netrc) on every status query: that was a tenth of a reconciliation worker's CPU.
        session.trust_env = False
        session.proxies = urllib.request.getproxies()
        adapter = HTTPAdapter(max_retries=0, pool_connections=4, pool_maxsize=16)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        _local.session = session
    return session


def outbound_headers(provider: Provider) -> tuple[dict[str, str], dict[str, str]]:
    """(headers to send, the same with secrets masked for the record). The secret comes from the environment
    variable the registry names; an unset variable sends no credential (the provider's 401 then says so)."""
    auth = provider.auth or {}
    kind, secret = auth.get("kind", "none"), os.environ.get(auth.get("secret_env", ""), "")
    headers = {"Accept": "application/json", "User-Agent": "recovery-console/1"}
    shown = dict(headers)
    if kind == "bearer" and secret:
        headers["Authorization"], shown["Authorization"] = f"Bearer {secret}", f"Bearer {MASK}"
    elif kind == "header" and secret:
        headers[auth["header"]], shown[auth["header"]] = secret, MASK
    return headers, shown


def status_url(tool: Tool, call: Call) -> str | None:
    """The status endpoint's URL for this call, its query string included (the key or reference may travel in either),
    or None when its template needs a provider reference we lack."""
    query = tool.status_query or {}
    path = query.get("path", "")
    params = query.get("query") if isinstance(query.get("query"), dict) else {}
    if "{provider_ref}" in path + "".join(map(str, params.values())) and not call.provider_ref:
        return None
    path = path.replace("{idempotency_key}", quote(call.idempotency_key, safe=""))
    path = path.replace("{provider_ref}", quote(call.provider_ref, safe=""))
    pairs = [(name, _filled(str(value), call)) for name, value in params.items()]
    return tool.provider.base_url.rstrip("/") + path + (f"?{urlencode(pairs)}" if pairs else "")


def _filled(text: str, call: Call) -> str:
    return text.replace("{idempotency_key}", call.idempotency_key).replace("{provider_ref}", call.provider_ref)


@dataclass(frozen=True)
class Reply:
    """A status endpoint's reply as received, read later (off the thread that keeps queries in flight)."""

    status_code: int
    content: bytes
    request: dict

    @property
    def endpoint_failed(self) -> bool:
        """Any error but 404 (an unknown key is an answer): it counts against the status endpoint's breaker."""
        return self.status_code >= 400 and self.status_code != 404


def query_status(tool: Tool, call: Call) -> StatusAnswer:
    """Ask the provider once. Never raises for what the network or the provider does: that is a `failed` answer."""
    fetched = fetch_status(tool, call)
    return read_status(tool, fetched) if isinstance(fetched, Reply) else fetched


def fetch_status(tool: Tool, call: Call) -> Reply | StatusAnswer:
    """The HTTP exchange alone of a lookup by key: the reply, or a StatusAnswer when there was none to read. The other
    kinds of lookup go through recovery.providers.listing.fetch_lookup; here they learn nothing."""
    kind = (tool.status_query or {}).get("kind") or "key"
    if kind != "key":
        return StatusAnswer(observed=Observation.AMBIGUOUS, error=f"a lookup of kind {kind!r} is no query by key")
    url = status_url(tool, call)
    method = (tool.status_query or {}).get("method", "GET")
    if url is None:
        return StatusAnswer(observed=Observation.AMBIGUOUS, error="the status query needs a provider reference")
    headers, shown = outbound_headers(tool.provider)
    record = {"method": method, "url": url, "headers": shown}
    timeout = (tool.provider.connect_timeout_s, tool.provider.read_timeout_s)
    try:
        reply = status_session().request(method, url, headers=headers, timeout=timeout, allow_redirects=False)
    except requests.RequestException as exc:
        error = redact(f"{type(exc).__name__}: {exc}")
        return StatusAnswer(observed=Observation.FAILED, request=record, error=error, endpoint_failed=True)
    return Reply(reply.status_code, reply.content[:MAX_BODY], record)


def read_status(tool: Tool, reply: Reply | StatusAnswer) -> StatusAnswer:
    """What a reply says, mapped through the tool's status_map (a StatusAnswer passes through)."""
    return _read(tool, reply, reply.request) if isinstance(reply, Reply) else reply


def _read(tool: Tool, reply: Reply, record: dict) -> StatusAnswer:
    raw = reply.content
    try:
        body = loads(raw) if raw else None  # bounded: a provider's reply is text from outside too
    except ValueError:
        body = None
    shown = redact_data(body) if body is not None else redact(raw.decode("utf-8", "replace"))
    common = {
        "http_status": reply.status_code,
        "request": record,
        "response": {"status": reply.status_code, "body": shown},
    }
    if reply.endpoint_failed:
        said = "answered" if reply.status_code >= 500 or reply.status_code == 429 else "refused the query:"
        error = f"the status endpoint {said} {reply.status_code}"
        return StatusAnswer(observed=Observation.FAILED, error=error, endpoint_failed=True, **common)
    query = tool.status_query or {}
    status = resolve(body, query.get("status_field") or "status") if isinstance(body, dict) else MISSING
    if reply.status_code == 404 and status is MISSING:
        status = "not_found"  # a provider that answers an unknown key with a bare 404
    if not isinstance(status, str):
        return StatusAnswer(observed=Observation.AMBIGUOUS, error="no status string in the answer", **common)
    observed = (query.get("status_map") or {}).get(status)
    if observed is None:
        error = f"status {status[:64]!r} is not in the tool's status_map"
        return StatusAnswer(observed=Observation.AMBIGUOUS, provider_status=status[:64], error=error, **common)
    return StatusAnswer(
        observed=observed,
        provider_status=status[:64],
        provider_ref=_text(body, tool.provider_ref_field)[:255],
        effects=_count(body, query.get("effects_field")),
        **common,
    )


def _text(body: dict, path: str) -> str:
    value = resolve(body, path) if path else MISSING
    return str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""


def _count(body: dict, path: str | None) -> int | None:
    value = resolve(body, path) if path else MISSING
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

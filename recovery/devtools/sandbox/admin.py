"""The `/_sandbox/*` admin routes: health, reset, config, faults, and the evidence (ledger, request and callback logs).
No authentication, on purpose: never expose the sandbox beyond localhost (docs/sandbox.md).
"""

from __future__ import annotations

from typing import Any, Protocol

from recovery.devtools.sandbox.callbacks import CallbackDispatcher
from recovery.devtools.sandbox.faults import FaultBook, FaultSpecError
from recovery.devtools.sandbox.kinds import Rejection
from recovery.devtools.sandbox.messages import Request, Response, error, rejected
from recovery.devtools.sandbox.store import Store


class _Settings(Protocol):
    api_key: str | None
    latency_ms: int
    status_latency_ms: int


class Sandbox(Protocol):
    """What the admin routes reach of the sandbox (recovery.devtools.sandbox.app.Sandbox, which routes to them)."""

    config: _Settings
    list_lag_ms: int
    store: Store
    faults: FaultBook
    callbacks: CallbackDispatcher


def handle(sandbox: Sandbox, request: Request) -> Response:
    name = request.segments[1] if len(request.segments) == 2 else ""
    handler = ROUTES.get((request.method, name))
    if handler is None:
        return error(404, "not_found", f"No admin route {request.method} {request.path}.")
    try:
        return handler(sandbox, request)
    except Rejection as rejection:
        return rejected(rejection)


def _ok(body: Any, status: int = 200) -> Response:
    return Response(status=status, body=body)


def _health(sandbox: Sandbox, request: Request) -> Response:
    return _ok({"ok": True})


def _reset(sandbox: Sandbox, request: Request) -> Response:
    # Callbacks first: a delivery queued before the reset must not land in the fresh log.
    sandbox.callbacks.reset()
    sandbox.faults.clear()
    sandbox.store.reset()
    sandbox.list_lag_ms = 0
    return _ok({"ok": True})


def _ledger(sandbox: Sandbox, request: Request) -> Response:
    key = request.query.get("key")
    entries = sandbox.store.ledger(key)
    if key is not None:
        return _ok({"key": key, "effects": len(entries), "entries": entries})
    by_key: dict[str, int] = {}
    for entry in entries:
        by_key[entry["key"]] = by_key.get(entry["key"], 0) + 1
    return _ok({"effects": len(entries), "by_key": by_key, "entries": entries})


def _requests(sandbox: Sandbox, request: Request) -> Response:
    query = request.query
    return _ok(
        sandbox.store.requests(path_prefix=query.get("path_prefix"), key=query.get("key"), method=query.get("method"))
    )


def _callbacks(sandbox: Sandbox, request: Request) -> Response:
    return _ok(sandbox.store.callbacks())


def _faults(sandbox: Sandbox, request: Request) -> Response:
    return _ok([fault.as_json() for fault in sandbox.faults.list()])


def _add_fault(sandbox: Sandbox, request: Request) -> Response:
    try:
        fault = sandbox.faults.add(request.json())
    except FaultSpecError as exc:
        return error(400, "invalid_request", str(exc), field=exc.field)
    return _ok(fault.as_json(), 201)


def _clear_faults(sandbox: Sandbox, request: Request) -> Response:
    return _ok({"cleared": sandbox.faults.clear()})


def _config_body(sandbox: Sandbox) -> dict[str, Any]:
    config = sandbox.callbacks.config
    return {
        "callback_url": config.url,
        "callback_secret_set": bool(config.secret),
        "api_key_required": bool(sandbox.config.api_key),
        "latency_ms": sandbox.config.latency_ms,
        "status_latency_ms": sandbox.config.status_latency_ms,
        "list_lag_ms": sandbox.list_lag_ms,
    }


def _config(sandbox: Sandbox, request: Request) -> Response:
    return _ok(_config_body(sandbox))


def _configure(sandbox: Sandbox, request: Request) -> Response:
    body = request.json()
    if not isinstance(body, dict) or set(body) - {"callback_url", "callback_secret", "list_lag_ms"}:
        return error(400, "invalid_request", "Send a JSON object with callback_url, callback_secret or list_lag_ms.")
    lag = body.get("list_lag_ms", sandbox.list_lag_ms)
    if isinstance(lag, bool) or not isinstance(lag, int) or not 0 <= lag <= 600_000:
        return error(400, "invalid_request", "list_lag_ms must be an integer of 0 to 600000.", field="list_lag_ms")
    sandbox.list_lag_ms = lag
    changes = {}
    for field, name in (("callback_url", "url"), ("callback_secret", "secret")):
        if field in body:
            if body[field] is not None and not isinstance(body[field], str):
                return error(400, "invalid_request", f"{field} must be a string or null.", field=field)
            changes[name] = body[field] or None
    sandbox.callbacks.configure(**changes)
    return _ok(_config_body(sandbox))


ROUTES = {
    ("GET", "health"): _health,
    ("POST", "reset"): _reset,
    ("GET", "ledger"): _ledger,
    ("GET", "requests"): _requests,
    ("GET", "callbacks"): _callbacks,
    ("GET", "faults"): _faults,
    ("POST", "faults"): _add_fault,
    ("DELETE", "faults"): _clear_faults,
    ("GET", "config"): _config,
    ("POST", "config"): _configure,
}

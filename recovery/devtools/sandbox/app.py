"""Routing and the business routes: order reads, the writes, and their status by idempotency key or reference. The
gates every request passes, in order, and where latency is slept: docs/sandbox.md ("How it is built").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from recovery.devtools.sandbox import admin
from recovery.devtools.sandbox.callbacks import CallbackConfig, CallbackDispatcher, Event
from recovery.devtools.sandbox.faults import FaultBook, Target
from recovery.devtools.sandbox.kinds import ORDER_ID, WRITE_KINDS, Rejection, WriteKind, synthetic_total_cents
from recovery.devtools.sandbox.messages import Drop, Request, Response, error, rejected, shaped_error
from recovery.devtools.sandbox.store import Store, WriteObject, now_iso

log = logging.getLogger(__name__)

REPLICA_LAG = timedelta(minutes=2)
BODY_KEY = "idempotency_key"  # where a write's key may come instead of the Idempotency-Key header (Square's way)


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    db_path: str
    api_key: str | None = None
    callback_url: str | None = None
    callback_secret: str | None = None
    latency_ms: int = 0
    status_latency_ms: int = 0


@dataclass(frozen=True, kw_only=True)
class Route:
    method: str
    pattern: tuple[str, ...]  # literal segments and {param} placeholders
    category: str  # read | status | write
    handler: str
    kind: WriteKind | None = None
    replica: bool = False

    def match(self, segments: tuple[str, ...]) -> dict[str, str] | None:
        if len(segments) != len(self.pattern):
            return None
        params = {}
        for part, segment in zip(self.pattern, segments, strict=True):
            if part.startswith("{"):
                params[part[1:-1]] = segment
            elif part != segment:
                return None
        return params


def _write_key(request: Request) -> str | None:
    """A write's idempotency key: the Idempotency-Key header, else the body's `idempotency_key` (JSON or form)."""
    key = request.headers.get("Idempotency-Key")
    if key:
        return key
    try:
        body = request.json()
    except Rejection:
        return None  # the write itself rejects the body
    found = body.get(BODY_KEY) if isinstance(body, dict) else None
    return found if isinstance(found, str) and found else None


def _pattern(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part)


def _routes() -> list[Route]:
    routes = [
        Route(method="GET", pattern=("orders", "{order_id}"), category="read", handler="read"),
        Route(method="GET", pattern=("replica", "orders", "{order_id}"), category="read", handler="read", replica=True),
    ]
    for kind in WRITE_KINDS:
        routes.append(
            Route(method=kind.method, pattern=_pattern(kind.path), category="write", handler="write", kind=kind)
        )
        routes.append(
            Route(method="GET", pattern=_pattern(kind.status_path), category="status", handler="by_key", kind=kind)
        )
        if kind.has_ref_route:
            pattern = (*_pattern(kind.status_path)[:-2], "{ref}")
            routes.append(Route(method="GET", pattern=pattern, category="status", handler="by_ref", kind=kind))
            listing = (*_pattern(kind.status_path)[:-2], "list")
            routes.append(Route(method="GET", pattern=listing, category="status", handler="listing", kind=kind))
    # Literal segments first, so /orders/by-key/K is never read as an order id.
    return sorted(routes, key=lambda route: sum(part.startswith("{") for part in route.pattern))


@dataclass(kw_only=True)
class Exchange:
    """One business request on its way through the gates."""

    request: Request
    route: Route
    params: dict[str, str]
    key: str | None
    delay_s: float = 0.0
    paused: bool = field(default=False)

    @property
    def target(self) -> Target:
        return Target(method=self.request.method, path=self.request.path, key=self.key)

    def pause(self) -> None:
        """Hold the answer until `delay_s` after the request arrived: a provider "answering in 50 ms" answers 50 ms
        after the request, its own handling included."""
        if not self.paused and self.delay_s > 0:
            time.sleep(max(0.0, self.delay_s - (time.monotonic() - self.request.received)))
        self.paused = True


class Sandbox:
    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.store = Store(config.db_path)
        self.faults = FaultBook()
        self.callbacks = CallbackDispatcher(
            self.store, CallbackConfig(url=config.callback_url, secret=config.callback_secret)
        )
        self.routes = _routes()
        self.list_lag_ms = 0  # how long a new object stays out of the listings (a search's lag): /_sandbox/config

    def handle(self, request: Request) -> Response | Drop:
        if request.path == "/_sandbox" or request.path.startswith("/_sandbox/"):
            return admin.handle(self, request)
        received = now_iso()
        key: str | None = None
        try:
            result, key = self._business(request)
        except Exception:  # the log must still show the request, and the client gets JSON rather than a reset
            log.exception("sandbox: %s %s failed", request.method, request.path)
            result = error(500, "internal_error", "The sandbox failed; see its stderr.", outcome="error")
        self.store.log_request(
            at=received,
            method=request.method,
            path=request.path,
            key=key,
            status=result.status if isinstance(result, Response) else None,
            outcome=result.outcome,
        )
        return result

    def _business(self, request: Request) -> tuple[Response | Drop, str | None]:
        matches = [(route, route.match(request.segments)) for route in self.routes]
        matches = [(route, params) for route, params in matches if params is not None]
        if not matches:
            return error(404, "not_found", f"No route {request.path}."), None
        found = next(((route, params) for route, params in matches if route.method == request.method), None)
        if found is None:
            allowed = ", ".join(sorted({route.method for route, _ in matches}))
            return error(405, "method_not_allowed", f"Use {allowed} on {request.path}."), None
        route, params = found
        key = _write_key(request) if route.category == "write" else params.get("idempotency_key")
        if not self._authorized(request):
            return error(401, "unauthorized", "Send Authorization: Bearer <the sandbox API key>."), key
        if route.category == "write" and not key:
            message = "Send an Idempotency-Key header (or an idempotency_key field) with every write."
            return error(400, "idempotency_key_required", message), None
        x = Exchange(request=request, route=route, params=params, key=key)
        result = self._gated(x)
        x.pause()
        return result, key

    def _authorized(self, request: Request) -> bool:
        if not self.config.api_key:
            return True
        given = request.headers.get("Authorization") or ""
        return hmac.compare_digest(given.encode(), f"Bearer {self.config.api_key}".encode())

    def _gated(self, x: Exchange) -> Response | Drop:
        x.delay_s = self.config.latency_ms / 1000
        if x.route.category == "status":
            x.delay_s += self.config.status_latency_ms / 1000
        if fault := self.faults.take("latency", x.target):
            x.delay_s += fault.params["ms"] / 1000
        if self.faults.take("drop_before_commit", x.target):
            x.pause()
            return Drop(outcome="dropped_before_commit")
        if fault := self.faults.take("rate_limit", x.target):
            seconds = fault.params["retry_after_s"]
            message = f"Too many requests; retry after {seconds} s."
            response = error(429, "rate_limited", message, outcome="rate_limited", retry_after_s=seconds)
            response.headers["Retry-After"] = str(math.ceil(seconds))
            return response
        if fault := self.faults.take("error", x.target):
            status, code, shape = fault.params["status"], fault.params["code"], fault.params["shape"]
            return shaped_error(status, code, "Injected failure.", shape, outcome="error_injected")
        if x.route.category == "status" and (fault := self.faults.take("status_down", x.target)):
            return error(fault.params["status"], "status_unavailable", "Status API down.", outcome="status_down")
        try:
            result = getattr(self, f"_{x.route.handler}")(x)
        except Rejection as rejection:
            return rejected(rejection)
        return self._mangled(x, result)

    def _mangled(self, x: Exchange, result: Response | Drop) -> Response | Drop:
        """A `bad_result` fault: this 2xx answer of a read or write goes out with fields dropped or changed. What the
        provider did and stored is untouched (a replay of the write answers the true body), so the client holds a
        reply that fails its validation while the effect exists."""
        if x.route.category == "status" or not isinstance(result, Response) or not 200 <= result.status < 300:
            return result
        if not isinstance(result.body, dict) or not (fault := self.faults.take("bad_result", x.target)):
            return result
        body = {name: value for name, value in result.body.items() if name not in fault.params["drop"]}
        body.update(fault.params["set"])
        return Response(status=result.status, body=body, headers=dict(result.headers), outcome="bad_result")

    # Reads.

    def _read(self, x: Exchange) -> Response:
        order_id = x.params["order_id"]
        row = self.store.order(order_id)
        if row is None and not ORDER_ID.match(order_id):
            return error(404, "order_not_found", f"No order {order_id}.")
        as_of = datetime.now(UTC) - (REPLICA_LAG if x.route.replica else timedelta(0))
        body = {
            "order_id": order_id,
            # Any O-<digits> order the sandbox never saw is a paid one, so demo agents can look up any id.
            "status": row["status"] if row else "paid",
            "total_cents": row["total_cents"] if row else synthetic_total_cents(order_id),
            "as_of": as_of.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        }
        if row and row["customer_id"]:
            body["customer_id"] = row["customer_id"]
        return Response(status=200, body=body)

    # Status.

    def _by_key(self, x: Exchange) -> Response:
        kind, key = x.route.kind, x.params["idempotency_key"]
        obj = self._checked(kind, self.store.object_by_key(kind.name, key))
        if obj is None:
            record = self.store.idempotency_get(kind.name, key)
            # A claimed key whose request is still executing is, to the outside, pending.
            status = "pending" if record and record.in_flight else "not_found"
            return Response(status=200, body=self._status_body(kind, key, None, status))
        return Response(status=200, body=self._status_body(kind, key, obj, obj.status))

    def _by_ref(self, x: Exchange) -> Response:
        kind = x.route.kind
        obj = self._checked(kind, self.store.object_by_ref(kind.name, x.params["ref"]))
        if obj is None:
            return error(404, "not_found", f"No {kind.ref_field} {x.params['ref']}.")
        return Response(status=200, body=self._status_body(kind, obj.key, obj, obj.status))

    def _listing(self, x: Exchange) -> Response:
        """`GET /refunds/list?order_id=…&limit=…&starting_after=ref`: the kind's objects in creation order, filtered
        on item fields, as Stripe lists a charge's refunds; each carries the `metadata` its request sent. An object
        younger than the list lag is not listed yet (an eventually consistent search)."""
        kind, query = x.route.kind, dict(x.request.query)
        try:
            limit = min(max(int(query.pop("limit", "10")), 1), 100)
        except ValueError:
            raise Rejection(400, "invalid_request", "limit must be an integer.", "limit") from None
        after = query.pop("starting_after", None)
        visible_before = datetime.now(UTC) - timedelta(milliseconds=self.list_lag_ms)
        items = []
        for obj, request_body, created_at in self.store.list_objects(kind.name, after_ref=after):
            if datetime.fromisoformat(created_at.replace("Z", "+00:00")) > visible_before:
                continue
            metadata = request_body.get("metadata") if isinstance(request_body, dict) else None
            item = {kind.ref_field: obj.ref, **obj.data, "status": obj.status, "created_at": created_at}
            item["metadata"] = metadata if isinstance(metadata, dict) else {}
            if all(str(item.get(name)) == value for name, value in query.items()):
                items.append(item)
        body = {"object": "list", "data": items[:limit], "has_more": len(items) > limit}
        return Response(status=200, body=body)

    def _checked(self, kind: WriteKind, obj: WriteObject | None) -> WriteObject | None:
        """Count this query against a pending object; the query that resolves it also sends its callback."""
        if obj is None or obj.status != "pending":
            return obj
        obj, resolved = self.store.check_pending(kind.name, obj.key)
        if resolved and obj is not None:
            self._send_callback(kind, obj)
        return obj

    def _status_body(self, kind: WriteKind, key: str, obj: WriteObject | None, status: str) -> dict[str, Any]:
        body = dict(obj.data) if obj else {}
        body.update(
            {
                "status": status,
                kind.ref_field: obj.ref if obj else None,
                "effects": self.store.effects(kind.name, key),
                "idempotency_key": key,
            }
        )
        if obj and kind.name == "access.grants":
            body["revoked"] = obj.state == "revoked"
        return body

    # Writes.

    def _write(self, x: Exchange) -> Response | Drop:
        kind, key, request = x.route.kind, x.key or "", x.request
        body = request.json()
        if not isinstance(body, dict):
            raise Rejection(400, "invalid_request", "The body must be a JSON object.", "body")
        if (
            "Idempotency-Key" not in request.headers
        ):  # the key came in the body (Square's way): not a field of the write
            body = {name: value for name, value in body.items() if name != BODY_KEY}
        canonical = json.dumps([request.method, request.path, body], sort_keys=True, separators=(",", ":"))
        fingerprint = hashlib.sha256(canonical.encode()).hexdigest()
        # Broken mode: keys are neither checked nor claimed, so every request executes anew.
        honour_keys = self.faults.take("ignore_keys", x.target) is None
        with self.store.transaction():
            record = self.store.idempotency_get(kind.name, key) if honour_keys else None
            if record is not None:
                return self._replay(record, fingerprint)
            data = kind.build(body, x.params, self.store)
            if honour_keys:
                self.store.idempotency_claim(kind.name, key, fingerprint)
        x.pause()
        try:
            response, obj = self._execute(x, kind, body, data, fingerprint)
        except BaseException:
            if honour_keys:
                self.store.idempotency_release(kind.name, key)
            raise
        if obj.status != "pending":
            self._send_callback(kind, obj)
        if self.faults.take("commit_then_drop", x.target):
            return Drop(outcome="dropped_after_commit")
        return response

    def _replay(self, record: Any, fingerprint: str) -> Response:
        if record.fingerprint != fingerprint:
            return error(
                422, "idempotency_key_reused", "This Idempotency-Key was used with a different request; use a new key."
            )
        if record.in_flight:
            return error(409, "idempotency_key_in_flight", "A request with this Idempotency-Key is still in flight.")
        return Response(
            status=record.response_status,
            body=record.response_body,
            headers={"Idempotent-Replayed": "true"},
            outcome="replayed",
        )

    def _execute(
        self, x: Exchange, kind: WriteKind, body: dict[str, Any], data: dict[str, Any], fingerprint: str
    ) -> tuple[Response, WriteObject]:
        pending = self.faults.take("pending", x.target)
        if "amount_cents" in data and (partial := self.faults.take("partial", x.target)):
            data = {**data, "amount_cents": partial.params["amount_cents"]}
        ref = kind.new_ref(x.params)
        status = "pending" if pending else kind.ok_status
        obj = WriteObject(
            kind=kind.name, key=x.key or "", ref=ref, status=status, route=x.request.path, data=data, state=None
        )
        final = kind.failed_status if pending and pending.params["final"] == "failed" else kind.ok_status
        response = Response(
            status=202 if pending else 200,
            body={kind.ref_field: ref, **data, "status": status},
            outcome="accepted" if pending else "answered",
        )
        with self.store.transaction():
            self.store.record_write(
                obj=obj,
                request_body=body,
                fingerprint=fingerprint,
                pending_checks=pending.params["checks"] if pending else None,
                final_status=final,
                response_status=response.status,
                response_body=response.body,
            )
        return response, obj

    def _send_callback(self, kind: WriteKind, obj: WriteObject) -> None:
        if not self.callbacks.config.url:
            return
        target = Target(method=kind.method, path=obj.route, key=obj.key)
        duplicate = self.faults.take("duplicate_callbacks", target)
        delayed = self.faults.take("delayed_callbacks", target)
        event = Event(
            type=f"{kind.name}.{obj.status}",
            idempotency_key=obj.key,
            status=obj.status,
            provider_ref=obj.ref,
            effects=self.store.effects(kind.name, obj.key),
        )
        copies = duplicate.params["copies"] if duplicate else 1
        if not delayed or delayed.params["ms"] == 0:
            self.callbacks.send(event, copies=copies)
            return
        generation = self.faults.generation

        def later() -> None:
            if self.faults.generation == generation:  # not reset (or the faults cleared) in the meantime
                self.callbacks.send(event, copies=copies)

        timer = threading.Timer(delayed.params["ms"] / 1000, later)
        timer.daemon = True  # a stopping sandbox never waits for a held-back callback
        timer.start()

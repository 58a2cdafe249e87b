"""The provider's write operations: route, reference, statuses, and how each validates its request.

Each write kind is named after its status namespace (`/refunds/by-key/...` → "refunds"); the name also scopes
idempotency keys and prefixes callback event types ("refunds.succeeded").
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

ORDER_ID = re.compile(r"^O-\d+$")


class Lookup(Protocol):
    def order_known(self, order_id: str) -> bool: ...

    def grant_known(self, grant_id: str) -> bool: ...


class Rejection(Exception):
    """A request refused before anything was executed; like Stripe, it stores no idempotency record."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}


def invalid(field: str, message: str) -> Rejection:
    return Rejection(400, "invalid_request", message, field)


Build = Callable[[dict[str, Any], dict[str, str], Lookup], dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class WriteKind:
    name: str
    method: str
    path: str  # the write route, with {param} segments
    ref_field: str  # the response field holding the provider reference (the registry's provider_ref_field)
    ref_prefix: str
    ok_status: str
    failed_status: str
    build: Build  # validates the request (raises Rejection) and returns the response's business fields
    ref_param: str | None = None  # the reference is this path parameter instead of a new id (a revocation)
    has_ref_route: bool = True  # GET /<name>/{ref} answers the status by reference

    @property
    def status_path(self) -> str:
        return f"/{self.name.replace('.', '/')}/by-key/{{idempotency_key}}"

    def new_ref(self, params: dict[str, str]) -> str:
        if self.ref_param:
            return params[self.ref_param]
        if self.name == "orders":
            # Orders are referenced as O-<digits> because the other tools' schemas require that pattern.
            return f"O-{secrets.randbelow(9 * 10**8) + 10**8}"
        return f"{self.ref_prefix}{secrets.token_hex(8)}"


def _text(body: dict[str, Any], field: str, *, required: bool = True, choices: tuple[str, ...] = ()) -> str | None:
    value = body.get(field)
    if value is None:
        if required:
            raise invalid(field, f"{field} is required.")
        return None
    if not isinstance(value, str) or not value.strip():
        raise invalid(field, f"{field} must be a non-empty string.")
    if choices and value not in choices:
        raise invalid(field, f"{field} must be one of {', '.join(choices)}.")
    return value


def _cents(body: dict[str, Any], field: str) -> int:
    value = body.get(field)
    if value is None:
        raise invalid(field, f"{field} is required.")
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(field, f"{field} must be an integer number of cents.")
    if value < 1:
        raise invalid(field, f"{field} must be at least 1 cent.")
    return value


def sku_price_cents(sku: str) -> int:
    return 500 + int(hashlib.sha256(sku.encode()).hexdigest()[:8], 16) % 9500


def synthetic_total_cents(order_id: str) -> int:
    return 1000 + int(hashlib.sha256(order_id.encode()).hexdigest()[:8], 16) % 99000


def _order(body: dict[str, Any], params: dict[str, str], lookup: Lookup) -> dict[str, Any]:
    customer_id = _text(body, "customer_id")
    items = body.get("items")
    if not isinstance(items, list) or not items:
        raise invalid("items", "items must be a non-empty list of {sku, quantity}.")
    total = 0
    for item in items:
        if not isinstance(item, dict):
            raise invalid("items", "each item must be an object with sku and quantity.")
        sku = _text(item, "sku")
        quantity = item.get("quantity")
        if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity < 1:
            raise invalid("items", "each item's quantity must be an integer of at least 1.")
        total += sku_price_cents(sku or "") * quantity
    return {"customer_id": customer_id, "total_cents": total}


def _cancellation(body: dict[str, Any], params: dict[str, str], lookup: Lookup) -> dict[str, Any]:
    order_id = params["order_id"]
    if not ORDER_ID.match(order_id) and not lookup.order_known(order_id):
        raise Rejection(404, "order_not_found", f"No order {order_id}.", "order_id")
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise invalid("reason", "reason must be a string.")
    return {"order_id": order_id, "reason": reason}


def _money_movement(body: dict[str, Any], params: dict[str, str], lookup: Lookup) -> dict[str, Any]:
    return {"order_id": _text(body, "order_id"), "amount_cents": _cents(body, "amount_cents")}


def _shipment(body: dict[str, Any], params: dict[str, str], lookup: Lookup) -> dict[str, Any]:
    order_id = _text(body, "order_id")
    if not isinstance(body.get("address"), dict):
        raise invalid("address", "address must be an object with line1, city, postcode and country.")
    for field in ("line1", "city", "postcode", "country"):
        try:
            _text(body["address"], field)
        except Rejection:
            raise invalid(f"address.{field}", f"address.{field} is required.") from None
    service = _text(body, "service", choices=("standard", "express"))
    return {"order_id": order_id, "service": service}


def _grant(body: dict[str, Any], params: dict[str, str], lookup: Lookup) -> dict[str, Any]:
    return {
        "user_id": _text(body, "user_id"),
        "role": _text(body, "role", choices=("viewer", "editor", "admin")),
        "resource": _text(body, "resource"),
    }


def _revocation(body: dict[str, Any], params: dict[str, str], lookup: Lookup) -> dict[str, Any]:
    if not lookup.grant_known(params["grant_id"]):
        raise Rejection(404, "grant_not_found", f"No access grant {params['grant_id']}.", "grant_id")
    return {}


WRITE_KINDS: tuple[WriteKind, ...] = (
    WriteKind(
        name="orders", method="POST", path="/orders", ref_field="order_id", ref_prefix="O-",
        ok_status="created", failed_status="failed", build=_order, has_ref_route=False,
    ),
    WriteKind(
        name="cancellations", method="POST", path="/orders/{order_id}/cancel", ref_field="cancellation_id",
        ref_prefix="ca_", ok_status="cancelled", failed_status="failed", build=_cancellation,
    ),
    WriteKind(
        name="payments", method="POST", path="/payments", ref_field="payment_id", ref_prefix="py_",
        ok_status="captured", failed_status="failed", build=_money_movement,
    ),
    WriteKind(
        name="refunds", method="POST", path="/refunds", ref_field="refund_id", ref_prefix="re_",
        ok_status="succeeded", failed_status="failed", build=_money_movement,
    ),
    WriteKind(
        name="shipments", method="POST", path="/shipments", ref_field="shipment_id", ref_prefix="sh_",
        ok_status="booked", failed_status="failed", build=_shipment,
    ),
    WriteKind(
        name="access.grants", method="POST", path="/access/grants", ref_field="grant_id", ref_prefix="gr_",
        ok_status="active", failed_status="denied", build=_grant,
    ),
    WriteKind(
        name="access.revocations", method="DELETE", path="/access/grants/{grant_id}", ref_field="grant_id",
        ref_prefix="gr_", ok_status="revoked", failed_status="failed", build=_revocation, ref_param="grant_id",
        has_ref_route=False,
    ),
)  # fmt: skip

KINDS_BY_NAME = {kind.name: kind for kind in WRITE_KINDS}

"""Fault injection: what the sandbox should do wrong, for which requests, and how many times. Faults live in memory
and each kind is taken where it acts, so `times` counts the requests it really changed (docs/sandbox.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


class FaultSpecError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# kind → {param: (default, validator)}; a default of None makes the param required.
def _int_between(low: int, high: int):
    def check(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

    return check


def _number_at_least(low: float):
    def check(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and value >= low

    return check


def _field_names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(name, str) and name for name in value)


def _fields(value: Any) -> bool:
    return isinstance(value, dict)


ERROR_SHAPES = ("sandbox", "square", "stripe", "paypal")
PARAMS: dict[str, dict[str, tuple[Any, Any]]] = {
    "latency": {"ms": (None, _int_between(0, 600_000))},
    "rate_limit": {"retry_after_s": (1, _number_at_least(0))},
    # `shape`: the error body as the sandbox writes it ({"error": {"code"}}), or as Square ({"errors": [{"category",
    # "code", "detail"}]}), Stripe ({"error": {"type", "code"}}) or PayPal ({"name", "details": [{"issue"}]}) do.
    "error": {
        "status": (503, _int_between(400, 599)),
        "code": ("injected_error", lambda v: isinstance(v, str)),
        "shape": ("sandbox", lambda v: v in ERROR_SHAPES),
    },
    "commit_then_drop": {},
    "drop_before_commit": {},
    "pending": {"checks": (1, _int_between(0, 10_000)), "final": ("committed", lambda v: v in ("committed", "failed"))},
    "status_down": {"status": (503, _int_between(400, 599))},
    "duplicate_callbacks": {"copies": (3, _int_between(1, 100))},
    # The callbacks of matching writes go out `ms` later (a webhook lagging behind the reply); a reset or clearing
    # the faults drops the ones still held back.
    "delayed_callbacks": {"ms": (None, _int_between(0, 600_000))},
    "ignore_keys": {},
    # A money movement (a refund, a payment) that executes for less than asked: the provider moved `amount_cents`.
    "partial": {"amount_cents": (None, _int_between(0, 10**12))},
    # A 2xx answer of a read or write whose body is mangled: `drop` removes top-level fields, `set` overwrites them.
    "bad_result": {"drop": ([], _field_names), "set": ({}, _fields)},
}


@dataclass(frozen=True, kw_only=True)
class Target:
    """What a fault is matched against: the request (or, for callbacks, the write that produced them)."""

    method: str
    path: str
    key: str | None


@dataclass(kw_only=True)
class Fault:
    id: int
    kind: str
    route: str
    key: str | None
    method: str | None
    times: int | None  # remaining applications; None = every matching request
    params: dict[str, Any]
    applied: int = 0

    def matches(self, target: Target) -> bool:
        route = self.route.rstrip("/") or "/"
        on_route = target.path == route or target.path.startswith(route if route == "/" else route + "/")
        return (
            on_route
            and (self.key is None or self.key == target.key)
            and (self.method is None or self.method == target.method)
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "route": self.route,
            "key": self.key,
            "method": self.method,
            "times": self.times,
            "applied": self.applied,
            **self.params,
        }


@dataclass
class FaultBook:
    _faults: list[Fault] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _next_id: int = 1
    _generation: int = 0  # bumped by clear(): what a fault set in motion earlier checks before it acts

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    def add(self, spec: dict[str, Any]) -> Fault:
        fault = _parse(spec)
        with self._lock:
            fault.id = self._next_id
            self._next_id += 1
            self._faults.append(fault)
        return fault

    def list(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def clear(self) -> int:
        with self._lock:
            count = len(self._faults)
            self._faults.clear()
            self._generation += 1
        return count

    def take(self, kind: str, target: Target) -> Fault | None:
        """The first fault of this kind matching the target, counted as applied (and dropped when used up)."""
        with self._lock:
            for fault in self._faults:
                if fault.kind == kind and fault.matches(target):
                    fault.applied += 1
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None


def _parse(spec: dict[str, Any]) -> Fault:
    if not isinstance(spec, dict):
        raise FaultSpecError("kind", "A fault is a JSON object.")
    kind = spec.get("kind")
    if kind not in PARAMS:
        raise FaultSpecError("kind", f"kind must be one of {', '.join(PARAMS)}.")
    route, key, method, times = _target(spec)
    known = {"kind", "route", "key", "method", "times", *PARAMS[kind]}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise FaultSpecError(unknown[0], f"{unknown[0]} is not a parameter of a {kind} fault.")
    params = _params(kind, spec)
    return Fault(
        id=0, kind=kind, route=route, key=key, method=method.upper() if method else None, times=times, params=params
    )


def _target(spec: dict[str, Any]) -> tuple[str, str | None, str | None, int | None]:
    """The spec's route, key, method and times, each checked."""
    route = spec.get("route")
    if not isinstance(route, str) or not route.startswith("/"):
        raise FaultSpecError("route", "route must be a path or path prefix starting with '/', e.g. /refunds.")
    key = spec.get("key")
    if key is not None and not isinstance(key, str):
        raise FaultSpecError("key", "key must be a string.")
    method = spec.get("method")
    if method is not None and not isinstance(method, str):
        raise FaultSpecError("method", "method must be a string.")
    times = spec.get("times")
    if times is not None and not _int_between(1, 10**9)(times):
        raise FaultSpecError("times", "times must be a positive integer (omit it for every matching request).")
    return route, key, method, times


def _params(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The kind's parameters from the spec, defaults filled in, each checked."""
    params = {}
    for name, (default, valid) in PARAMS[kind].items():
        value = spec.get(name, default)
        if kind == "bad_result" and name == "drop" and isinstance(value, str):
            value = [value]  # one field name is a list of one
        if value is None or not valid(value):
            raise FaultSpecError(name, f"{name} is missing or out of range for a {kind} fault.")
        params[name] = value
    if kind == "bad_result" and not (params["drop"] or params["set"]):
        raise FaultSpecError("drop", "A bad_result fault needs drop (field names to remove) or set (fields to change).")
    return params

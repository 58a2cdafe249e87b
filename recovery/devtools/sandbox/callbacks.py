"""Signed callbacks (docs/reconciliation.md), delivered from background threads so a request never waits on the
receiver: one attempt each, signed with `Recovery-Signature` (docs/sandbox.md, "How it is built").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests

from recovery.devtools.sandbox.store import Store, now_iso

log = logging.getLogger(__name__)

TIMEOUT_S = 5


def sign(secret: str, body: bytes, timestamp: int) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


@dataclass(frozen=True, kw_only=True)
class CallbackConfig:
    url: str | None
    secret: str | None


@dataclass(frozen=True, kw_only=True)
class Event:
    type: str
    idempotency_key: str
    status: str
    provider_ref: str | None
    effects: int

    def payload(self, event_id: str) -> dict[str, Any]:
        return {
            "event_id": event_id,
            "type": self.type,
            "idempotency_key": self.idempotency_key,
            "status": self.status,
            "provider_ref": self.provider_ref,
            "effects": self.effects,
            "occurred_at": now_iso(),
        }


@dataclass(frozen=True, kw_only=True)
class _Delivery:
    generation: int
    event_id: str
    event: Event
    body: bytes
    config: CallbackConfig
    copies: int


class CallbackDispatcher:
    def __init__(self, store: Store, config: CallbackConfig, *, workers: int = 4) -> None:
        self.store = store
        self._initial = config
        self._config = config
        self._lock = threading.Lock()
        # Bumped by a reset, so deliveries queued before it neither go out nor land in the next test's log.
        self._generation = 0
        self._queue: queue.Queue[_Delivery] = queue.Queue()
        for number in range(workers):
            threading.Thread(target=self._run, name=f"sandbox-callbacks-{number}", daemon=True).start()

    @property
    def config(self) -> CallbackConfig:
        with self._lock:
            return self._config

    def configure(self, **changes: str | None) -> CallbackConfig:
        with self._lock:
            self._config = CallbackConfig(
                url=changes.get("url", self._config.url), secret=changes.get("secret", self._config.secret)
            )
            return self._config

    def reset(self) -> None:
        with self._lock:
            self._generation += 1
            self._config = self._initial

    def send(self, event: Event, *, copies: int = 1) -> str | None:
        """Queue the event (the body is fixed now, so every copy is byte-identical); None when no URL is set."""
        with self._lock:
            config, generation = self._config, self._generation
        if not config.url:
            return None
        event_id = f"evt_{secrets.token_hex(12)}"
        body = json.dumps(event.payload(event_id), separators=(",", ":")).encode()
        self._queue.put(
            _Delivery(generation=generation, event_id=event_id, event=event, body=body, config=config, copies=copies)
        )
        return event_id

    def _run(self) -> None:
        while True:
            delivery = self._queue.get()
            try:
                self._deliver(delivery)
            except Exception:  # a worker that dies silently would stop every later callback
                log.exception("callback delivery %s failed", delivery.event_id)

    def _deliver(self, delivery: _Delivery) -> None:
        headers = {"Content-Type": "application/json"}
        if delivery.config.secret:
            headers["Recovery-Signature"] = sign(delivery.config.secret, delivery.body, int(time.time()))
        for _ in range(delivery.copies):
            with self._lock:
                if delivery.generation != self._generation:
                    return
            status, error = None, None
            try:
                response = requests.post(delivery.config.url, data=delivery.body, headers=headers, timeout=TIMEOUT_S)
                status = response.status_code
            except requests.RequestException as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
            with self._lock:
                if delivery.generation != self._generation:
                    return
            self.store.log_callback(
                event_id=delivery.event_id,
                type=delivery.event.type,
                key=delivery.event.idempotency_key,
                url=delivery.config.url or "",
                status=status,
                error=error,
            )

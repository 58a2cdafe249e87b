"""The console and the sandbox provider the live tests talk to, named by the environment, as an agent would find them:

    RECOVERY_API_URL=http://127.0.0.1:8000 RECOVERY_TOKEN=rc_... SANDBOX_URL=http://127.0.0.1:8001 \
        python -m unittest discover -s clients/python/tests

(`make run` serves both; `python manage.py create_api_token tests --tenant demo` prints a token). The console's own
suite runs them the same way from a fresh virtualenv holding only the wheel and requests
(tests/test_client_distribution.py), with RECOVERY_TENANT and RECOVERY_TOOL_PREFIX naming its drill tenant and tools.
Without a console the live tests skip, saying what they need; only the standard library and requests are used.
"""

from __future__ import annotations

import os
import random
import unittest
import uuid
from typing import Any, TypeVar

import requests

API_URL = os.environ.get("RECOVERY_API_URL", "")
TOKEN = os.environ.get("RECOVERY_TOKEN", "")
TENANT = os.environ.get("RECOVERY_TENANT", "demo")
TOOL_PREFIX = os.environ.get("RECOVERY_TOOL_PREFIX", "")
SANDBOX_URL = os.environ.get("SANDBOX_URL", "")
SANDBOX_API_KEY = os.environ.get("SANDBOX_API_KEY", "sandbox-dev-key")

_C = TypeVar("_C", bound=type)


def needs_console(cls: _C) -> _C:
    reason = "needs a console and its sandbox: RECOVERY_API_URL, RECOVERY_TOKEN and SANDBOX_URL"
    skipped: _C = unittest.skipUnless(bool(API_URL and TOKEN and SANDBOX_URL), reason)(cls)
    return skipped


def unique(name: str) -> str:
    """A name no other run uses (task ids, idempotency keys)."""
    return f"{name}-{uuid.uuid4().hex[:10]}"


def order() -> str:
    """An order id of the sandbox's shape (O-<digits>) no other run uses."""
    return f"O-{random.randrange(10**8, 10**9)}"


def tool(name: str) -> str:
    """The registered name of one of the sandbox registry's tools (`refund.create`) on this console."""
    return TOOL_PREFIX + name


def fault(**spec: Any) -> None:
    """A fault of the sandbox provider (docs/sandbox.md), e.g. fault(route="/refunds", kind="commit_then_drop")."""
    requests.post(f"{SANDBOX_URL}/_sandbox/faults", json={"times": 1, **spec}, timeout=5).raise_for_status()


def effects(key: str) -> int:
    """How many times the sandbox really made the effect of `key` (its own ledger)."""
    answer = requests.get(f"{SANDBOX_URL}/_sandbox/ledger", params={"key": key}, timeout=5)
    answer.raise_for_status()
    return int(answer.json()["effects"])


def refund_request(key: str, order_id: str, amount_cents: int) -> requests.Response:
    """The refund itself, as an agent's own code sends it to the provider: with the call's key, no retry."""
    return requests.post(
        f"{SANDBOX_URL}/refunds",
        json={"order_id": order_id, "amount_cents": amount_cents},
        headers={"Authorization": f"Bearer {SANDBOX_API_KEY}", "Idempotency-Key": key},
        timeout=(2, 5),
    )

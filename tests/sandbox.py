"""The sandbox provider as a real subprocess, for tests that need the outside world (docs/sandbox.md).

    def test_it_refunds_once(sandbox):                 # a fresh (reset) sandbox for this test
        sandbox.fault(route="/refunds", kind="commit_then_drop", times=1)
        response = sandbox.call("POST", "/refunds", key="k-1", json={"order_id": "O-1", "amount_cents": 500})
        assert sandbox.ledger("k-1")["effects"] == 1

`sandbox_process` is one `manage.py runsandbox` per test session (API key SANDBOX_API_KEY_FOR_TESTS, callback secret
SANDBOX_CALLBACK_SECRET_FOR_TESTS); `sandbox` resets it before each test. Point a provider's base URL at
`sandbox.url`, send `Authorization: Bearer sandbox.api_key`, and read the evidence back with `.ledger()`,
`.requests()` and `.callbacks()` (recovery/devtools/sandbox/process.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery.devtools.sandbox.process import SandboxProcess

__all__ = ["SandboxProcess", "sandbox", "sandbox_for_tests", "sandbox_process", "sandbox_registry"]

SHIPPED_REGISTRY = Path(__file__).resolve().parent.parent / "recovery" / "fixtures" / "registry.example.json"

SANDBOX_API_KEY_FOR_TESTS = "sandbox-test-key"
SANDBOX_CALLBACK_SECRET_FOR_TESTS = "sandbox-test-secret"
TEST_ENV = {"DJANGO_SETTINGS_MODULE": "tests.settings"}


def sandbox_for_tests(db_path, **kwargs) -> SandboxProcess:
    """A SandboxProcess with the test suite's key, secret and settings (not started)."""
    kwargs.setdefault("api_key", SANDBOX_API_KEY_FOR_TESTS)
    kwargs.setdefault("callback_secret", SANDBOX_CALLBACK_SECRET_FOR_TESTS)
    return SandboxProcess(db_path, env=TEST_ENV, **kwargs)


@pytest.fixture(scope="session")
def sandbox_process(tmp_path_factory: pytest.TempPathFactory):
    process = sandbox_for_tests(tmp_path_factory.mktemp("sandbox") / "sandbox.sqlite3").start()
    yield process
    process.stop()


@pytest.fixture
def sandbox(sandbox_process: SandboxProcess) -> SandboxProcess:
    if sandbox_process.process is None or sandbox_process.process.poll() is not None:
        sandbox_process.start()  # a test that stopped it must not take the rest of the session down
    sandbox_process.reset()
    return sandbox_process


def sandbox_registry(sandbox_url: str, *, read_timeout_s: float = 2, max_checks: int = 3) -> dict:
    """The shipped registry pointed at a sandbox process: short read timeouts, breakers that lost replies do not
    open (these tests make many), and status checks due at once (`max_checks` of them before a person decides)."""
    registry = json.loads(SHIPPED_REGISTRY.read_text())
    registry["providers"][0]["base_url"] = sandbox_url
    registry["providers"][0]["read_timeout_s"] = read_timeout_s
    for tool in registry["tools"]:
        tool["breaker"] = {"min_calls": 1000}
        if "reconcile" in tool:
            tool["reconcile"] = {"first_check_s": 0, "backoff": 1, "max_checks": max_checks, "deadline_s": 600}
    return registry

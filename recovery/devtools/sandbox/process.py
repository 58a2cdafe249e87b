"""The sandbox provider as a subprocess (`manage.py runsandbox`), and a client for its business and admin routes, e.g.
`SandboxProcess(path / "sandbox.sqlite3", api_key="k").start()` (a free port unless port= is given), then
`sandbox.fault(route="/refunds", kind="commit_then_drop", times=1)`, `sandbox.ledger(key)`, `sandbox.stop()`.
Standard library and `requests` only, like the rest of the package (docs/sandbox.md).
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT_S = 30


class SandboxClient:
    """The sandbox's business routes (with its API key) and its admin routes, for a sandbox at `url`."""

    def __init__(self, url: str, *, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key

    # The business API.

    def headers(self, key: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    def call(
        self, method: str, path: str, *, key: str | None = None, json: Any = None, timeout: float = 10
    ) -> requests.Response:
        """One business request with the API key (and the Idempotency-Key, when given)."""
        return requests.request(method, self.url + path, headers=self.headers(key), json=json, timeout=timeout)

    # The admin API.

    def _admin(self, method: str, name: str, **kwargs: Any) -> Any:
        response = requests.request(method, f"{self.url}/_sandbox/{name}", timeout=10, **kwargs)
        response.raise_for_status()
        return response.json()

    def reset(self) -> None:
        self._admin("POST", "reset")

    def fault(self, **spec: Any) -> dict[str, Any]:
        return self._admin("POST", "faults", json=spec)

    def faults(self) -> list[dict[str, Any]]:
        return self._admin("GET", "faults")

    def clear_faults(self) -> None:
        self._admin("DELETE", "faults")

    def ledger(self, key: str | None = None) -> dict[str, Any]:
        return self._admin("GET", "ledger", params={"key": key} if key is not None else {})

    def requests(self, **filters: str) -> list[dict[str, Any]]:
        """The request log, filtered by path_prefix=, key= and method=."""
        return self._admin("GET", "requests", params=filters)

    def callbacks(self) -> list[dict[str, Any]]:
        return self._admin("GET", "callbacks")

    def configure(self, **config: str | int | None) -> dict[str, Any]:
        """callback_url= and/or callback_secret= (None clears), list_lag_ms= (how long a new object stays out of
        the listings); a reset restores the startup values."""
        return self._admin("POST", "config", json=config)


class SandboxProcess(SandboxClient):
    def __init__(
        self,
        db_path: str | Path,
        *,
        api_key: str | None,
        callback_secret: str | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        port: int = 0,
    ) -> None:
        self.db_path = str(db_path)
        self.env = env or {}
        self.api_key = api_key
        self.callback_secret = callback_secret
        self.extra_args = extra_args
        self.port = port
        self.url = ""
        self.process: subprocess.Popen[str] | None = None
        # A file, not a pipe: a pipe nobody reads could fill up and block the server.
        self.stderr_path = Path(self.db_path).with_suffix(".stderr.log")

    def start(self) -> SandboxProcess:
        args = [sys.executable, "manage.py", "runsandbox", "--port", str(self.port), "--db", self.db_path]
        if self.api_key:
            args += ["--api-key", self.api_key]
        if self.callback_secret:
            args += ["--callback-secret", self.callback_secret]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        # The keys are the ones given here: the environment's (read by runsandbox as defaults) must not leak in.
        env.pop("SANDBOX_API_KEY", None)
        env.pop("SANDBOX_CALLBACK_SECRET", None)
        with open(self.stderr_path, "a") as stderr:
            self.process = subprocess.Popen(
                [*args, *self.extra_args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self.url = self._wait_for_url()
        self.port = int(self.url.rsplit(":", 1)[1])
        self._wait_healthy()
        return self

    def _wait_for_url(self) -> str:
        # Read the startup line on a thread: readline() on the pipe has no timeout of its own.
        lines: queue.Queue[str] = queue.Queue()
        assert self.process and self.process.stdout
        stdout = self.process.stdout
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if line.startswith("sandbox: "):
                return line.split()[1]
        self.stop()
        raise RuntimeError(f"the sandbox did not start:\n{self.stderr()}")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/_sandbox/health", timeout=1).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the sandbox at {self.url} never answered its health check:\n{self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process and self.process.stdout:
            self.process.stdout.close()  # the reader thread ends with it
        self.process = None

    def restart(self) -> SandboxProcess:
        """Stop and start again on the same port and the same store file."""
        self.stop()
        return self.start()

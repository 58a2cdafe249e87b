"""The demo agent (docs/demo-agent.md): recovery_client's runtime loop with its provider requests built from the tool
registry (`ToolBook`, `Agent.run_call`), as an agent's own tool code would send them. It uses the client distribution
by its public names only; the scenarios, drills and benchmarks play it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests
from recovery_client import RecoveryClient, facts_from_exception, facts_from_response
from recovery_client.runtime import CallResult, Runtime
from requests.adapters import HTTPAdapter

from recovery.engine.wire import form_encode


@dataclass(frozen=True, kw_only=True)
class ToolBinding:
    """How the agent itself calls one tool on its provider (what an agent's tool code knows)."""

    name: str
    side_effect: str
    method: str
    path: str
    body: Any
    base_url: str
    headers: dict[str, str]
    timeout: tuple[float, float]
    encoding: str = "json"  # the body's: json, form (Stripe's bracketed encoding) or none (docs/providers.md)
    key_header: str = ""  # where a write's key goes: this header, or
    key_field: str = ""  # this body field (Square's way); both empty: nowhere
    request_id_header: str = "X-Request-Id"

    def url(self, arguments: dict) -> str:
        path = self.path
        for name, value in arguments.items():
            path = path.replace("{" + name + "}", quote(str(value), safe=""))
        return self.base_url.rstrip("/") + path

    def json_body(self, arguments: dict) -> Any:
        if self.method in ("GET", "DELETE") or self.encoding == "none":
            return None
        if self.body is None:
            return arguments
        return _fill(self.body, arguments)

    def keyed(self, arguments: dict, key: str) -> tuple[dict[str, str], dict[str, Any]]:
        """The headers and the `requests` body options of one request, the key where the registry puts it."""
        # A body template may carry the key as a marker a listing lookup matches ({idempotency_key}: docs/providers.md).
        keyed = {**arguments, "idempotency_key": key} if self.body is not None else arguments
        headers, body = dict(self.headers), self.json_body(keyed)
        if self.side_effect == "write" and self.key_header:
            headers[self.key_header] = key
        elif self.side_effect == "write" and self.key_field and isinstance(body, dict):
            body = {**body, self.key_field: key}
        if self.encoding == "form" and isinstance(body, dict):
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            return headers, {"data": form_encode(body).encode()}
        return headers, {"json": body}


def _fill(template: Any, arguments: dict) -> Any:
    """A body template: a string that is exactly "{name}" becomes that argument's value, with its type."""
    if isinstance(template, dict):
        return {key: _fill(value, arguments) for key, value in template.items()}
    if isinstance(template, list):
        return [_fill(value, arguments) for value in template]
    if isinstance(template, str) and template.startswith("{") and template.endswith("}"):
        return arguments.get(template[1:-1])
    return template


class ToolBook:
    """The agent's tool bindings, read from a registry file (the same one the console loads)."""

    def __init__(self, bindings: dict[str, ToolBinding]) -> None:
        self.bindings = bindings

    @classmethod
    def from_registry(cls, registry: dict, *, env: dict[str, str] | None = None) -> ToolBook:
        env = os.environ if env is None else env
        providers = {provider["name"]: provider for provider in registry.get("providers", [])}
        bindings = {}
        for tool in registry.get("tools", []):
            provider = providers[tool["provider"]]
            auth, headers = provider.get("auth") or {}, {"Accept": "application/json"}
            secret = env.get(auth.get("secret_env", ""), "")
            if auth.get("kind") == "bearer" and secret:
                headers["Authorization"] = f"Bearer {secret}"
            elif auth.get("kind") == "header" and secret:
                headers[auth["header"]] = secret
            request = tool["request"]
            place = request.get("key", {"header": "Idempotency-Key"})
            bindings[tool["name"]] = ToolBinding(
                name=tool["name"],
                side_effect=tool["side_effect"],
                method=tool["request"]["method"].upper(),
                path=tool["request"]["path"],
                body=tool["request"].get("body"),
                base_url=provider["base_url"],
                headers=headers,
                timeout=(float(provider.get("connect_timeout_s", 2)), float(provider.get("read_timeout_s", 5))),
                encoding=request.get("encoding", "json"),
                key_header=(place or {}).get("header", ""),
                key_field=(place or {}).get("field", ""),
                request_id_header=provider.get("request_id_header", "X-Request-Id"),
            )
        return cls(bindings)

    def __getitem__(self, name: str) -> ToolBinding:
        return self.bindings[name]


class Agent(Runtime):
    """The demo agent for one tenant: `Runtime`'s loop (every option of it), and `run_call` for a tool of `tools`."""

    def __init__(
        self,
        client: RecoveryClient,
        tools: ToolBook,
        *,
        tenant: str,
        name: str = "demo-agent",
        log: Callable[[str], None] = lambda line: None,
        **options: Any,
    ) -> None:
        super().__init__(client, tenant=tenant, name=name, log=log, **options)
        self.tools = tools
        self.session = requests.Session()
        # The console decides every retry (docs/design/budgets.md: one layer retries).
        no_retries = HTTPAdapter(max_retries=0)
        self.session.mount("http://", no_retries)
        self.session.mount("https://", no_retries)

    def run_call(
        self,
        task_id: int,
        *,
        step: int,
        tool: str,
        arguments: dict,
        key: str,
        depends_on: tuple[int, ...] | list[int] = (),
        patience_s: float | None = None,
    ) -> CallResult:
        """Add the call and drive it until it is settled, degraded, left for a person, or refused.

        `patience_s` (default: the agent's) bounds how long it waits for reconciliation; 0 moves on at once,
        leaving an unknown outcome to the console (the call ends UNSETTLED here and keeps being reconciled)."""
        ref = self.client.add_call(
            task_id, step=step, tool=tool, arguments=arguments, idempotency_key=key, depends_on=depends_on
        )

        def send(number: int) -> tuple[dict, Any]:
            return self._send(tool, key, arguments)

        return self.drive_call(
            task_id, ref.call_id, state=ref.state, tool=tool, key=key, send=send, patience_s=patience_s
        )

    def _send(self, tool: str, key: str, arguments: dict) -> tuple[dict, Any]:
        """The request of `tool` as its registry binding describes it, with the call's key on a write."""
        binding = self.tools[tool]
        headers, body = binding.keyed(arguments, key)
        try:
            response = self.session.request(
                binding.method, binding.url(arguments), headers=headers, timeout=binding.timeout, **body
            )
            facts = facts_from_response(response, provider_ref_header=binding.request_id_header)
        except requests.RequestException as exc:
            facts = facts_from_exception(exc)
        return facts, facts.get("result")

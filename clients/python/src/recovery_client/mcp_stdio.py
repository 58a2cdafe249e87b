"""`recovery-mcp-stdio --url URL --token-env VAR`: a stdio MCP server for desktop clients that spawn a command,
relaying each JSON-RPC message to the console's MCP gateway over Streamable HTTP (docs/mcp-gateway.md) with the API
token read from the environment variable VAR. Database credentials and audit keys never reach the agent's host.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import IO, Any

import requests

__all__ = ["Bridge", "main"]

PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_SAFE = re.compile(r"^[\x20-\x7E]*$")


def _header_value(value: str) -> str:
    """A value as an HTTP header carries it: verbatim when plain ASCII, else MCP's base64 sentinel."""
    if _SAFE.fullmatch(value) and value == value.strip() and not value.startswith("=?base64?"):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


class Bridge:
    """One stdio client's connection to the gateway: its session id and negotiated protocol version, kept across
    messages as a Streamable HTTP client keeps them."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 300.0) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.http = requests.Session()
        self.http.headers.update({"Authorization": f"Bearer {token}"})
        self.session_id = ""
        self.protocol_version = ""

    def headers(self, message: dict[str, Any]) -> dict[str, str]:
        """What the transport says in headers: the session, the protocol version, the method and name."""
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        found = message.get("params")
        params: dict[str, Any] = found if isinstance(found, dict) else {}
        found = params.get("_meta")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        version = meta.get(PROTOCOL_VERSION_META) or self.protocol_version
        if version and message.get("method") != "initialize":
            headers["MCP-Protocol-Version"] = str(version)
        method = message.get("method")
        if isinstance(method, str):
            headers["Mcp-Method"] = method
            name = params.get(NAME_BEARING.get(method, ""))
            if isinstance(name, str):
                headers["Mcp-Name"] = _header_value(name)
        return headers

    def relay(self, message: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Send one message; the messages the gateway answers with, as they arrive."""
        reply = self.http.post(
            self.url, data=json.dumps(message), headers=self.headers(message), stream=True, timeout=self.timeout_s
        )
        self.session_id = reply.headers.get("Mcp-Session-Id", self.session_id)
        if reply.status_code == 202 or (not reply.content and reply.ok):
            return
        kind = reply.headers.get("Content-Type", "")
        if kind.startswith("text/event-stream"):
            answers: Iterator[dict[str, Any]] = self._events(reply)
        elif kind.startswith("application/json"):
            body = reply.json()
            answers = iter(body if isinstance(body, list) else [body])
        else:
            answers = iter([self._failure(message, f"the gateway answered HTTP {reply.status_code}")])
        for answer in answers:
            self._note(message, answer)
            yield answer

    def _events(self, reply: requests.Response) -> Iterator[dict[str, Any]]:
        data: list[str] = []
        for line in reply.iter_lines(decode_unicode=True):
            if line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                text, data = "\n".join(data), []
                if text:
                    yield json.loads(text)

    def _note(self, message: dict[str, Any], answer: dict[str, Any]) -> None:
        result = answer.get("result")
        if message.get("method") == "initialize" and isinstance(result, dict):
            self.protocol_version = str(result.get("protocolVersion", ""))

    @staticmethod
    def _failure(message: dict[str, Any], text: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": message.get("id"), "error": {"code": -32603, "message": text}}

    def serve(self, stdin: IO[str], stdout: IO[str]) -> None:
        """Relay every line of `stdin` until it closes; a request the gateway could not answer gets an error."""
        for line in stdin:
            if not line.strip():
                continue
            message = json.loads(line)
            try:
                for answer in self.relay(message):
                    stdout.write(json.dumps(answer) + "\n")
                    stdout.flush()
            except requests.RequestException as exc:
                if "id" in message and "method" in message:
                    stdout.write(json.dumps(self._failure(message, f"the gateway is unreachable: {exc}")) + "\n")
                    stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="recovery-mcp-stdio", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the gateway's /mcp URL")
    parser.add_argument("--token-env", required=True, help="the environment variable that holds the API token")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one answer")
    options = parser.parse_args(argv)
    token = os.environ.get(options.token_env, "")
    if not token:
        parser.error(f"the environment variable {options.token_env} holds no token")
    Bridge(options.url, token, timeout_s=options.timeout).serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

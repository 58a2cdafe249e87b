"""The sandbox's HTTP server: stdlib `ThreadingHTTPServer`, one daemon thread per connection, HTTP/1.1 keep-alive."""

from __future__ import annotations

import logging
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TextIO

from recovery.devtools.sandbox.app import Sandbox, SandboxConfig
from recovery.devtools.sandbox.messages import Drop, Request, Response, error

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024


class SandboxHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "RecoverySandbox/1"
    # Headers and body go out in two writes; with Nagle on, a keep-alive client's delayed ACK adds ~40 ms to each.
    disable_nagle_algorithm = True
    server: SandboxServer

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _handle(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            # The body is left unread, so the connection cannot be reused.
            self.close_connection = True
            status, message = (
                (413, f"Bodies are limited to {MAX_BODY_BYTES} bytes.") if length > 0 else (400, "Bad Content-Length.")
            )
            self._send(error(status, "invalid_request", message))
            return
        body = self.rfile.read(length) if length else b""
        request = Request.from_target(method=self.command, target=self.path, headers=self.headers, body=body)
        result = self.server.sandbox.handle(request)
        if isinstance(result, Drop):
            # Writing nothing and closing makes the client see the server disconnect (RemoteDisconnected), as when
            # a provider's reply is lost after it committed — not a hang.
            self.close_connection = True
            return
        self._send(result)

    def _send(self, response: Response) -> None:
        payload = response.encode()
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except ConnectionError:
            # The client gave up while the sandbox held its reply (a latency drill): what executed stays executed.
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        # Every business request is in the request log (GET /_sandbox/requests); stderr stays for errors.
        pass


class SandboxServer(ThreadingHTTPServer):
    daemon_threads = True
    # A restart on the same port must not wait for the previous process's sockets to leave TIME_WAIT.
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], sandbox: Sandbox) -> None:
        super().__init__(address, SandboxHandler)
        self.sandbox = sandbox

    def handle_error(self, request: object, client_address: object) -> None:
        # A client hanging up mid-request is ordinary in fault drills; anything else deserves a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def make_server(config: SandboxConfig, *, host: str = "127.0.0.1", port: int = 8001) -> SandboxServer:
    return SandboxServer((host, port), Sandbox(config))


def serve(server: SandboxServer, *, out: TextIO = sys.stdout) -> None:
    """Serve until Ctrl-C or SIGTERM, then close the listening socket and return."""
    out.write(f"sandbox: {server.url} (store {server.sandbox.store.path})\n")
    out.flush()

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
        server.sandbox.store.flush_log()  # the requests logged in the last moments are kept too

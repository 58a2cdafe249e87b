"""Real receivers for the notification tests, each an HTTP server on a free port in a thread of the test process: a
webhook receiver that checks the signature and records the delivery id, scripted to answer 500, to time out after
reading, or to accept; and a stand-in for Slack's Web API (chat.postMessage answering a `ts`, chat.update, threaded
replies), recording what it was sent."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from recovery.services.callbacks import signature_valid


class Receiver:
    """Records every POST as (path, headers, body as JSON, signature valid); answers by `script`, one step per request
    ("500", "hang": read, then sleep past the sender's timeout, "ok"), then "ok"."""

    def __init__(self, *, secret: str = "", script: tuple[str, ...] = (), hang_s: float = 3.0, slack: bool = False):
        self.secret, self.script, self.hang_s, self.slack = secret, list(script), hang_s, slack
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.requests) >= count:
                    return list(self.requests)
            time.sleep(0.02)
        raise AssertionError(f"the receiver got {len(self.requests)} requests, not {count}")

    def _record(self, path: str, headers: dict, raw: bytes) -> tuple[str, int]:
        signed = bool(self.secret) and signature_valid(self.secret, headers.get("recovery-signature", ""), raw)
        with self.lock:
            self.requests.append({"path": path, "headers": headers, "body": json.loads(raw), "signed": signed})
            step = self.script.pop(0) if self.script else "ok"
            return step, len(self.requests)

    def _answer(self, path: str, number: int) -> dict:
        if not self.slack:
            return {"received": True}
        if path.endswith("/chat.postMessage"):
            return {"ok": True, "channel": "C0TEST", "ts": f"17000000{number:02d}.000100"}
        return {"ok": True, "channel": "C0TEST"}

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {key.lower(): value for key, value in self.headers.items()}
                step, number = receiver._record(self.path, headers, raw)
                if step == "hang":
                    time.sleep(receiver.hang_s)
                status = 500 if step == "500" else 200
                body = json.dumps({"error": "boom"} if status == 500 else receiver._answer(self.path, number)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the sender gave up waiting

            def log_message(self, *args):
                pass

        return Handler

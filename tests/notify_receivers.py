"""Real receivers for the notification tests, each an HTTP server on a free port in a thread of the test process: a
webhook receiver that checks the signature and records the delivery id, scripted to answer 500, to time out after
reading, or to accept; and a stand-in for Slack's Web API (chat.postMessage answering a `ts`, chat.update, threaded
replies, and conversations.history / conversations.replies paged as Slack documents them), recording what it was
sent and keeping the messages it posted."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from recovery.services.callbacks import signature_valid


class Receiver:
    """Records every request as (path, headers, body as JSON or the query's arguments, signature valid); answers by
    `script`, one step per request ("500"; "hang": act, then sleep past the sender's timeout; "drop": read, then close
    the connection without acting or answering; "ok"), then "ok". As Slack (`slack=True`) it keeps the messages
    chat.postMessage posted (`posted`, oldest first) and answers the history reads at most `page_max` a page."""

    def __init__(
        self,
        *,
        secret: str = "",
        script: tuple[str, ...] = (),
        hang_s: float = 3.0,
        slack: bool = False,
        page_max: int = 100,
    ):
        self.secret, self.script, self.hang_s, self.slack = secret, list(script), hang_s, slack
        self.page_max = page_max
        self.requests: list[dict] = []
        self.posted: list[dict] = []
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

    def _record(self, path: str, headers: dict, raw: bytes, query: dict | None = None) -> tuple[str, int]:
        signed = bool(self.secret) and signature_valid(self.secret, headers.get("recovery-signature", ""), raw)
        body = query if query is not None else json.loads(raw)
        with self.lock:
            self.requests.append({"path": path, "headers": headers, "body": body, "signed": signed})
            step = self.script.pop(0) if self.script else "ok"
            return step, len(self.requests)

    def post(self, channel: str, text: str, *, thread_ts: str = "", metadata: dict | None = None) -> str:
        """A message in the channel, as if someone (or an earlier try) posted it; its ts."""
        with self.lock:
            ts = f"{max(time.time(), float(self.posted[-1]['ts']) + 0.000001 if self.posted else 0):.6f}"
            message = {"type": "message", "ts": ts, "text": text, "channel": channel}
            if thread_ts:
                message["thread_ts"] = thread_ts
            if metadata:
                message["metadata"] = metadata
            self.posted.append(message)
            return ts

    def _answer(self, path: str, body: dict) -> dict:
        if not self.slack:
            return {"received": True}
        method = path.rsplit("/", 1)[-1]
        if method == "chat.postMessage":
            ts = self.post(
                body["channel"], body["text"], thread_ts=body.get("thread_ts", ""), metadata=body.get("metadata")
            )
            return {"ok": True, "channel": body["channel"], "ts": ts}
        if method in ("conversations.history", "conversations.replies"):
            return self._history(method, body)
        return {"ok": True, "channel": body.get("channel", "")}

    def _history(self, method: str, args: dict) -> dict:
        """conversations.history: the channel's messages (not thread replies) newest first; conversations.replies: a
        thread, its parent first, oldest first. Both after `oldest`, paged by `cursor` with `has_more` and
        `response_metadata.next_cursor`; metadata only with include_all_metadata."""
        oldest = float(args.get("oldest", 0))
        with self.lock:
            found = [m for m in self.posted if m["channel"] == args["channel"] and float(m["ts"]) > oldest]
        if method == "conversations.history":
            found = [m for m in reversed(found) if m.get("thread_ts", m["ts"]) == m["ts"]]
        else:
            found = [m for m in found if m.get("thread_ts", m["ts"]) == args["ts"]]
        start = int(base64.b64decode(args["cursor"]).decode().split(":")[1]) if args.get("cursor") else 0
        size = min(int(args.get("limit", 100)), self.page_max)
        page, more = found[start : start + size], start + size < len(found)
        if args.get("include_all_metadata") != "true":
            page = [{k: v for k, v in m.items() if k != "metadata"} for m in page]
        cursor = base64.b64encode(f"next_ts:{start + size}".encode()).decode() if more else ""
        return {"ok": True, "messages": page, "has_more": more, "response_metadata": {"next_cursor": cursor}}

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._act(self.path, receiver._record(self.path, self._headers(), raw), json.loads(raw))

            def do_GET(self):
                split = urlsplit(self.path)
                query = {key: values[-1] for key, values in parse_qs(split.query).items()}
                self._act(split.path, receiver._record(split.path, self._headers(), b"", query), query)

            def _headers(self) -> dict:
                return {key.lower(): value for key, value in self.headers.items()}

            def _act(self, path: str, taken: tuple[str, int], body: dict) -> None:
                step = taken[0]
                if step == "drop":  # read, never acted on, never answered
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                answer = {"error": "boom"} if step == "500" else receiver._answer(path, body)
                if step == "hang":
                    time.sleep(receiver.hang_s)
                status = 500 if step == "500" else 200
                raw = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except OSError:
                    pass  # the sender gave up waiting

            def log_message(self, *args):
                pass

        return Handler

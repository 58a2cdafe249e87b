"""The wire facts (facts_from_response / facts_from_exception) from what `requests` really saw, over real sockets of
this machine: a refused connection, a server that never answers, a rate limit with Retry-After. No console needed."""

from __future__ import annotations

import json
import socket
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
from recovery_client import facts_from_exception, facts_from_response


class RateLimited(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.dumps({"error": {"code": "rate_limited", "message": "slow down"}}).encode()
        self.send_response(429)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "3")
        self.send_header("X-Request-Id", "req_42")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class WireFacts(unittest.TestCase):
    def test_a_refused_connection_provably_sent_nothing(self) -> None:
        with socket.socket() as probe:  # a port of this machine that nothing listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with self.assertRaises(requests.ConnectionError) as raised:
            requests.post(f"http://127.0.0.1:{port}/refunds", json={}, timeout=(2, 2))
        facts = facts_from_exception(raised.exception)
        self.assertEqual((facts["connection_opened"], facts["sent"]), (False, False))
        self.assertEqual(facts["error"]["kind"], "connection_refused")

    def test_a_server_that_never_answers_was_sent_the_request(self) -> None:
        with socket.create_server(("127.0.0.1", 0)) as silent:
            port = silent.getsockname()[1]
            with self.assertRaises(requests.ReadTimeout) as raised:
                requests.post(f"http://127.0.0.1:{port}/refunds", json={}, timeout=(2, 0.3))
        facts = facts_from_exception(raised.exception)
        self.assertEqual((facts["connection_opened"], facts["sent"]), (True, True))
        self.assertEqual(facts["error"]["kind"], "read_timeout")

    def test_a_reply_gives_its_status_retry_after_reference_and_error_code(self) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", 0), RateLimited)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            reply = requests.post(f"http://127.0.0.1:{server.server_address[1]}/refunds", json={}, timeout=5)
        finally:
            server.shutdown()
            server.server_close()
        facts = facts_from_response(reply)
        self.assertEqual(
            {
                k: facts[k]
                for k in ("connection_opened", "sent", "http_status", "retry_after_ms", "provider_request_id")
            },
            {
                "connection_opened": True,
                "sent": True,
                "http_status": 429,
                "retry_after_ms": 3000,
                "provider_request_id": "req_42",
            },
        )
        self.assertEqual(facts["error"], {"code": "rate_limited"})


if __name__ == "__main__":
    unittest.main()

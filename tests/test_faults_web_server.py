"""The web server's own refusals under /api/ are the API's JSON envelope (docs/api.md), as probing the release found
they were not: gunicorn (deploy/gunicorn.conf.py, console/gunicorn_worker.py) and nginx (deploy/nginx.conf) each
answer the six malformed requests below before the application sees them, and nginx its 413, 502 and 504. Sent on raw
sockets, since no HTTP client sends these."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
from pathlib import Path

import pytest

from recovery.devtools.drills.stage import database_url
from tests.conftest import missing_service
from tests.servers import ROOT, Nginx, WebServer, free_port, production_env

API = "/api/v1/tasks"
TOKEN = "Authorization: Bearer rc_" + "a" * 10_240  # a 10 kB token
MANY = "".join(f"X-Probe-{n}: {'b' * 240}\r\n" for n in range(256))  # 64 kB of headers, 256 of them

# name: (the request's head, the status and code both gunicorn and nginx answer it with)
CASES = {
    "token-10kB": (f"GET {API}/1 HTTP/1.1\r\nHost: 127.0.0.1\r\n{TOKEN}\r\n", (431, "headers_too_large")),
    "headers-64kB": (f"GET {API}/1 HTTP/1.1\r\nHost: 127.0.0.1\r\n{MANY}", (431, "headers_too_large")),
    "content-length-negative": (f"POST {API} HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n", (400, "bad_request")),
    "content-length-text": (f"POST {API} HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n", (400, "bad_request")),
    "request-line-9kB": (f"GET {API}?tenant={'c' * 9000} HTTP/1.1\r\nHost: x\r\n", (414, "uri_too_long")),
    "transfer-coding": (f"POST {API} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: bogus\r\n", (501, "not_implemented")),
}


def exchange(port: int, head: str, *, tls: bool = False, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request on a raw socket, and the answer: status, headers (lower-case names), body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if tls:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the test's own certificate
        sock = context.wrap_socket(sock)
    with sock:
        with contextlib.suppress(OSError):  # the server may answer and close before the whole head is sent
            sock.sendall(head.encode("latin-1") + b"Connection: close\r\n\r\n" + body)
        answer, headers, length = b"", {}, None
        with contextlib.suppress(OSError):  # read to the answer's Content-Length: nginx lingers on a refused body
            while (length is None or len(answer.partition(b"\r\n\r\n")[2]) < length) and (chunk := sock.recv(65536)):
                answer += chunk
                if length is None and b"\r\n\r\n" in answer:
                    lines = answer.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
                    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
                    length = int(headers.get("content-length", 1 << 30))
    top, _, rest = answer.partition(b"\r\n\r\n")
    return int(top.split(b" ")[1]), headers, rest


def assert_envelope(answer: tuple[int, dict[str, str], bytes], status: int, code: str) -> dict:
    got, headers, body = answer
    assert got == status, (got, headers, body[:300])
    assert headers["content-type"].startswith("application/json"), (headers, body[:300])
    error = json.loads(body)["error"]
    assert (error["code"], set(error)) == (code, {"code", "message", "field_errors", "detail"}), error
    assert len(headers["x-request-id"]) == 32
    return headers


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup, django_db_blocker):
    """One web process with the shipped gunicorn settings, for the whole module: nothing here reaches the database
    (the test database exists; no test needs it emptied), and nothing is left for a graceful stop to wait on."""
    env = production_env(
        DATABASE_URL=database_url(), RECOVERY_TOKEN_PEPPER="faults-pepper", GUNICORN_GRACEFUL_TIMEOUT="1"
    )
    log = tmp_path_factory.mktemp("gunicorn") / "gunicorn.log"
    with WebServer(env, log_path=log, workers=1, threads=2, shipped=True) as server:
        yield server


@pytest.fixture(scope="module")
def nginx_binary():
    if not Path(Nginx.BINARY).exists():
        missing_service("needs Debian's nginx (apt-get install nginx): the front is tested for real")


@pytest.fixture(scope="module")
def front(web, nginx_binary, tmp_path_factory):
    """The shipped nginx in front of `web`, for the whole module."""
    workdir = tmp_path_factory.mktemp("nginx")
    with Nginx([f"127.0.0.1:{web.port}"], static_root=workdir, workdir=workdir / "nginx") as nginx:
        yield nginx


@pytest.mark.parametrize("case", CASES)
def test_gunicorn_refuses_a_malformed_api_request_with_the_json_envelope(web, case):
    head, (status, code) = CASES[case]

    headers = assert_envelope(exchange(web.port, head), status, code)

    assert headers["recovery-api-version"].startswith("1.")  # the console's own answer, as every API answer


def test_gunicorn_keeps_its_html_page_for_a_console_path(web):
    status, headers, _ = exchange(web.port, "POST /sign-in/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n")

    assert (status, headers["content-type"]) == (400, "text/html")


@pytest.mark.parametrize("case", CASES)
def test_nginx_refuses_a_malformed_api_request_with_the_json_envelope(front, case):
    head, (status, code) = CASES[case]

    headers = assert_envelope(exchange(front.tls_port, head, tls=True), status, code)

    assert headers["recovery-gateway"] == "nginx" and "recovery-api-version" not in headers


def test_nginx_answers_a_body_over_its_limit_with_the_json_envelope(web, front):
    head = f"POST {API}?probe=413 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2097152\r\n"

    assert_envelope(exchange(front.tls_port, head, tls=True), 413, "body_too_large")

    assert "probe=413" not in web.log()  # refused before gunicorn saw it


def test_nginx_answers_a_web_process_down_or_too_slow_with_the_json_envelope(nginx_binary, tmp_path):
    head = f"GET {API}/1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    down = f"127.0.0.1:{free_port()}"  # nothing listens: nginx's 502
    with Nginx([down], static_root=tmp_path, workdir=tmp_path / "down") as front:
        assert_envelope(exchange(front.tls_port, head, tls=True), 502, "bad_gateway")

    # A web process that takes the connection and never answers: nginx's 504 after proxy_read_timeout (1 s here).
    with socket.create_server(("127.0.0.1", 0), backlog=8) as silent:
        front = Nginx([f"127.0.0.1:{silent.getsockname()[1]}"], static_root=tmp_path, workdir=tmp_path / "slow")
        proxy = (ROOT / "deploy" / "nginx-proxy.conf").read_text()
        assert "proxy_read_timeout 65s;" in proxy
        (front.workdir / "proxy.conf").write_text(proxy.replace("proxy_read_timeout 65s;", "proxy_read_timeout 1s;"))
        conf = (front.workdir / "nginx.conf").read_text()
        (front.workdir / "nginx.conf").write_text(
            conf.replace(str(ROOT / "deploy" / "nginx-proxy.conf"), str(front.workdir / "proxy.conf"))
        )
        with front:
            assert_envelope(exchange(front.tls_port, head, tls=True), 504, "gateway_timeout")


def test_nginx_keeps_its_html_page_for_a_console_path(nginx_binary, tmp_path):
    with Nginx([f"127.0.0.1:{free_port()}"], static_root=tmp_path, workdir=tmp_path / "down") as front:
        status, headers, _ = exchange(front.tls_port, "GET /sign-in/ HTTP/1.1\r\nHost: 127.0.0.1\r\n", tls=True)

    assert (status, headers["content-type"]) == (502, "text/html")

"""Real servers and a real network in the way, for tests of what happens at the edges.

    with TcpProxy("127.0.0.1", 5432) as proxy:      # PostgreSQL behind a proxy the test can cut
        ...DATABASE_URL=postgres://...@127.0.0.1:{proxy.port}/...
        proxy.cut()                                 # every connection closed, new ones refused at once
        proxy.restore()

    proxy.drop_replies(1)                           # the next reply never reaches the client: the request got
                                                    # through and was answered, the connection is closed instead
    proxy.refuse()                                  # nothing listens on the port: connections are refused by the
    proxy.listen()                                  # kernel (nothing sent), until it listens again on the same port

    with WebServer(env) as web:                     # the console under gunicorn, in production settings
        requests.get(web.url + "/readyz")

    with RedisServer() as redis_server:             # a redis-server of the test's own, nothing kept on disk
        redis_server.kill()                         # SIGKILL: every connection reset, its data gone
        redis_server.start()                        # again on the same port, empty

Ports are always free ones, so a developer's own `make run` beside the suite is never in the way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading

from console.env import keyring_text
from recovery.devtools.drills.servers import ROOT, Nginx, PgBouncer, WebServer, _listening, free_port

__all__ = ["ROOT", "Nginx", "PgBouncer", "RedisServer", "TcpProxy", "WebServer", "free_port", "production_env"]


class TcpProxy:
    """A TCP proxy on a free port of 127.0.0.1 in front of `host:port`, from threads of this process."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._drops = 0
        self.dropped = 0  # replies dropped so far
        self._stop = False
        self._thread = threading.Thread(
            target=self._accept, args=(self.listener,), name=f"proxy-{self.port}", daemon=True
        )

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self.listener.close()
        self._close_all()

    # What the test does

    def cut(self) -> None:
        """Close every proxied connection now and close each new one as soon as it is accepted."""
        with self._lock:
            self._cut = True
        self._close_all()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def refuse(self) -> None:
        """Stop listening: a new connection is refused (ECONNREFUSED), so a request provably never left."""
        _close(self.listener)  # shutdown first: a close alone leaves the socket listening under the blocked accept()

    def listen(self) -> None:
        """Listen again on the same port after refuse()."""
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), name=f"proxy-{self.port}", daemon=True).start()

    def drop_replies(self, count: int = 1) -> None:
        """The next `count` replies: when the server's first bytes come back, close both sides instead."""
        with self._lock:
            self._drops += count

    # How it works

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _close(sock)

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                refused = self._cut
            if refused:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._open |= {client, server}
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if replies:
                    with self._lock:
                        drop = self._drops > 0
                        if drop:
                            self._drops -= 1
                            self.dropped += 1
                    if drop:
                        break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                _close(sock)
            with self._lock:
                self._open -= {source, sink}


class RedisServer:
    """A redis-server on a free port of 127.0.0.1 that the test may kill (SIGKILL) and start again on the same port:
    no RDB, no AOF, so it comes back empty, as a Redis without persistence does after a crash."""

    BINARY = "redis-server"

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def available(cls) -> bool:
        return shutil.which(cls.BINARY) is not None

    def start(self) -> RedisServer:
        command = [self.BINARY, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        if not _listening(self.process, self.port):
            self.kill()
            raise RuntimeError(f"redis-server did not start on port {self.port}")
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def production_env(**extra: str) -> dict[str, str]:
    """The environment of a production deployment (DEBUG off, a real secret, this host), for a child process: it
    signs audit events with this process's audit keys, so what it writes verifies here."""
    from django.conf import settings

    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DEBUG"}}
    env.update(
        DEBUG="0",
        SECRET_KEY="test-production-secret-" + "k7Qz9" * 8,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        SECURE_SSL_REDIRECT="0",
        PYTHONUNBUFFERED="1",
        RECOVERY_AUDIT_KEYS=keyring_text(settings.RECOVERY_AUDIT_KEYS),
    )
    env.update(extra)
    return env

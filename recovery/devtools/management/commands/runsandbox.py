"""`manage.py runsandbox`: serve the sandbox provider (docs/sandbox.md) as its own process.

This command is the only place the sandbox meets Django, and only to be started: the `recovery.devtools.sandbox` package
itself imports no Django and no product code.
"""

import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from recovery.devtools.sandbox.app import SandboxConfig
from recovery.devtools.sandbox.server import make_server, serve


class Command(BaseCommand):
    help = "Serve the sandbox provider: orders, payments, refunds, shipments and access grants, with fault injection."
    # The sandbox needs neither the product's database nor its checks; starting fast matters for test fixtures.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8001, help="0 picks a free port (printed on startup)")
        parser.add_argument(
            "--db", default=str(Path(settings.BASE_DIR) / "var" / "sandbox.sqlite3"), help="the sandbox's SQLite file"
        )
        parser.add_argument("--api-key", default=os.environ.get("SANDBOX_API_KEY") or None, help="or SANDBOX_API_KEY")
        parser.add_argument("--callback-url", default=None, help="where to POST signed callbacks")
        parser.add_argument(
            "--callback-secret",
            default=os.environ.get("SANDBOX_CALLBACK_SECRET") or None,
            help="HMAC secret for callbacks, or SANDBOX_CALLBACK_SECRET",
        )
        parser.add_argument(
            "--latency-ms",
            type=int,
            default=0,
            help="every business request is answered no sooner than this after it arrived",
        )
        parser.add_argument(
            "--status-latency-ms", type=int, default=0, help="the same, on top, for status queries only"
        )

    def handle(self, *args, host, port, db, api_key, callback_url, callback_secret, latency_ms, status_latency_ms, **_):
        if latency_ms < 0 or status_latency_ms < 0:
            raise CommandError("latencies must be zero or positive")
        config = SandboxConfig(
            db_path=db,
            api_key=api_key,
            callback_url=callback_url,
            callback_secret=callback_secret,
            latency_ms=latency_ms,
            status_latency_ms=status_latency_ms,
        )
        try:
            server = make_server(config, host=host, port=port)
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc}") from exc
        serve(server, out=self.stdout)

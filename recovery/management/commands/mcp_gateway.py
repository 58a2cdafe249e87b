"""`manage.py mcp_gateway --listen host:port`: serve the MCP recovery gateway (docs/mcp-gateway.md), Streamable HTTP
at /mcp behind a bearer API token. It keeps nothing a restart loses: run as many copies as needed behind nginx.
"""

import uvicorn
from django.core.management.base import BaseCommand, CommandError

from recovery.api.mcp_gateway import gateway_app


class Command(BaseCommand):
    help = "Serve the MCP recovery gateway (Streamable HTTP at /mcp)."

    def add_arguments(self, parser):
        parser.add_argument("--listen", default="127.0.0.1:8765", help="host:port to listen on")

    def handle(self, *args, **options):
        host, _, port = options["listen"].rpartition(":")
        if not host or not port.isdigit():
            raise CommandError("--listen takes host:port, e.g. 127.0.0.1:8765")
        self.stdout.write(f"MCP gateway on http://{options['listen']}/mcp")
        uvicorn.run(gateway_app(host), host=host.strip("[]"), port=int(port), log_level="warning", lifespan="on")

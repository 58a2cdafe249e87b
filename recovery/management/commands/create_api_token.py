from django.core.management.base import BaseCommand, CommandError

from recovery.audit.chain import Actor
from recovery.models import TokenScope
from recovery.services.tokens import token_create


class Command(BaseCommand):
    help = (
        "Issue an API token scoped to one or more tenants of the registry: for an agent runtime (--scope runtime, "
        "the default) or a metrics scraper (--scope metrics: GET /metrics and GET /api/v1/metrics only). "
        "The token is printed once and stored only as a peppered hash."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="a unique name for the runtime, e.g. support-agent-prod")
        parser.add_argument(
            "--tenant", action="append", required=True, dest="tenants", help="a tenant name; repeat for several"
        )
        parser.add_argument(
            "--scope",
            choices=TokenScope.values,
            default=TokenScope.RUNTIME,
            help="runtime: the machine API (default); metrics: read the metrics only",
        )

    def handle(self, *args, name, tenants, scope, **options):
        try:
            token, raw = token_create(name=name, tenants=tenants, scope=scope, actor=Actor.system("create_api_token"))
        except ValueError as exc:
            raise CommandError(f"{exc}; no token was created") from None
        owners = ", ".join(sorted(tenant.name for tenant in token.tenants.all()))
        self.stdout.write(f"created {token.scope} API token {token.name!r} ({token.prefix}…) for {owners}")
        self.stdout.write(raw)
        self.stdout.write("Store it now: it will not be shown again. Send it as `Authorization: Bearer <token>`.")

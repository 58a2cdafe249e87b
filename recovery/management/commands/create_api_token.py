from django.core.management.base import BaseCommand, CommandError

from recovery.audit import Actor
from recovery.services.tokens import token_create


class Command(BaseCommand):
    help = (
        "Issue an API token for an agent runtime, scoped to one or more tenants of the registry. "
        "The token is printed once and stored only as a peppered hash."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="a unique name for the runtime, e.g. support-agent-prod")
        parser.add_argument(
            "--tenant", action="append", required=True, dest="tenants", help="a tenant name; repeat for several"
        )

    def handle(self, *args, name, tenants, **options):
        try:
            token, raw = token_create(name=name, tenants=tenants, actor=Actor.system("create_api_token"))
        except ValueError as exc:
            raise CommandError(f"{exc}; no token was created") from None
        scope = ", ".join(sorted(tenant.name for tenant in token.tenants.all()))
        self.stdout.write(f"created API token {token.name!r} ({token.prefix}…) for {scope}")
        self.stdout.write(raw)
        self.stdout.write("Store it now: it will not be shown again. Send it as `Authorization: Bearer <token>`.")

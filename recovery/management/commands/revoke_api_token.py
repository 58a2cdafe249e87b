from django.core.management.base import BaseCommand, CommandError

from recovery.audit.chain import Actor
from recovery.services.tokens import token_revoke


class Command(BaseCommand):
    help = "Revoke an API token by name: it stops authenticating at once. The row stays for the audit trail."

    def add_arguments(self, parser):
        parser.add_argument("name")

    def handle(self, *args, name, **options):
        try:
            token = token_revoke(name=name, actor=Actor.system("revoke_api_token"))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"revoked API token {token.name!r} ({token.prefix}…)")

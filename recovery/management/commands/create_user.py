import getpass
import os

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from recovery.audit.chain import Actor
from recovery.models.roles import ROLES
from recovery.services.users import user_save_with_roles


class Command(BaseCommand):
    help = (
        "Create a console user with one or more roles (viewer, reviewer, approver, admin), or reset an existing "
        "user's roles and password. The password comes from RECOVERY_PASSWORD or is asked for twice."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", action="append", required=True, choices=ROLES, dest="roles")
        parser.add_argument("--email", default="")

    def handle(self, *args, username, roles, email, **options):
        password = os.environ.get("RECOVERY_PASSWORD") or self._prompt()
        try:
            _, created = user_save_with_roles(
                username=username, roles=roles, password=password, email=email, actor=Actor.system("create_user")
            )
        except ValidationError as exc:
            raise CommandError("password refused: " + " ".join(exc.messages)) from None
        self.stdout.write(f"{'created' if created else 'updated'} {username} with roles {', '.join(sorted(roles))}")

    def _prompt(self) -> str:
        if not os.isatty(0):
            raise CommandError("no password: set RECOVERY_PASSWORD or run in a terminal")
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Password (again): "):
            raise CommandError("the passwords differ")
        return first

"""`make run`: migrate, make sure the demo users exist, and serve the console.

At this stage the console is the Django admin; the sandbox provider, background jobs and the demo agent join this
command as they are built.
"""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from recovery.audit import Actor
from recovery.roles import ROLES
from recovery.services.users import user_save_with_roles

DEMO_PASSWORD = "recovery-demo"


class Command(BaseCommand):
    help = "Migrate, create the demo users (one per role, password 'recovery-demo') and serve the console."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="host:port to serve on")
        parser.add_argument("--no-serve", action="store_true", help="prepare everything, then exit")

    def handle(self, *args, addr, no_serve, **options):
        call_command("migrate", interactive=False, verbosity=0)
        existing = set(get_user_model().objects.filter(username__in=ROLES).values_list("username", flat=True))
        for role in ROLES:
            if role not in existing:
                user_save_with_roles(username=role, roles=[role], password=DEMO_PASSWORD, actor=Actor.system("run"))
        database = settings.DATABASES["default"]
        self.stdout.write(
            f"database: {database['ENGINE'].rsplit('.', 1)[-1]} {database['NAME']}\n"
            f"demo users: {', '.join(ROLES)} (password '{DEMO_PASSWORD}'; the Django admin is for 'admin')\n"
            f"console: http://{addr}/admin/"
        )
        if not no_serve:
            call_command("runserver", addr, use_reloader=False)

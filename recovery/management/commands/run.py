"""`make run`: migrate, make sure the demo users exist, and serve the console with everything it needs.

Next to runserver, for the server's lifetime: the background jobs (the in-process runner in this process without
REDIS_URL; a `manage.py runjobs` subprocess with it) and the sandbox provider (`manage.py runsandbox` on port 8001,
its own process and store). The subprocesses are stopped when the server stops, Ctrl-C included.
"""

from __future__ import annotations

import io
import signal
import socket
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError

from recovery.audit import Actor
from recovery.cron import describe
from recovery.drills.stage import sandbox_env_defaults
from recovery.management.commands.runjobs import redacted
from recovery.models import Provider
from recovery.roles import ROLES
from recovery.services.users import user_save_with_roles

DEMO_PASSWORD = "recovery-demo"
SANDBOX_REGISTRY = Path(__file__).resolve().parents[2] / "fixtures" / "registry.example.json"
SANDBOX_PORT = 8001


class Command(BaseCommand):
    help = (
        "Migrate, create the demo users (one per role, password 'recovery-demo') and serve the console, "
        "with the background jobs and the sandbox provider."
    )

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="host:port to serve on")
        parser.add_argument("--no-serve", action="store_true", help="prepare everything, then exit")

    def handle(self, *args, addr, no_serve, **options):
        call_command("migrate", interactive=False, verbosity=0)
        if not Provider.objects.exists():  # a first run: the sandbox's registry (later edits are never overwritten)
            call_command("load_tools", str(SANDBOX_REGISTRY), stdout=io.StringIO())
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
            self.serve(addr)

    def serve(self, addr: str) -> None:
        # runserver would find a busy port only after the subprocesses started, and leave them behind (os._exit).
        _check_free(addr)
        sandbox_env_defaults()
        # `kill` (SIGTERM) unwinds through the finally below like Ctrl-C does, instead of orphaning the children.
        signal.signal(signal.SIGTERM, _exit)
        children: list[subprocess.Popen] = []
        runner = None
        try:
            if "runsandbox" in get_commands():
                children.append(self.start_sandbox(addr))
            else:
                self.stdout.write("sandbox: not started (there is no runsandbox command yet)")
            if settings.REDIS_URL:
                children.append(_manage("runjobs"))
                self.stdout.write(f"jobs: RQ worker and scheduler (runjobs) on {redacted(settings.REDIS_URL)}")
            else:
                from recovery import inprocess

                runner = inprocess.get_runner()
                runner.start()
                self.stdout.write(f"jobs: in-process; periodic: {describe(runner.periodic)}")
            call_command("runserver", addr, use_reloader=False)
        finally:
            if runner is not None:
                runner.stop()
            for child in reversed(children):
                _terminate(child)

    def start_sandbox(self, addr: str) -> subprocess.Popen:
        callback_url = f"http://{addr}/api/v1/providers/sandbox/callbacks"
        store = settings.VAR_DIR / "sandbox.sqlite3"
        child = _manage("runsandbox", "--port", str(SANDBOX_PORT), "--db", str(store), "--callback-url", callback_url)
        self.stdout.write(f"sandbox: http://127.0.0.1:{SANDBOX_PORT}/ (store {store}; callbacks to {callback_url})")
        return child


def _manage(*args: str) -> subprocess.Popen:
    # A session of its own: Ctrl-C reaches only this process, which then stops each child once and in order (an
    # RQ worker hit by SIGINT and then SIGTERM would kill its running job instead of letting it finish).
    return subprocess.Popen(
        [sys.executable, str(settings.BASE_DIR / "manage.py"), *args],
        cwd=settings.BASE_DIR,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM if this process dies without running its finally (kill -9, os._exit).
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _terminate(child: subprocess.Popen, timeout: float = 15) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _check_free(addr: str) -> None:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        with socket.create_server((host, int(port)), family=socket.AF_INET6 if ":" in host else socket.AF_INET):
            pass
    except OSError as error:
        raise CommandError(f"cannot serve on {addr}: {error.strerror}; stop what uses it or pass --addr") from None
    except ValueError:
        raise CommandError(f"--addr {addr!r}: use host:port, e.g. 127.0.0.1:8000") from None


def _exit(signum, frame):
    sys.exit(0)

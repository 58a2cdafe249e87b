"""`make run`: migrate, make sure the demo users exist, and serve the console with what it needs beside runserver for
its lifetime — the background jobs (in-process without REDIS_URL, a `runjobs` subprocess with it) and the sandbox
provider at RECOVERY_SANDBOX_ADDR — stopping them with it; on a first run the demo agent plays its scenarios once
both answer (docs/development.md, docs/demo-agent.md).
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from recovery.audit.chain import Actor
from recovery.devtools.drills.stage import (
    DEMO_TENANT,
    SANDBOX_REGISTRY,
    demo_registry,
    demo_sandbox_url,
    demo_stage,
    sandbox_env_defaults,
)
from recovery.jobs import inprocess
from recovery.jobs.cron import PERIODIC
from recovery.jobs.schedule import describe
from recovery.management.commands.runjobs import redacted
from recovery.models import Provider, Task, Tenant
from recovery.models.roles import ROLES
from recovery.registry import load_registry, provider_move
from recovery.services.tokens import token_create, token_revoke
from recovery.services.users import user_save_with_roles

logger = logging.getLogger("recovery.demo")

DEMO_PASSWORD = "recovery-demo"


class Command(BaseCommand):
    help = (
        "Migrate, create the demo users (one per role, password 'recovery-demo') and serve the console, "
        "with the background jobs and the sandbox provider."
    )

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="host:port to serve on")
        parser.add_argument("--no-serve", action="store_true", help="prepare everything, then exit")
        parser.add_argument(
            "--demo",
            choices=["auto", "always", "never"],
            default="auto",
            help="run the demo agent's scenarios once the console is up (auto: while the demo tenant has no tasks)",
        )

    def handle(self, *args, addr, no_serve, demo, **options):
        call_command("migrate", interactive=False, verbosity=0)
        registry = demo_registry()
        sandbox = registry["providers"][0]
        actor = Actor.system("run")
        if not Provider.objects.exists():  # a first run: the sandbox's registry (later edits are never overwritten)
            load_registry(registry, actor=actor, source=str(SANDBOX_REGISTRY))
        elif provider_move(
            name=sandbox["name"], base_url=sandbox["base_url"], actor=actor, source="RECOVERY_SANDBOX_ADDR"
        ):
            self.stdout.write(
                f"registry: provider {sandbox['name']!r} now at {sandbox['base_url']} (RECOVERY_SANDBOX_ADDR)"
            )
        existing = set(get_user_model().objects.filter(username__in=ROLES).values_list("username", flat=True))
        for role in ROLES:
            if role not in existing:
                user_save_with_roles(username=role, roles=[role], password=DEMO_PASSWORD, actor=Actor.system("run"))
        database = settings.DATABASES["default"]
        self.stdout.write(
            f"database: {database['ENGINE'].rsplit('.', 1)[-1]} {database['NAME']}\n"
            f"demo users: {', '.join(ROLES)} (password '{DEMO_PASSWORD}'; the Django admin is for 'admin')\n"
            f"console: http://{addr}/ (sign in as 'reviewer'); Django admin: http://{addr}/admin/"
        )
        if not no_serve:
            self.serve(addr, demo=self.demo_wanted(demo))

    def demo_wanted(self, demo: str) -> bool:
        if demo == "never" or not Tenant.objects.filter(name=DEMO_TENANT).exists():
            return False
        return demo == "always" or not Task.objects.filter(tenant__name=DEMO_TENANT).exists()

    def serve(self, addr: str, *, demo: bool = False) -> None:
        # runserver would find a busy port only after the subprocesses started, and leave them behind (os._exit).
        _check_free(addr)
        _check_free(settings.RECOVERY_SANDBOX_ADDR, setting="RECOVERY_SANDBOX_ADDR")
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
                runner = inprocess.get_runner(PERIODIC)
                runner.start()
                self.stdout.write(f"jobs: in-process; periodic: {describe(runner.periodic)}")
            if demo:
                threading.Thread(target=self.play_demo, args=(addr,), name="demo-agent", daemon=True).start()
            call_command("runserver", addr, use_reloader=False)
        finally:
            if runner is not None:
                runner.stop()
            for child in reversed(children):
                _terminate(child)

    def play_demo(self, addr: str) -> None:
        """The demo agent's scenarios against this console and sandbox, once both answer (a thread next to
        runserver): what a new user sees in the queues is made by a runtime through the API, not inserted."""
        from recovery.devtools.scenarios import run_scenarios

        url = f"http://{addr}"
        sandbox_url = demo_sandbox_url()
        if not (_answers(f"{url}/api/v1/openapi.json") and _answers(f"{sandbox_url}/_sandbox/health")):
            self.stdout.write(
                "demo: the console or the sandbox did not come up; run `python manage.py demo_agent` later"
            )
            return
        name = f"demo-agent-{uuid.uuid4().hex[:8]}"
        actor = Actor.system("run")
        try:
            _, token = token_create(name=name, tenants=[DEMO_TENANT], actor=actor)
            self.stdout.write("demo: the demo agent runs its scenarios against the sandbox (log lines below)")
            results = run_scenarios(demo_stage(url, token), None, log=lambda line: self.stdout.write(f"demo: {line}"))
            token_revoke(name=name, actor=actor)
            passed = sum(1 for result in results if result.passed)
            self.stdout.write(
                f"demo: {passed} of {len(results)} scenarios ended as pinned. Look at the queues: "
                f"{url}/queues/unknown/ (UNKNOWN calls are settled by receipts within seconds) and "
                f"{url}/queues/human-review/ (items waiting for a reviewer) and "
                f"{url}/queues/compensation-problems/ (an aborted saga whose cancel was refused). "
                f"Run the scenarios again with `python manage.py demo_agent`."
            )
        except Exception:
            logger.exception("demo: the demo agent failed")
        finally:
            connections.close_all()

    def start_sandbox(self, addr: str) -> subprocess.Popen:
        callback_url = f"http://{addr}/api/v1/providers/sandbox/callbacks"
        store = settings.VAR_DIR / "sandbox.sqlite3"
        host, _, port = settings.RECOVERY_SANDBOX_ADDR.rpartition(":")
        child = _manage(
            "runsandbox", "--host", host.strip("[]"), "--port", port, "--db", str(store), "--callback-url", callback_url
        )
        self.stdout.write(f"sandbox: {demo_sandbox_url()}/ (store {store}; callbacks to {callback_url})")
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


def _answers(url: str, timeout_s: float = 60) -> bool:
    """Whether `url` answers (any HTTP status) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=2)
            return True
        except requests.RequestException:
            time.sleep(0.2)
    return False


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


def _check_free(addr: str, *, setting: str = "") -> None:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    # `make run` passes them on as SANDBOX_ADDR= and ADDR= (a make target takes no --option).
    if setting:
        fix = f"set {setting} to another host:port (make run SANDBOX_ADDR=host:port)"
    else:
        fix = "pass --addr host:port (make run ADDR=host:port)"
    try:
        with socket.create_server((host, int(port)), family=socket.AF_INET6 if ":" in host else socket.AF_INET):
            pass
    except OSError as error:
        raise CommandError(f"cannot serve on {addr}: {error.strerror}; stop what uses it or {fix}") from None
    except ValueError:
        raise CommandError(f"--addr {addr!r}: use host:port, e.g. 127.0.0.1:8000") from None


def _exit(signum, frame):
    sys.exit(0)

"""The stage a drill or the demo plays on: the API over HTTP, a sandbox provider, background jobs, a tenant and token
(`drill_stage()`, `demo_stage()`). Drills get a registry of their own (the shipped one renamed `drill.<name>`, quick
schedules, tenant `drills`, two refund tools for the probe drills), drill users for operator actions (`drill_people`)
and, with REDIS_URL, `runjobs` processes they can kill (`JobWorkers`); docs/drills.md describes them.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from urllib.parse import quote

import requests
from django.apps import apps as django_apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.handlers.wsgi import WSGIHandler
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.db import connection
from recovery_client import RecoveryClient

from recovery.audit.chain import Actor
from recovery.devtools.agent import Agent, ToolBook
from recovery.devtools.sandbox.process import SandboxClient, SandboxProcess
from recovery.jobs import inprocess
from recovery.jobs.cron import PERIODIC
from recovery.models.roles import APPROVER, REVIEWER, sync_roles
from recovery.registry import load_registry
from recovery.services.tokens import token_create, token_revoke
from recovery.services.users import user_save_with_roles

SANDBOX_REGISTRY = Path(__file__).resolve().parents[2] / "fixtures" / "registry.example.json"
# Both sides read these: the sandbox to check requests and sign callbacks, the product (through the registry's
# `secret_env` names) to authenticate to it and verify the callbacks. Real values from the environment win.
SANDBOX_ENV_DEFAULTS = {
    "SANDBOX_API_KEY": "sandbox-dev-key",
    "SANDBOX_CALLBACK_SECRET": "sandbox-dev-callback-secret",
}
DEMO_TENANT = "demo"
DRILL_TENANT = "drills"
DRILL_PROVIDER = "drill-sandbox"
DRILL_PREFIX = "drill."
# Drills wait for reconciliation: one check a second, three of them, instead of the production schedules.
DRILL_RECONCILE = {"first_check_s": 1, "backoff": 1, "max_checks": 3, "deadline_s": 600}
# A drill's refund with no outcome is swept to UNKNOWN after this (the shipped 30 s), and a drill worker's claim on an
# action's execution lapses after this (the product's 120 s; the service keeps it above the provider's timeouts plus
# a margin, 14 s on the drill provider): the worker-killed drill waits out both.
DRILL_OUTCOME_TIMEOUT_S = 10
DRILL_ACTION_LEASE_S = 10
# Two refund tools of the drills' own, so that what a duplicate probe decides about them (docs/replay.md) never touches
# refund.create: both replay-safe, with replay reconciliation on and an explicit key retention. The status-down drill
# probes REPLAYED_REFUND safe and lets reconciliation replay it (docs/replay.md); the provider-ignores-keys drill probes
# KEYLESS_REFUND against a sandbox in broken mode and finds it unsafe. Each new stage's sandbox has a new address, so
# loading the drill registry voids both retry paths again (back to unprobed).
REPLAYED_REFUND = "refund.replayed"
KEYLESS_REFUND = "refund.ignores-keys"
LISTED_REFUND = "refund.listed"  # a refund whose lost outcome is found by listing the order's refunds (no key lookup)
LIST_LAG_MS = 5000  # the eventually-consistent-search drill: how long the sandbox keeps a new refund out of listings
LIST_VISIBLE_AFTER_S = 8  # and what the tool's lookup declares: not listed proves nothing before that
SQUARE_REFUND = "refund.square-wire"  # a refund sent as Square's wire format: form body, the key in a body field
DRILL_KEY_RETENTION_S = 86_400
# Who acts in the drills that need an approved action: one reviewer and two approvers (four eyes, two at once).
DRILL_REVIEWER = "drill-reviewer"
DRILL_APPROVERS = ("drill-approver-1", "drill-approver-2")


def sandbox_env_defaults() -> None:
    for name, value in SANDBOX_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


def shipped_registry() -> dict:
    return json.loads(SANDBOX_REGISTRY.read_text())


def demo_sandbox_url() -> str:
    """Where `make run` serves the sandbox: RECOVERY_SANDBOX_ADDR."""
    return f"http://{settings.RECOVERY_SANDBOX_ADDR}"


def demo_registry() -> dict:
    """The shipped sandbox registry as `make run` loads it: its provider at RECOVERY_SANDBOX_ADDR."""
    registry = shipped_registry()
    registry["providers"][0]["base_url"] = demo_sandbox_url()
    return registry


@dataclass(kw_only=True)
class Stage:
    api_url: str
    token: str
    tenant: str
    sandbox: SandboxClient
    registry: dict
    prefix: str = ""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    jobs: str = ""  # how background jobs run, for the log
    workers: JobWorkers | None = None  # the RQ worker processes (REDIS_URL), None for the in-process runner

    def tool(self, name: str) -> str:
        """The registered name of one of the shipped sandbox tools on this stage."""
        return self.prefix + name

    def key(self, name: str) -> str:
        """A name unique to this run (idempotency keys, task ids): runs never meet each other's keys."""
        return f"{name}-{self.run_id}"

    def client(self) -> RecoveryClient:
        return RecoveryClient(self.api_url, self.token)

    def agent(self, *, log: Callable[[str], None] = lambda line: None, **options) -> Agent:
        return Agent(self.client(), ToolBook.from_registry(self.registry), tenant=self.tenant, log=log, **options)


# The drill registry -------------------------------------------------------------------------------------------------


def callback_url(api_url: str) -> str:
    """Where the drills' sandbox delivers its signed callbacks: the drill provider's callback route on the API."""
    return f"{api_url.rstrip('/')}/api/v1/providers/{DRILL_PROVIDER}/callbacks"


def drill_registry(sandbox_url: str) -> dict:
    """The shipped sandbox registry as the drills' own: `drill.` tools on `drill-sandbox`, quick schedules."""
    shipped = shipped_registry()
    provider = copy.deepcopy(shipped["providers"][0]) | {"name": DRILL_PROVIDER, "base_url": sandbox_url}
    provider["read_timeout_s"] = 2
    # The status-down drill fails three status queries on purpose: that alone must never open the status endpoint's
    # breaker, or the drills after it (the backlog's thousand checks) would be skipped as unreachable.
    provider["status_breaker"] = {"window_s": 60, "min_calls": 20, "failure_rate": 0.5, "cooldown_s": 5}
    tools = []
    for original in shipped["tools"]:
        tool = copy.deepcopy(original)
        tool["name"] = DRILL_PREFIX + tool["name"]
        tool["provider"] = DRILL_PROVIDER
        tool["alternates"] = [DRILL_PREFIX + name for name in tool.get("alternates", [])]
        if "compensation" in tool:
            tool["compensation"]["tool"] = DRILL_PREFIX + tool["compensation"]["tool"]
        if "reconcile" in tool:
            tool["reconcile"] = dict(DRILL_RECONCILE)
        if "backoff" in tool:
            tool["backoff"] = {"base_ms": 200, "cap_ms": 1000, "jitter": "proportional"}
        tools.append(tool)
    by_name = {tool["name"]: tool for tool in tools}
    # The 5xx drill opens order.lookup's breaker with a handful of failures and waits out a short cooldown.
    by_name[DRILL_PREFIX + "order.lookup"]["breaker"] = {
        "window_s": 60,
        "bucket_s": 10,
        "min_calls": 4,
        "failure_rate": 0.5,
        "cooldown_s": 3,
        "half_open_probes": 1,
        "probe_lease_s": 30,
    }
    # The rate-limit drill's lookup: three attempts (two 429s, then the answer), and a breaker that its 429s never
    # open, so the drill can run again at once (the 5xx drill has order.lookup's breaker to itself).
    replica = by_name[DRILL_PREFIX + "order.lookup_replica"]
    replica["budgets"] = {"max_attempts": 3}
    replica["breaker"] = {"min_calls": 1_000_000}
    # The backlog drill loses a thousand refund replies on purpose: refund.create's breaker must not take that as
    # an outage (a lost reply counts as a failure of the tool).
    refund = by_name[DRILL_PREFIX + "refund.create"]
    refund["breaker"] = {"min_calls": 1_000_000}
    # The worker-killed drill's replay never gets an outcome: the sweeper takes it after this, not after 30 s. Every
    # other drill reports its refund's outcome within the 2 s read timeout.
    refund["outcome_timeout_s"] = DRILL_OUTCOME_TIMEOUT_S
    for name in (REPLAYED_REFUND, KEYLESS_REFUND):
        twin = copy.deepcopy(refund) | {"name": DRILL_PREFIX + name, "key_retention_s": DRILL_KEY_RETENTION_S}
        twin["description"] = f"A refund tool of the drills' own ({name}): its retry path is probed."
        twin["reconcile"] = DRILL_RECONCILE | {"replay_when_status_down": True}
        by_name[twin["name"]] = twin
        tools.append(twin)
    for extra in (_square_wire(refund), _listed(refund)):
        by_name[extra["name"]] = extra
        tools.append(extra)
    # Square's error shape first; the sandbox's own ({"error": {"code"}}) and a bare code read as before.
    provider["error_code_paths"] = ["errors[0].code", "error.code", "code"]
    tenant = {"name": DRILL_TENANT, "display_name": "Fault drills", "sandbox": True, "tools": sorted(by_name)}
    return {"tenants": [tenant], "providers": [provider], "tools": tools}


def _square_wire(refund: dict) -> dict:
    """A refund on another provider's wire format (docs/providers.md): form-encoded, its key in the body's
    idempotency_key field, a card decline read from Square's {"errors": [{"code"}]} body as a refusal."""
    square = copy.deepcopy(refund) | {"name": DRILL_PREFIX + SQUARE_REFUND, "refusal_codes": ["CARD_DECLINED"]}
    square["description"] = "A refund of the drills' own on Square's wire format (form body, the key in a field)."
    square["request"] = {**refund["request"], "encoding": "form", "key": {"field": "idempotency_key"}}
    return square


def _listed(refund: dict) -> dict:
    """A refund with no lookup by key (docs/providers.md): its request carries the key as a marker in its metadata,
    and a lost outcome is found by listing the order's refunds and matching it, as Stripe's refunds are."""
    listed = copy.deepcopy(refund) | {"name": DRILL_PREFIX + LISTED_REFUND}
    listed["description"] = "A refund of the drills' own found by listing the order's refunds (no lookup by key)."
    body = {**refund["request"]["body"], "metadata": {"recovery_key": "{idempotency_key}"}}
    listed["request"] = {**refund["request"], "body": body}
    listed["status_query"] = {
        "kind": "list",
        "method": "GET",
        "path": "/refunds/list",
        "query": {"order_id": "{order_id}", "limit": 10},
        "items": "data",
        "match": {"metadata.recovery_key": "{idempotency_key}"},
        "ref_field": "refund_id",
        "next": {"param": "starting_after", "cursor": "refund_id", "more": "has_more"},
        "max_pages": 5,
        "visible_after_s": LIST_VISIBLE_AFTER_S,
    }
    # Checks a second apart until the window has passed twice over: a search that lags is waited out, not judged.
    listed["reconcile"] = DRILL_RECONCILE | {"max_checks": 2 * LIST_VISIBLE_AFTER_S}
    return listed


# The pieces ---------------------------------------------------------------------------------------------------------


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class ApiServer:
    """The console's WSGI application on a free port, served from threads of this process."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = ThreadedWSGIServer((host, port), _QuietHandler, allow_reuse_address=True)
        self.server.set_app(WSGIHandler())
        self.thread = threading.Thread(target=self.server.serve_forever, name="drill-api", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> ApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ApiProcesses:
    """The console's WSGI application served by gunicorn worker processes on a free port, on this process's
    database: what the drill command uses, so its many agent threads never share an interpreter lock with the API
    they call."""

    def __init__(self, *, workers: int, threads: int = 8, log_dir: Path) -> None:
        self.workers, self.threads, self.log_path = workers, threads, log_dir / f"api-{os.getpid()}.log"
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> ApiProcesses:
        with socket.socket() as probe:  # a free port (released again; nothing else here takes ports meanwhile)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
        if settings.REDIS_URL:
            env["REDIS_URL"] = settings.REDIS_URL
        command = [sys.executable, "-m", "gunicorn", "console.wsgi:application", "--bind", f"127.0.0.1:{port}"]
        command += ["--workers", str(self.workers), "--threads", str(self.threads), "--log-level", "warning"]
        with open(self.log_path, "a") as out:
            self.process = subprocess.Popen(
                command, cwd=settings.BASE_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                # Any answer proves it serves (a 404 too); a cold first request may be slow on a busy machine, and
                # whatever goes wrong here, the processes started above are stopped before the error goes up.
                requests.get(f"{self.url}/api/v1/calls/0", timeout=10)
                return self
            except requests.RequestException:
                time.sleep(0.1)
            except BaseException:
                self.stop()
                raise
        self.stop()
        raise RuntimeError(f"the API (gunicorn) did not start: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def database_url() -> str:
    """The URL of the database this process uses (a test run's test database included), for child processes."""
    config = connection.settings_dict
    if connection.vendor == "postgresql":
        user = quote(config.get("USER") or "", safe="")
        password = f":{quote(config['PASSWORD'], safe='')}" if config.get("PASSWORD") else ""
        host, port = config.get("HOST") or "localhost", config.get("PORT") or 5432
        return f"postgres://{user}{password}@{host}:{port}/{config['NAME']}"
    return f"sqlite:///{Path(config['NAME']).resolve()}"


@dataclass
class Jobs:
    description: str  # how background jobs run, for the log
    workers: JobWorkers | None = None


class JobWorkers:
    """The stage's RQ worker processes (`manage.py runjobs`), each in a session of its own. The worker-killed drill
    finds the one running its job here (`holding`), kills it with SIGKILL (`kill`) and starts a replacement, as a
    supervisor would; a job's lease names its work horse's pid, forked from one of these."""

    def __init__(self, *, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.processes: list[subprocess.Popen] = []
        self._numbers = count()

    def start(self, *args: str) -> subprocess.Popen:
        """One more `runjobs` process (`args`: its options, as `--role worker`)."""
        with open(self.log_dir / f"runjobs-{os.getpid()}-{next(self._numbers)}.log", "a") as out:
            child = subprocess.Popen(
                [sys.executable, str(settings.BASE_DIR / "manage.py"), "runjobs", *args],
                cwd=settings.BASE_DIR,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(child)
        return child

    def holding(self, pid: int) -> subprocess.Popen | None:
        """The worker that is `pid` or whose work horse `pid` is (rq forks one per job), if it is one of ours."""
        parent = parent_pid(pid)
        for child in self.processes:
            if child.poll() is None and child.pid in (pid, parent):
                return child
        return None

    def kill(self, worker: subprocess.Popen, horse_pid: int | None = None) -> None:
        """kill -9 the worker: its session (the worker and its scheduler process), then its work horse, which rq
        puts in a process group of its own."""
        with suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        if horse_pid and horse_pid != worker.pid:
            with suppress(ProcessLookupError):
                os.killpg(horse_pid, signal.SIGKILL)
        worker.wait()

    def replace(self, dead: subprocess.Popen) -> subprocess.Popen:
        if dead in self.processes:
            self.processes.remove(dead)
        return self.start()

    def stop(self) -> None:
        for child in self.processes:
            if child.poll() is None:
                child.terminate()
        for child in self.processes:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            # Then whatever its session's group still holds: a worker killed before it stopped its scheduler
            # process leaves that process running, with no parent to stop it.
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)


def parent_pid(pid: int) -> int | None:
    """A live process's parent pid (/proc on Linux, `ps` elsewhere); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        found = subprocess.run(["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True, check=False)
        return int(found.stdout) if found.stdout.strip().isdigit() else None
    return int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": state, then the parent's pid


@contextmanager
def background_jobs(*, workers: int = 1, log_dir: Path | None = None) -> Iterator[Jobs]:
    """Background jobs for the duration: `workers` RQ worker processes (`manage.py runjobs`) with REDIS_URL, the
    in-process runner without it."""
    if not settings.REDIS_URL:
        runner = inprocess.get_runner(PERIODIC)
        started = not runner.running
        if started:
            runner.start()
        try:
            yield Jobs("in-process jobs (no REDIS_URL)")
        finally:
            if started:
                runner.stop()
        return
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL, "PYTHONUNBUFFERED": "1"}
    # These workers serve a drill, whose registry checks every second: look for due checks (and silent SENT calls,
    # and executions whose worker died) every second too, and let a dead worker's execution lease lapse quickly.
    env["RECOVERY_RECONCILE_EVERY_S"] = "1"
    env["RECOVERY_SWEEP_EVERY_S"] = "1"
    env["RECOVERY_ACTIONS_EVERY_S"] = "1"
    env["RECOVERY_ACTION_LEASE_S"] = str(DRILL_ACTION_LEASE_S)
    pool = JobWorkers(env=env, log_dir=log_dir or Path(tempfile.gettempdir()))
    try:
        for _ in range(workers):
            pool.start()
        yield Jobs(f"{workers} RQ worker process(es) (manage.py runjobs)", pool)
    finally:
        pool.stop()


@contextmanager
def drill_stage(
    *,
    api_url: str | None = None,
    jobs: bool = True,
    workers: int = 1,
    work_dir: Path | None = None,
    api_workers: int = 0,
) -> Iterator[Stage]:
    """Everything a drill run needs, started here and stopped on exit: the API (unless `api_url` names one that
    serves this database: threads of this process, or `api_workers` gunicorn processes), a sandbox on a free port
    with callbacks to the API, the drill registry, a token for the drills tenant, and background jobs."""
    sandbox_env_defaults()
    with ExitStack() as stack:
        tmp = work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="drill-")))
        if api_url is None:
            server = ApiProcesses(workers=api_workers, log_dir=tmp) if api_workers else ApiServer()
            server.start()
            stack.callback(server.stop)
            api_url = server.url
        sandbox = SandboxProcess(
            tmp / "sandbox.sqlite3",
            api_key=os.environ["SANDBOX_API_KEY"],
            callback_secret=os.environ["SANDBOX_CALLBACK_SECRET"],
            extra_args=("--callback-url", callback_url(api_url)),
        ).start()
        stack.callback(sandbox.stop)
        registry = drill_registry(sandbox.url)
        load_registry(registry, actor=Actor.system("drill"), source="drill registry")
        run_id = uuid.uuid4().hex[:8]
        name = f"drill-{run_id}"
        _, token = token_create(name=name, tenants=[DRILL_TENANT], actor=Actor.system("drill"))
        stack.callback(lambda: token_revoke(name=name, actor=Actor.system("drill")))
        running = stack.enter_context(background_jobs(workers=workers, log_dir=tmp)) if jobs else Jobs("no jobs")
        yield Stage(
            api_url=api_url,
            token=token,
            tenant=DRILL_TENANT,
            sandbox=sandbox,
            registry=registry,
            prefix=DRILL_PREFIX,
            run_id=run_id,
            jobs=running.description,
            workers=running.workers,
        )


def demo_stage(api_url: str, token: str) -> Stage:
    """The demo tenant on the shipped registry, against the console and the sandbox `make run` started."""
    sandbox_env_defaults()
    registry = demo_registry()
    sandbox = SandboxClient(demo_sandbox_url(), api_key=os.environ["SANDBOX_API_KEY"])
    return Stage(api_url=api_url, token=token, tenant=DEMO_TENANT, sandbox=sandbox, registry=registry)


# The drill's people -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class People:
    reviewer: object  # a User: previews and requests
    approvers: tuple  # two Users with the approver role: decide, two at once


def drill_people() -> People:
    """The drill reviewer and its two approvers, created with a random password nobody is told when missing (each
    creation an audit event); the role groups are made again first if a test's flush removed them."""
    if Group.objects.filter(name__in=(REVIEWER, APPROVER)).count() < 2:
        sync_roles(django_apps)
    wanted = {DRILL_REVIEWER: REVIEWER, **dict.fromkeys(DRILL_APPROVERS, APPROVER)}
    users = {}
    User = get_user_model()
    for username, role in wanted.items():
        user = User.objects.filter(username=username, groups__name=role).first()
        if user is None:
            user, _ = user_save_with_roles(
                username=username, roles=[role], password=secrets.token_urlsafe(24), actor=Actor.system("drill")
            )
        users[username] = user
    return People(reviewer=users[DRILL_REVIEWER], approvers=tuple(users[name] for name in DRILL_APPROVERS))

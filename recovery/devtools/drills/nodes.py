"""Several nodes on one machine: the production topology as separate processes (PgBouncer, web processes behind
nginx, workers, scheduler candidates, the sandbox), a refund backlog whose replies are all lost, and one web process,
one worker and the scheduler's holder killed with SIGKILL meanwhile; then the checks. `manage.py nodes` runs it,
`tests/test_several_nodes.py` in CI; docs/deploy.md ("Several nodes on one machine") has the scenario and checks.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection
from recovery_client.runtime import CallResult

from recovery.devtools.drills.evidence import chunks
from recovery.devtools.drills.servers import Nginx, PgBouncer, WebServer
from recovery.devtools.drills.stage import JobWorkers, Stage, drill_stage, sandbox_env_defaults
from recovery.engine.states import RECONCILABLE
from recovery.engine.states import CallState as S
from recovery.jobs.cron import Scheduler
from recovery.models import Attempt, AuditEvent, Call, Tool
from recovery.selectors.job_processes import scheduler_holder

WEB, WEB_PROCESSES, WEB_THREADS = 2, 2, 4  # web machines; gunicorn processes and threads on each
WORKERS, SCHEDULERS = 4, 2
THREADS = 16  # runtime threads making refunds at once
REFUNDS = 2_000
KILL_AT = {"web": 0.25, "worker": 0.5, "scheduler holder": 0.75}  # share of the refunds made when each dies
UNSETTLED = (S.SENT, *sorted(RECONCILABLE), S.NOT_COMMITTED)
Log = Callable[[str], None]


@dataclass
class Check:
    name: str
    passed: bool
    observed: str


@dataclass
class NodesResult:
    refunds: int
    checks: list[Check] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)  # seconds, in the order they happened
    counts: dict[str, int] = field(default_factory=dict)
    rate: float = 0.0  # refunds made per second (each: a task, a call, its admission and its report)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    def check(self, name: str, passed: bool, observed: str) -> None:
        self.checks.append(Check(name, bool(passed), observed))

    def lines(self) -> list[str]:
        out = [f"several nodes: {self.refunds:,} refunds — {'PASS' if self.passed else 'FAIL'}"]
        out += [f"  {'ok  ' if c.passed else 'FAIL'} {c.name}: {c.observed}" for c in self.checks]
        out += [f"  {name}: {seconds:.1f} s" for name, seconds in self.times.items()]
        out.append(f"  refunds made per second: {self.rate:.1f}")
        out += [f"  {name}: {number:,}" for name, number in self.counts.items()]
        return out


class Topology:
    """The processes of docs/deploy.md on this machine, on this process's database and `redis_url`; `env`: the
    children's environment (production settings), to which the database (through PgBouncer), Redis and this
    process's token pepper are added. Stopped (TERM, then KILL) on exit, whatever was killed before."""

    def __init__(self, *, env: dict[str, str], redis_url: str, work_dir: Path) -> None:
        self.redis_url, self.work_dir = redis_url, work_dir
        self.env = dict(env)
        self.webs: list[WebServer] = []
        self.workers = self.schedulers = None
        self.nginx: Nginx | None = None
        self.bouncer: PgBouncer | None = None
        self._stack = ExitStack()

    @property
    def url(self) -> str:
        return self.nginx.tls_url

    def __enter__(self) -> Topology:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        db = connection.settings_dict
        if connection.vendor != "postgresql":
            raise RuntimeError(f"several nodes need PostgreSQL (PgBouncer in front of it), this is {connection.vendor}")
        # PgBouncer runs as postgres when this is root: a folder of its own it can reach, not under the work folder.
        bouncer_dir = Path(tempfile.mkdtemp(prefix="nodes-pgbouncer-"))
        self._stack.callback(shutil.rmtree, bouncer_dir, True)
        self.bouncer = self._stack.enter_context(
            PgBouncer(
                db.get("HOST") or "127.0.0.1",
                int(db.get("PORT") or 5432),
                user=db["USER"],
                password=db.get("PASSWORD") or "",
                workdir=bouncer_dir,
            )
        )
        password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
        user = quote(db["USER"], safe="")
        self.env.update(
            DATABASE_URL=f"postgres://{user}{password}@127.0.0.1:{self.bouncer.port}/{db['NAME']}",
            DATABASE_TRANSACTION_POOLING="1",
            REDIS_URL=self.redis_url,
            RECOVERY_TOKEN_PEPPER=settings.RECOVERY_TOKEN_PEPPER,
            TRUST_X_FORWARDED_PROTO="1",
            # As the drills' workers: look for due checks and silent SENT calls every second (their tools check
            # a second after the send).
            RECOVERY_RECONCILE_EVERY_S="1",
            RECOVERY_SWEEP_EVERY_S="1",
            RECOVERY_AUDIT_CHECKPOINT_DIR=str(self.work_dir / "checkpoints"),  # the scheduler holder's
            PYTHONUNBUFFERED="1",
        )
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        for n in range(WEB):
            log = self.work_dir / f"web-{n + 1}.log"
            web = WebServer(self.env, log_path=log, workers=WEB_PROCESSES, threads=WEB_THREADS, shipped=True)
            self.webs.append(self._stack.enter_context(web))
        static = self.work_dir / "static"
        static.mkdir(parents=True, exist_ok=True)
        upstreams = [f"127.0.0.1:{web.port}" for web in self.webs]
        self.nginx = self._stack.enter_context(Nginx(upstreams, static_root=static, workdir=self.work_dir / "nginx"))
        self.workers = JobWorkers(env=self.env, log_dir=self.work_dir)
        self._stack.callback(self.workers.stop)
        self.schedulers = JobWorkers(env=self.env, log_dir=self.work_dir)
        self._stack.callback(self.schedulers.stop)
        for _ in range(WORKERS):
            self.workers.start("--role", "worker")
        for _ in range(SCHEDULERS):
            self.schedulers.start("--role", "scheduler")

    def redis(self):
        import redis

        return redis.Redis.from_url(self.redis_url)

    def holder(self) -> str | None:
        return scheduler_holder(self.redis())[0]

    def kill_web(self, web: WebServer) -> None:
        """kill -9 a web process: its gunicorn master and workers (its session)."""
        with suppress(ProcessLookupError):
            os.killpg(web.process.pid, signal.SIGKILL)
        web.process.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.work_dir.glob("*.log"))
        )


@contextmanager
def _ca_bundle(path: Path) -> Iterator[None]:
    """Clients of this process and the sandbox it starts trust the run's own certificate (nginx's TLS)."""
    before = os.environ.get("REQUESTS_CA_BUNDLE")
    os.environ["REQUESTS_CA_BUNDLE"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("REQUESTS_CA_BUNDLE", None)
        else:
            os.environ["REQUESTS_CA_BUNDLE"] = before


def run_nodes(
    *, refunds: int = REFUNDS, env: dict[str, str], redis_url: str, log: Log = print, work_dir: Path | None = None
) -> NodesResult:
    """Stand the topology up, play the scenario, check it, stop everything; `env`: the children's environment."""
    if refunds < 8:
        raise ValueError("refunds must be at least 8 (the three kills happen at shares of them)")
    sandbox_env_defaults()
    env = {**os.environ, **env}  # the sandbox's keys (just defaulted) for the workers
    with ExitStack() as stack:
        tmp = work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nodes-")))
        began = time.monotonic()
        topology = stack.enter_context(Topology(env=env, redis_url=redis_url, work_dir=tmp))
        stack.enter_context(_ca_bundle(topology.nginx.certificate))
        stage = stack.enter_context(drill_stage(api_url=topology.url, jobs=False, work_dir=tmp))
        log(
            f"up in {time.monotonic() - began:.1f} s: nginx {topology.url} → {WEB} web processes "
            f"({WEB_PROCESSES} processes of {WEB_THREADS} threads each), {WORKERS} workers, "
            f"{SCHEDULERS} scheduler candidates, PgBouncer :{topology.bouncer.port}, "
            f"Redis {redis_url.rsplit('@', 1)[-1]}"
        )
        try:
            return _play(stage, topology, refunds, log)
        except BaseException:
            log(topology.logs())
            raise


def _play(stage: Stage, topology: Topology, refunds: int, log: Log) -> NodesResult:
    result = NodesResult(refunds)
    # No callbacks: every refund is settled by a worker's status query (the evidence of who checked what, when).
    stage.sandbox.configure(callback_url=None)
    tool = Tool.objects.get(name=stage.tool("refund.create"))
    deadline_s = float(tool.reconcile["deadline_s"])
    killer = _Killer(topology, tool, refunds, log)
    made: list[tuple[str, CallResult]] = []
    errors: list[str] = []
    lock, local = threading.Lock(), threading.local()
    began = time.monotonic()

    def one(n: int) -> None:
        if getattr(local, "agent", None) is None:  # one agent (one HTTP session) per thread
            local.agent = stage.agent(patience_s=0)
        key = stage.key(f"nodes-refund-{n:05d}")
        arguments = {"order_id": f"O-{int(stage.run_id, 16) % 10**8:08d}{n:05d}", "amount_cents": 1000 + n}
        try:
            stage.sandbox.fault(route="/refunds", key=key, kind="commit_then_drop", times=1)
            task = local.agent.start_task(stage.key(f"nodes-{n:05d}"), goal=f"refund {arguments['order_id']}")
            call = local.agent.run_call(task.id, step=1, tool=tool.name, key=key, arguments=arguments)
        except Exception as exc:  # an error the runtime could not get past: a failed check below
            with lock:
                errors.append(f"refund {n}: {type(exc).__name__}: {exc}")
            return
        with lock:
            made.append((key, call))
            done = len(made)
        killer.made(done)
        if done % max(1, refunds // 10) == 0:
            log(f"  {done:,} of {refunds:,} refunds made ({time.monotonic() - began:.1f} s)")

    with killer, ThreadPoolExecutor(THREADS, thread_name_prefix="nodes-runtime") as pool:
        list(pool.map(one, range(1, refunds + 1)))
        made_s = time.monotonic() - began
        killer.made(refunds)  # whatever errors cost, every kill happens
        killer.wait()
    log(f"  {len(made):,} refunds made in {made_s:.1f} s; waiting for reconciliation")

    ids = [call.call_id for _, call in made]

    def unsettled() -> int:
        return sum(Call.objects.filter(pk__in=chunk, state__in=UNSETTLED).count() for chunk in chunks(ids))

    drain_began = time.monotonic()
    while unsettled() and time.monotonic() - began < deadline_s:
        time.sleep(0.5)
    drained_s = time.monotonic() - drain_began
    result.times = {
        "refunds made": made_s,
        **{f"kill -9 {name} at": at - began for name, at in killer.killed_at.items()},
        "standby scheduler held the lock after the holder's kill": killer.takeover_s,
        "the killed worker's leased calls committed after its kill": _settled_after(
            killer.leased, killer.killed_wall.get("worker")
        ),
        "drain after the last refund was made": drained_s,
    }
    result.rate = len(made) / made_s
    _judge(result, stage, topology, tool, made, errors, killer, deadline_s)
    return result


def _settled_after(ids: list[int], killed: datetime | None) -> float:
    """Seconds from `killed` until the last of `ids` was COMMITTED (0 when none was held)."""
    if not ids or killed is None:
        return 0.0
    last = AuditEvent.objects.filter(call_id__in=ids, to_state=S.COMMITTED).order_by("-created_at").first()
    return (last.created_at - killed).total_seconds() if last else float("inf")


class _Killer:
    """kill -9 at shares of the refunds made (KILL_AT), on a thread of its own so the runtimes never wait for it."""

    def __init__(self, topology: Topology, tool: Tool, refunds: int, log: Log) -> None:
        self.topology, self.tool, self.refunds, self.log = topology, tool, refunds, log
        self.killed_at: dict[str, float] = {}  # monotonic
        self.killed_wall: dict[str, datetime] = {}
        self.takeover_s = float("inf")
        self.leased: list[int] = []  # calls whose check lease the killed worker held
        self.lease_s = settings.RECOVERY_SCHEDULER_LEASE_S
        self._done = 0
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="nodes-killer", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> _Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.made(self.refunds)
        self._thread.join()

    def made(self, done: int) -> None:
        with self._changed:
            self._done = max(self._done, done)
            self._changed.notify_all()

    def wait(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _until_made(self, share: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._done >= share * self.refunds)

    def _run(self) -> None:
        from django.utils import timezone

        try:
            for name, share in KILL_AT.items():
                self._until_made(share)
                getattr(self, "_kill_" + name.split()[0])()
                self.killed_at[name], self.killed_wall[name] = time.monotonic(), timezone.now()
                self.log(f"  kill -9 {name} ({self._done:,} refunds made)")
            self._await_takeover()
        except BaseException as exc:
            self.error = exc
        finally:
            connection.close()  # this thread's own

    def _kill_web(self) -> None:
        self.topology.kill_web(self.topology.webs[0])

    def _kill_worker(self) -> None:
        """The worker whose work horse holds the most check leases right now (waiting up to 10 s for one)."""
        workers = self.topology.workers
        deadline = time.monotonic() + 10
        while True:
            leases = defaultdict(list)
            for pk, owner in (
                Call.objects.filter(tool_id=self.tool.pk, state__in=sorted(RECONCILABLE))
                .exclude(check_lease_owner="")
                .values_list("pk", "check_lease_owner")
            ):
                with suppress(IndexError, ValueError):
                    leases[int(owner.split(":")[1])].append(pk)
            held = {pid: pks for pid, pks in leases.items() if workers.holding(pid) is not None}
            if held or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if held:
            horse = max(held, key=lambda pid: len(held[pid]))
            self.leased = held[horse]
            workers.kill(workers.holding(horse), horse)
        else:
            workers.kill(workers.processes[0])

    def _kill_scheduler(self) -> None:
        holder = self.topology.holder()
        pid = int(holder.split(":")[1]) if holder else None
        candidates = self.topology.schedulers
        victim = next((p for p in candidates.processes if p.pid == pid and p.poll() is None), None)
        if victim is None:
            raise RuntimeError(f"no scheduler candidate of ours holds the lock (holder: {holder})")
        self._old_holder = holder
        candidates.kill(victim)

    def _await_takeover(self) -> None:
        killed = self.killed_at["scheduler holder"]
        while time.monotonic() - killed < 3 * self.lease_s:
            holder = self.topology.holder()
            if holder and holder != self._old_holder:
                self.takeover_s = time.monotonic() - killed
                return
            time.sleep(0.05)


def _judge(
    result: NodesResult,
    stage: Stage,
    topology: Topology,
    tool: Tool,
    made: list[tuple[str, CallResult]],
    errors: list[str],
    killer: _Killer,
    deadline_s: float,
) -> None:
    keys = [key for key, _ in made]
    _check_committed(result, [call.call_id for _, call in made], deadline_s)
    effects = stage.sandbox.ledger()["by_key"]
    wrong = {key: effects.get(key, 0) for key in keys if effects.get(key, 0) != 1}
    result.check("one effect per key", not wrong, f"{len(keys) - len(wrong):,} keys with 1 effect" + (
        f"; otherwise: {_some(f'{k}: {n}' for k, n in wrong.items())}" if wrong else ""
    ))  # fmt: skip
    _check_checked_once(result, stage, tool, keys, effects, killer)
    _check_attempts_stored(result, made)
    result.check(
        "every runtime got past the kills",
        not errors,
        "no runtime error" if not errors else f"{len(errors)} errors: {_some(errors)}",
    )
    # The holder renews its lease every tick, a standby asks for the lock every tick: the lock is free at most one
    # lease after the holder's last renewal, and taken at the standby's next tick.
    bound = killer.lease_s + Scheduler.TICK_S
    result.check(
        "the standby scheduler held the lock within its lease",
        killer.takeover_s <= bound,
        f"after {killer.takeover_s:.1f} s (lease {killer.lease_s} s, candidates ask every {Scheduler.TICK_S} s)",
    )
    access = topology.nginx.workdir / "access.log"
    lines = access.read_text(errors="replace").splitlines() if access.exists() else []
    result.counts["calls the killed worker was checking"] = len(killer.leased)
    result.counts["requests through nginx"] = len(lines)
    result.counts["of which 502 (in flight at the killed web process; sent again)"] = sum(
        1 for line in lines if '" 502 ' in line
    )


def _check_committed(result: NodesResult, ids: list[int], deadline_s: float) -> None:
    """Every refund COMMITTED, each before its deadline (send → COMMITTED from the audit trail)."""
    states: dict[int, str] = {}
    sent: dict[int, datetime] = {}
    committed: dict[int, datetime] = {}
    for chunk in chunks(ids):
        for pk, state, sent_at in Call.objects.filter(pk__in=chunk).values_list("pk", "state", "sent_at"):
            states[pk], sent[pk] = state, sent_at
        committed.update(
            AuditEvent.objects.filter(call_id__in=chunk, to_state=S.COMMITTED).values_list("call_id", "created_at")
        )
    waits = sorted((committed[i] - sent[i]).total_seconds() for i in ids if i in committed and sent.get(i))
    not_committed = [i for i in ids if states.get(i) != S.COMMITTED]
    result.check(
        "every refund COMMITTED before its deadline",
        len(ids) == result.refunds and not not_committed and (waits[-1] if waits else 0) <= deadline_s,
        f"{len(ids) - len(not_committed):,} of {result.refunds:,} COMMITTED"
        + (f" (not: {_some(f'{i} {states.get(i)}' for i in not_committed)})" if not_committed else "")
        + (f"; send → COMMITTED median {statistics.median(waits):.1f} s, slowest {waits[-1]:.1f} s" if waits else "")
        + f" (deadline {deadline_s:.0f} s)",
    )
    if waits:
        result.times["send → COMMITTED, median"] = statistics.median(waits)
        result.times["send → COMMITTED, slowest"] = waits[-1]


def _check_checked_once(
    result: NodesResult, stage: Stage, tool: Tool, keys: list[str], effects: dict[str, int], killer: _Killer
) -> None:
    """No call checked twice at once: no two status queries of a key within the provider's read timeout."""
    timeout_s = float(tool.provider.read_timeout_s)
    queries: dict[str, list[datetime]] = defaultdict(list)
    for entry in stage.sandbox.requests(path_prefix="/refunds/by-key/"):
        if entry.get("key") in effects:
            queries[entry["key"]].append(datetime.fromisoformat(entry["at"]))
    at_once = []
    for key, times in queries.items():
        times.sort()
        at_once += [key for a, b in itertools.pairwise(times) if (b - a).total_seconds() < timeout_s]
    again = sum(1 for key in keys if len(queries.get(key, [])) > 1)
    result.check(
        "no call checked twice at once",
        not at_once,
        f"{sum(map(len, queries.values())):,} status queries for {len(keys):,} keys; {again} key(s) checked again "
        f"after an earlier check (the killed worker's leased calls: {len(killer.leased)}); none within "
        f"{timeout_s:.0f} s (the provider's read timeout) of another for its key"
        + (f" — but: {_some(at_once)}" if at_once else ""),
    )


def _check_attempts_stored(result: NodesResult, made: list[tuple[str, CallResult]]) -> None:
    """Every attempt report the API answered is stored."""
    acknowledged = [(call.call_id, a.attempt_id) for _, call in made for a in call.attempts if a.call_state]
    stored = set()
    for chunk in chunks([call.call_id for _, call in made]):
        stored.update(Attempt.objects.filter(call_id__in=chunk).values_list("call_id", "attempt_id"))
    lost = [pair for pair in acknowledged if pair not in stored]
    result.check(
        "no acknowledged attempt lost",
        acknowledged and not lost,
        f"{len(acknowledged) - len(lost):,} of {len(acknowledged):,} attempts the API answered are stored"
        + (f"; lost: {_some(map(str, lost))}" if lost else ""),
    )


def _some(items, n: int = 5) -> str:
    items = list(items)
    return ", ".join(items[:n]) + (f" … ({len(items)} in all)" if len(items) > n else "")

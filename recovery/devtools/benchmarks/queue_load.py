"""The `queue` and `metrics` benchmarks' data: a million calls (`CALLS`) with their tasks, steps and attempts,
loaded with COPY in one transaction as fast as PostgreSQL takes them. What is loaded and how: docs/benchmarks.md
("The queue benchmark").
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
import secrets
import shutil
import time
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.db.models import Model

from recovery.audit.chain import Actor
from recovery.models import Attempt, Call, Step, Task, Tenant, Tool
from recovery.registry import load_registry
from recovery.services.users import user_save_with_roles

CALLS = 1_000_000
UNKNOWN_PER_CALLS = 100  # one call in a hundred is UNKNOWN: 10,000 of 1,000,000
ATTEMPTS_PER_CALL = 3
CALLS_PER_TASK, CALLS_PER_STEP = 4, 2
PROVIDERS, TOOLS, TENANTS, REVIEWERS = 8, 40, 20, 5
DAYS = 90  # tasks spread over this many days before the last hour
PREFIX = "bq"
VIEWER, ADMIN = f"{PREFIX}-viewer", f"{PREFIX}-admin"
UNKNOWN = "UNKNOWN"
# The calls not in UNKNOWN: state and cumulative share.
STATE_MIX = (
    ("COMMITTED", 0.88),
    ("FAILED_PERMANENT", 0.93),
    ("HUMAN_REVIEW", 0.945),
    ("NOT_COMMITTED", 0.96),
    ("READY", 0.97),
    ("RETRYABLE", 0.98),
    ("SENT", 0.985),
    ("ACCEPTED", 0.99),
    ("COMPENSATED", 1.0),
)
STATES = (UNKNOWN, *(state for state, _ in STATE_MIX))
_CUMULATIVE = [share for _, share in STATE_MIX]
QUEUED = {UNKNOWN, "HUMAN_REVIEW"}  # a reviewer's queue holds the call (the overview and the queue sizes count them)
_OPEN = {UNKNOWN, "HUMAN_REVIEW", "READY", "RETRYABLE", "SENT", "ACCEPTED"}  # the task is still open
_DONE = {"COMMITTED", "ACCEPTED", "COMPENSATED"}  # the call has a provider reference
N = r"\N"  # NULL in COPY's text format
# Disk a loaded call takes with its share of tasks, steps and attempts, indexes included (3,830 bytes measured at
# 200,000 calls on PostgreSQL 15: `database_bytes_added` in the result), what any load takes whatever its size (the
# tables' and indexes' first pages, the registry), and the margin `disk_check` keeps free above the estimate for WAL.
BYTES_PER_CALL = 4_000
FIXED_BYTES = 16 * 2**20
DISK_MARGIN = 1.5


# --- load ----------------------------------------------------------------------------------------------------------


def _registry() -> dict:
    tools = []
    for n in range(TOOLS):
        write = n % 4 != 0
        tool = {
            "name": f"{PREFIX}.tool-{n:02d}",
            "provider": f"{PREFIX}-provider-{n % PROVIDERS}",
            "side_effect": "write" if write else "read",
            "risk": "high" if write and n % 3 == 0 else "low",
            "request": {"method": "POST" if write else "GET", "path": f"/v1/op-{n}"},
            "args_schema": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer", "minimum": 1}},
                "required": ["order_id"],
            },
            "budgets": {"max_attempts": 5},
        }
        if write:
            tool |= {
                "provider_ref_field": "id",
                "status_query": {
                    "method": "GET",
                    "path": f"/v1/op-{n}/by-key/{{idempotency_key}}",
                    "status_map": {"succeeded": "committed", "not_found": "not_committed", "pending": "pending"},
                },
                "reconcile": {"first_check_s": 5, "backoff": 2, "max_checks": 6, "deadline_s": 86400},
            }
        tools.append(tool)
    return {
        "providers": [
            {"name": f"{PREFIX}-provider-{n}", "base_url": f"https://provider-{n}.example.com"}
            for n in range(PROVIDERS)
        ],
        "tools": tools,
        "tenants": [{"name": f"{PREFIX}-tenant-{n:02d}", "tools": "*"} for n in range(TENANTS)],
    }


def _users() -> list[int]:
    """The viewer and the admin the pages are measured as, and the reviewers who hold claims: their ids."""
    actor = Actor.system("bench")
    user_save_with_roles(username=VIEWER, roles=["viewer"], password=secrets.token_urlsafe(18), actor=actor)
    user_save_with_roles(username=ADMIN, roles=["admin"], password=secrets.token_urlsafe(18), actor=actor)
    reviewers = []
    for n in range(REVIEWERS):
        user, _ = user_save_with_roles(
            username=f"{PREFIX}-reviewer-{n}", roles=["reviewer"], password=secrets.token_urlsafe(18), actor=actor
        )
        reviewers.append(user.pk)
    return reviewers


def _ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(" ")


def _next_id(cursor, table: str) -> int:
    cursor.execute(f"SELECT COALESCE(MAX(id), 0) + 1 FROM {table}")
    return cursor.fetchone()[0]


@contextmanager
def _foreign_keys_dropped(cursor, tables: Iterable[str]) -> Iterator[None]:
    """Drop the tables' own foreign keys, and add them back (checked in one pass each) when the block ends."""
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # nothing deferred may be pending on a table we alter
    cursor.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE contype = 'f' AND conrelid = ANY(%s::regclass[]) ORDER BY 1, 2",
        [list(tables)],
    )
    keys = cursor.fetchall()
    q = connection.ops.quote_name
    for table, name, _ in keys:
        cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT {q(name)}")
    yield
    for table, name, definition in keys:
        cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {q(name)} {definition}")
    cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def _copy(cursor, table: str, columns: tuple[str, ...], lines: Iterable[str]) -> int:
    """COPY the lines (text format, tab-separated, each ending in a newline) into the table: the rows written.
    PostgreSQL refuses a line with more or fewer fields than columns."""
    q = connection.ops.quote_name
    rows, buffer = 0, []
    with cursor.copy(f"COPY {table} ({', '.join(q(c) for c in columns)}) FROM STDIN") as copy:
        for line in lines:
            buffer.append(line)
            rows += 1
            if len(buffer) == 4096:
                copy.write("".join(buffer))
                buffer.clear()
        if buffer:
            copy.write("".join(buffer))
    return rows


class _Layout:
    """What every call is (state, tool, attempts) and every task (tenant, time), drawn before anything is written:
    a task's status depends on its calls, a call's attempt count on the exact total."""

    def __init__(
        self, calls: int, unknown: int, tools: list[Tool], tenant_ids: list[int], rng: random.Random, queued: bool
    ):
        self.calls, self.tasks = calls, -(-calls // CALLS_PER_TASK)
        self.state = bytearray(calls)  # index into STATES
        self.tool = bytearray(calls)  # index into tools
        self.attempts = bytearray(calls)
        write_tools = [n for n, tool in enumerate(tools) if tool.side_effect == "write"]
        unknown_at = set(rng.sample(range(calls), unknown))
        ready, committed = STATES.index("READY"), STATES.index("COMMITTED")
        for i in range(calls):
            if i in unknown_at:
                self.tool[i] = rng.choice(write_tools)
            else:
                self.state[i] = 1 + bisect.bisect_left(_CUMULATIVE, rng.random())
                if not queued and STATES[self.state[i]] in QUEUED:
                    self.state[i] = committed  # the same draws, so the rest of the mix is the queued load's
                self.tool[i] = rng.randrange(len(tools))
            self.attempts[i] = 0 if self.state[i] == ready else 1 + rng.randrange(5)
        # Exactly ATTEMPTS_PER_CALL per call in all: COMMITTED calls take up the difference.
        missing = ATTEMPTS_PER_CALL * calls - sum(self.attempts)
        step = 1 if missing > 0 else -1
        for i in range(calls):
            if not missing:
                break
            if self.state[i] == committed and 1 <= self.attempts[i] + step <= 5:
                self.attempts[i] += step
                missing -= step
        weights = [1 / (n + 1) ** 0.5 for n in range(len(tenant_ids))]
        self.tenant = bytearray(rng.choices(range(len(tenant_ids)), weights=weights, k=self.tasks))
        now = time.time()
        start, spacing = now - 3600 - DAYS * 86400, DAYS * 86400 / self.tasks
        self.task_at = array("d", (start + k * spacing + rng.uniform(0, spacing) for k in range(self.tasks)))


SUBMITTED_S = 300  # a task whose calls all ended is submitted this long after it was created


def _task_outcome(layout: _Layout, k: int) -> str:
    """Task k's outcome: "" while one of its calls is still open, else "failed" or "completed"."""
    states = [STATES[s] for s in layout.state[k * CALLS_PER_TASK : (k + 1) * CALLS_PER_TASK]]
    if any(state in _OPEN for state in states):
        return ""
    return "failed" if "FAILED_PERMANENT" in states else "completed"


def _task_lines(layout: _Layout, first_id: int, tenant_ids: list[int], rng: random.Random) -> Iterator[str]:
    goals = ("refund the duplicate charge", "move the order to express", "close the account", "issue a credit note")
    budget = json.dumps({"max_rounds": 12, "token_budget": 200000, "deadline_s": 3600})
    for k in range(layout.tasks):
        task_id, at = first_id + k, layout.task_at[k]
        created, deadline, rounds = _ts(at), _ts(at + 3600), 1 + rng.randrange(8)
        if not (outcome := _task_outcome(layout, k)):
            status, submission, updated, closed = "open", N, _ts(at + 60), N
        else:
            status, submission, updated = "submitted", '{"summary": "done", "artifacts": []}', _ts(at + SUBMITTED_S)
            closed = updated
        yield (
            f"{task_id}\t{tenant_ids[layout.tenant[k]]}\trun-{task_id}\tagent-{k % 12}\t{goals[k % 4]}\t{status}\t"
            f"{outcome}\tf\t{budget}\t12\t{deadline}\t200000\t{rounds}\t{rounds * 1800}\t0\t{submission}\t{N}\t"
            f"{created}\t{updated}\t{closed}\t\t\t{N}\n"  # no saga: "", "", NULL
        )


TASK_COLUMNS = (
    "id", "tenant_id", "external_id", "agent", "goal", "status", "outcome", "no_submission", "budget", "max_rounds",
    "deadline", "token_budget", "rounds_used", "tokens_used", "write_retries_used", "submission",
    "created_by_token_id", "created_at", "updated_at", "closed_at", "saga", "saga_executor", "saga_requested_at",
)  # fmt: skip


def _step_lines(layout: _Layout, first_id: int, first_task: int) -> Iterator[str]:
    per_task = CALLS_PER_TASK // CALLS_PER_STEP
    for k in range(layout.tasks):
        created = _ts(layout.task_at[k] + 1)
        for s in range(per_task):
            yield f"{first_id + k * per_task + s}\t{first_task + k}\t{s + 1}\tstep-{s + 1}\t{{}}\t{created}\n"


STEP_COLUMNS = ("id", "task_id", "index", "name", "compensation", "created_at")


class _Calls:
    """Each call's row, and what its attempts need (id, tool, arguments, first send), as the rows are written."""

    def __init__(
        self, layout: _Layout, ids: dict[str, int], tools: list[Tool], tenant_ids: list[int], reviewers: list[int]
    ):
        self.layout, self.ids, self.tools, self.tenant_ids, self.reviewers = layout, ids, tools, tenant_ids, reviewers
        self.sent_at = array("d", bytes(8 * layout.calls))
        self.arguments: list[str] = [""] * layout.calls
        self.fingerprint: list[str] = [""] * layout.calls
        # What the audit history needs (audit_load): each call's last state change, version and status checks.
        self.changed = array("d", bytes(8 * layout.calls))
        self.version, self.checks = bytearray(layout.calls), bytearray(layout.calls)
        self.receipts: dict[int, str] = {}  # the last receipt's status, for the calls that have one
        self.outcomes: dict[int, str] = {}  # the call's outcome, for the calls that have one
        self.now = time.time()

    def lines(self, rng: random.Random) -> Iterator[str]:
        layout, ids = self.layout, self.ids
        per_step = CALLS_PER_STEP
        for i in range(layout.calls):
            k, j = divmod(i, CALLS_PER_TASK)
            call_id, task_id, step_id = ids["call"] + i, ids["task"] + k, ids["step"] + i // per_step
            tool, state, attempts = self.tools[layout.tool[i]], STATES[layout.state[i]], layout.attempts[i]
            created = layout.task_at[k] + 2 + 15 * j
            arguments = f'{{"order_id": "O-{task_id}", "amount_cents": {100 + (call_id * 37) % 90000}}}'
            fingerprint = hashlib.sha256(f"{tool.name}:{arguments}".encode()).hexdigest()
            self.arguments[i], self.fingerprint[i] = arguments, fingerprint
            sent = created + 0.05 if attempts else 0.0
            self.sent_at[i] = sent
            row = self._row(state, call_id, attempts, created, sent, rng)
            self.changed[i], self.version[i], self.checks[i] = row.changed, row.version, row.checks
            if row.receipt_status:
                self.receipts[i] = row.receipt_status
            if row.outcome:
                self.outcomes[i] = row.outcome
            updated = _ts(row.changed)
            yield (
                f"{call_id}\t{self.tenant_ids[layout.tenant[k]]}\t{task_id}\t{step_id}\t{tool.pk}\t"
                f"run-{task_id}:{j // per_step + 1}:{j % per_step}\t{arguments}\t{fingerprint}\t{tool.side_effect}\t"
                f"{tool.risk}\t{state}\t{row.version}\t{updated}\t{row.outcome}\t5\t{attempts}\t"
                f"{_ts(sent) if attempts else N}\t30\t{row.provider_ref}\t{row.checks}\t{row.receipt_at}\t"
                f"{row.receipt_status}\t{row.next_check}\t\t{N}\t{row.claimed_by}\t{row.claim_until}\t{row.effects}\t"
                f"f\t{_ts(created)}\t{updated}\tf\n"
            )

    def _row(self, state: str, call_id: int, attempts: int, created: float, sent: float, rng: random.Random) -> _Row:
        """The columns a call's state decides, drawn from `rng` (in the same order for every load of a seed)."""
        last_sent = sent + 4 * (attempts - 1) if attempts else created
        row = _Row(changed=last_sent + rng.uniform(0.1, 3), version=2 * attempts)
        if state == UNKNOWN:
            self._unknown(row, last_sent, rng)
        else:
            _settled(row, state, attempts, created, last_sent)
        if state in _DONE:
            row.provider_ref = f"pr_{call_id:x}"
            if state == "COMMITTED" and call_id % 20 == 0:  # settled by a status check
                row.version, row.checks, row.receipt_status, row.effects = 2 * attempts + 1, 1, "committed", 1
                row.receipt_at = _ts(row.changed)
        return row

    def _unknown(self, row: _Row, last_sent: float, rng: random.Random) -> None:
        """An UNKNOWN call: no outcome within the tool's outcome timeout; some status checks, its next one due, one
        in ten claimed by a reviewer (half of those claims expired)."""
        now = self.now
        row.changed = last_sent + 30
        row.checks = rng.randrange(7)
        if row.checks:
            row.receipt_at = _ts(min(row.changed + 5 * 2**row.checks, now - 1))
            row.receipt_status = rng.choice(("failed", "ambiguous", "pending", "unreachable"))
        row.next_check = _ts(now + rng.uniform(5, 900))
        if rng.random() < 0.1:
            row.claimed_by = rng.choice(self.reviewers)
            row.claim_until = _ts(now + rng.uniform(60, 900) if rng.random() < 0.5 else now - 3600)


@dataclass(slots=True)
class _Row:
    """The columns of a call's row that its state decides (N: NULL)."""

    changed: float
    version: int
    outcome: str = ""
    provider_ref: str = ""
    checks: int = 0
    receipt_at: str = N
    receipt_status: str = ""
    next_check: str = N
    claimed_by: int | str = N
    claim_until: str = N
    effects: int | str = N


def _settled(row: _Row, state: str, attempts: int, created: float, last_sent: float) -> None:
    """The columns of a call in a state other than UNKNOWN."""
    if state == "READY":
        row.changed, row.version = created, 0
    elif state == "SENT":
        row.changed, row.version = last_sent, 2 * attempts - 1
    elif state == "NOT_COMMITTED":
        row.version, row.checks, row.receipt_status = 2 * attempts + 1, 1, "not_committed"
        row.receipt_at = _ts(row.changed)
    elif state == "FAILED_PERMANENT":
        row.outcome = "retry_exhausted" if attempts == 5 else ""
    elif state == "HUMAN_REVIEW":
        row.outcome = "human_review_required"
    elif state == "COMPENSATED":
        row.version = 2 * attempts + 2


CALL_COLUMNS = (
    "id", "tenant_id", "task_id", "step_id", "tool_id", "idempotency_key", "arguments", "fingerprint",
    "side_effect", "risk", "state", "version", "state_changed_at", "outcome", "max_attempts", "attempts_count",
    "sent_at", "outcome_timeout_s", "provider_ref", "checks_made", "last_receipt_at", "last_receipt_status",
    "next_check_at", "check_lease_owner", "check_lease_until", "claimed_by_id", "claim_until", "effects_observed",
    "duplicate_effect", "created_at", "updated_at", "observed",
)  # fmt: skip

# The outcome part of an attempt row (connection_opened .. failure_class), per kind of outcome.
_OUTCOMES = {
    "committed": ("t", "t", "200", "", "", "1", N, "committed", ""),
    "accepted": ("t", "t", "202", "", "", "1", N, "accepted", ""),
    "transient": ("t", "t", "503", "http_5xx", "unavailable", "", "2000", "retryable", "transient"),
    "timeout": ("t", "t", N, "read_timeout", "", "", N, "unknown", "outcome_unknown"),
    "rejected": ("t", "t", "422", "", "invalid_amount", "", N, "failed", "invalid_arguments"),
    "forbidden": ("t", "t", "403", "", "forbidden", "", N, "review", "authorization"),
}
_LAST = {  # the kind of a call's last attempt by the call's state; earlier attempts failed transiently
    "COMMITTED": "committed",
    "COMPENSATED": "committed",
    "ACCEPTED": "accepted",
    UNKNOWN: "timeout",
    "NOT_COMMITTED": "timeout",
    "RETRYABLE": "transient",
    "FAILED_PERMANENT": "rejected",
    "HUMAN_REVIEW": "forbidden",
}


def _attempt_lines(calls: _Calls, first_id: int) -> Iterator[str]:
    layout, ids = calls.layout, calls.ids
    rows = {}
    for kind, (opened, sent, status, error, code, ref, retry, state, failure_class) in _OUTCOMES.items():
        facts = json.dumps(
            {"connection_opened": True, "sent": True, "http_status": None if status == N else int(status)}
        )
        failure = (
            N
            if not failure_class
            else json.dumps({"failure_class": failure_class, "phase": "response", "retryable": kind == "transient"})
        )
        rows[kind] = (opened, sent, status, error, code, ref, retry, facts, failure, failure_class, state)
    attempt_id = first_id
    for i in range(layout.calls):
        call_id, tool = ids["call"] + i, calls.tools[layout.tool[i]]
        state, count = STATES[layout.state[i]], layout.attempts[i]
        arguments, fingerprint = calls.arguments[i], calls.fingerprint[i]
        for number in range(1, count + 1):
            started = calls.sent_at[i] + 4 * (number - 1)
            at, external = _ts(started), f"att-{call_id}-{number}"
            digest = hashlib.sha256(external.encode()).hexdigest()
            evidence = "[]" if number == 1 else '["time_elapsed"]'
            admitted = f'{{"attempt_id": "{external}", "admitted": true, "call_state": "SENT"}}'
            head = (
                f"{attempt_id}\t{call_id}\t{external}\t{number}\t{tool.pk}\t{arguments}\t{fingerprint}\t1\t{evidence}\t"
                f"f\tf\t{at}\t"
            )
            if state == "SENT" and number == count:  # in flight: admitted, no outcome yet
                line = (
                    f"{head}{N}\t{N}\t{N}\t{N}\t{N}\t\t\t\t{N}\t{N}\t{at}\t{N}\t{N}\t\t{digest}\t{admitted}\t\t{N}\t"
                    f"{at}\n"
                )
            else:
                kind = _LAST[state] if number == count else "transient"
                opened, sent, status, error, code, ref, retry, facts, failure, failure_class, result = rows[kind]
                done = _ts(started + 0.4)
                ref = f"req_{call_id:x}_{number}" if ref else ""
                answer = f'{{"attempt_id": "{external}", "call_state": "{result}"}}'
                line = (
                    f"{head}{done}\t{facts}\t{opened}\t{sent}\t{status}\t{error}\t{code}\t{ref}\t{retry}\t"
                    f"{120 + number}\t{at}\t{done}\t{failure}\t{failure_class}\t{digest}\t{admitted}\t"
                    f"{digest[32:]}{digest[:32]}\t{answer}\t{at}\n"
                )
            yield line
            attempt_id += 1


ATTEMPT_COLUMNS = (
    "id", "call_id", "attempt_id", "number", "tool_id", "arguments", "fingerprint", "credential_version",
    "evidence", "policy_bypassed", "breaker_probe", "admitted_at", "reported_at", "facts", "connection_opened",
    "sent", "http_status", "error_kind", "error_code", "provider_request_id", "retry_after_ms", "tokens_used",
    "started_at", "finished_at", "failure", "failure_class", "request_hash", "response", "outcome_request_hash",
    "outcome_response", "created_at",
)  # fmt: skip

_LOADED = (Task, Step, Call, Attempt)


class Extra(Protocol):
    """More rows a load COPYs in its transaction, after the calls' (recovery.devtools.benchmarks.audit_load's
    history)."""

    models: tuple[type[Model], ...]  # their tables: ids taken, foreign keys dropped and checked, sequences set

    def prepare(self) -> None: ...  # before the transaction (rows it names: a token)

    def copy(self, cursor, calls: _Calls, ids: dict[str, int]) -> dict[str, int]: ...


def load(
    calls: int = CALLS,
    *,
    unknown: int | None = None,
    seed: int = 19,
    extra: Extra | None = None,
    queued: bool = True,
) -> dict:
    """Load the registry, users and `calls` calls (docs/benchmarks.md), PostgreSQL only: what was loaded and how long it
    took. Loading again adds as many calls more, after the ones there. `extra`: more rows (audit_load.AUDIT_HISTORY).
    `queued` False: no call left in a reviewer's queue (`unknown` must be 0; the calls a queued draw would have left
    there made COMMITTED instead): history that grows while the backlog stays what it was."""
    unknown = calls // UNKNOWN_PER_CALLS if unknown is None else unknown
    if unknown and not queued:
        raise ValueError("calls left in UNKNOWN are queued: unknown must be 0 when queued is False")
    if not 0 <= unknown <= calls:
        raise ValueError(f"unknown must be between 0 and calls ({calls}), not {unknown}")
    disk = disk_check(calls, extra)
    started = time.perf_counter()
    size_before = _database_bytes()
    rng = random.Random(seed)
    load_registry(_registry(), actor=Actor.system("bench"))
    reviewers = _users()
    tools = list(Tool.objects.filter(name__startswith=f"{PREFIX}.").order_by("name"))
    tenant_ids = list(
        Tenant.objects.filter(name__startswith=f"{PREFIX}-").order_by("name").values_list("pk", flat=True)
    )
    if extra is not None:
        extra.prepare()
    layout = _Layout(calls, unknown, tools, tenant_ids, rng, queued)
    loaded = (*_LOADED, *extra.models) if extra is not None else _LOADED
    tables = [model._meta.db_table for model in loaded]
    with transaction.atomic(), connection.cursor() as wrapper:
        cursor = wrapper.cursor  # psycopg's own cursor, for COPY
        ids = {model._meta.model_name: _next_id(cursor, model._meta.db_table) for model in loaded}
        call_rows = _Calls(layout, ids, tools, tenant_ids, reviewers)
        rows = _copy_rows(cursor, tables, call_rows, rng, extra)
    copied = time.perf_counter()
    _analyze([*tables, Tenant._meta.db_table, Tool._meta.db_table, get_user_model()._meta.db_table])
    return {
        **rows,
        "unknown": unknown,
        "queued": queued,
        "tenants": len(tenant_ids),
        "tools": len(tools),
        "load_s": round(time.perf_counter() - started, 1),
        "copy_s": round(copied - started, 1),
        **disk,
        "database_bytes_added": _database_bytes() - size_before,
    }


def _copy_rows(cursor, tables: list[str], calls: _Calls, rng: random.Random, extra: Extra | None) -> dict[str, int]:
    """COPY the tasks, steps, calls, attempts and `extra`'s rows with the tables' foreign keys dropped and added back,
    then move the tables' id sequences past them: the rows written per table."""
    layout, ids, tenant_ids = calls.layout, calls.ids, calls.tenant_ids
    rows = {}
    with _foreign_keys_dropped(cursor, tables):
        rows["tasks"] = _copy(cursor, tables[0], TASK_COLUMNS, _task_lines(layout, ids["task"], tenant_ids, rng))
        rows["steps"] = _copy(cursor, tables[1], STEP_COLUMNS, _step_lines(layout, ids["step"], ids["task"]))
        rows["calls"] = _copy(cursor, tables[2], CALL_COLUMNS, calls.lines(rng))
        rows["attempts"] = _copy(cursor, tables[3], ATTEMPT_COLUMNS, _attempt_lines(calls, ids["attempt"]))
        if extra is not None:
            rows.update(extra.copy(cursor, calls, ids))
    for table in tables:  # raw: the ORM cannot move a sequence past ids that COPY wrote
        cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT MAX(id) FROM {table}))")
    return rows


def _analyze(tables: list[str]) -> None:
    """Statistics for the loaded tables; outside a transaction also the visibility map and a checkpoint."""
    with connection.cursor() as cursor:
        # VACUUM sets the visibility map (index-only scans) and hint bits, as autovacuum would on a live database;
        # it cannot run inside a transaction (the test's), where ANALYZE alone does.
        vacuum = "ANALYZE" if connection.in_atomic_block else "VACUUM (ANALYZE)"
        cursor.execute(f"{vacuum} {', '.join(tables)}")
        if not connection.in_atomic_block:
            # Write the loaded gigabytes out now rather than while pages are timed (superuser or pg_checkpoint only;
            # without the right, the background checkpoint does it, and the first figures are noisier).
            with suppress(DatabaseError):
                cursor.execute("CHECKPOINT")


def _database_bytes() -> int:
    with connection.cursor() as cursor:
        # Raw SQL: a server function the ORM has no word for.
        cursor.execute("SELECT pg_database_size(current_database())")
        return cursor.fetchone()[0]


def disk_check(calls: int, extra: Extra | None = None) -> dict:
    """The disk `calls` more calls will take (BYTES_PER_CALL each, plus what `extra` declares as its own
    `bytes_per_call`), checked against the free space of the server's data directory when this machine can see it
    (a local server, and a role allowed to read `data_directory`): a load that would fill the disk is refused before
    it writes anything, with both numbers. Returns the estimate and the free space found (None: not visible here)."""
    per_call = BYTES_PER_CALL + getattr(extra, "bytes_per_call", 0)
    estimate = FIXED_BYTES + calls * per_call
    free = None
    with connection.cursor() as cursor, suppress(DatabaseError), transaction.atomic():
        cursor.execute("SELECT current_setting('data_directory')")  # a server setting: no ORM equivalent
        directory = cursor.fetchone()[0]
        host = connection.settings_dict.get("HOST") or ""
        if host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/"):
            with suppress(OSError):
                free = shutil.disk_usage(directory).free
    if free is not None and estimate * DISK_MARGIN > free:
        raise ValueError(
            f"loading {calls:,} calls needs about {estimate / 1e9:.1f} GB ({per_call:,} bytes a call, "
            f"{DISK_MARGIN}x kept free for WAL), and the database's disk has {free / 1e9:.1f} GB free"
        )
    return {"disk_estimate_bytes": estimate, "disk_free_bytes": free}

"""The `ingest` benchmark's baseline: a bare WSGI application, no framework, psycopg over one persistent connection.

`POST /api/v1/calls/{id}/attempts` with a single-shot body (attempt_id + outcome) runs the same statements as the
product's single shot for a fresh call of a read tool that commits, in the same order and the same transactions
(the reads and the breaker count in autocommit, then one transaction for the attempt, the two transitions and the
audit events), then answers JSON. recovery.benchmarks.ingest compares the two lists statement by statement (kind
and table) and refuses a baseline that drifted. It does no validation, classification or decision: the difference
between the two is what the framework and the product's own Python cost.

Served by gunicorn (`recovery.benchmarks.bare_wsgi:application`) with DATABASE_URL and RECOVERY_TOKEN_PEPPER in
the environment; `single_shot()` is also what the raw psycopg series runs in a loop, without HTTP.
Nothing here imports Django. When the product's statements change, change `single_shot()` to match.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from datetime import UTC, datetime

import psycopg
from psycopg.types.json import Jsonb

UNSETTLED = ["STILL_UNKNOWN", "UNKNOWN"]
BUCKET_S, WINDOW_S = 10, 60  # engine.types.BreakerPolicy's defaults, which the benchmark's tools use
_PATH = re.compile(r"^/api/v1/calls/(\d+)/attempts$")


class NotFound(Exception):
    pass


class _Statements:
    """Runs statements on one cursor; with `trace`, appends each statement's SQL to it (for the benchmark's check)."""

    def __init__(self, cursor, trace: list[str] | None):
        self.cursor, self.trace = cursor, trace

    def __call__(self, sql: str, params=()) -> psycopg.Cursor:
        if self.trace is not None:
            self.trace.append(sql)
        return self.cursor.execute(sql, params)


def _hash(value: dict) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def _audit(sql: _Statements, *, task_id: int, call_id: int, token_id: int, src: str, dst: str, now: datetime) -> None:
    """recovery.audit's statements for one event: both heads advanced, the event, both heads pointed at it."""
    chain = f"task:{task_id}"
    advance = "UPDATE recovery_auditchainhead SET length = length + 1 WHERE key = %s RETURNING length, head_hash"
    seq, _ = sql(advance, ["global"]).fetchone()
    chain_seq, prev_hash = sql(advance, [chain]).fetchone()
    fields = {
        "seq": seq,
        "chain": chain,
        "chain_seq": chain_seq,
        "prev_hash": prev_hash,
        "task_id": task_id,
        "call_id": call_id,
        "from_state": src,
        "to_state": dst,
        "created_at": now.isoformat(),
    }
    digest = _hash(fields)
    (event_id,) = sql(
        "INSERT INTO recovery_auditevent (seq, chain, chain_seq, prev_hash, hash, task_id, call_id, actor_kind, "
        "actor_label, actor_token_id, action, from_state, to_state, reason, evidence, created_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, 'token', 'token:bench', %s, 'call.transition', %s, %s, %s, %s, %s) "
        "RETURNING id",
        [seq, chain, chain_seq, prev_hash, digest, task_id, call_id, token_id, src, dst, "bench", Jsonb({}), now],
    ).fetchone()
    sql(
        "UPDATE recovery_auditchainhead SET head_hash = %s, head_event_id = %s, updated_at = %s WHERE key IN (%s, %s)",
        [digest, event_id, now, chain, "global"],
    )


def _transition(sql, call: dict, src: str, dst: str, token_id: int, now: datetime, extra: str = "", params=()) -> dict:
    updated = sql(
        f"UPDATE recovery_call SET state = %s, version = version + 1, state_changed_at = %s, updated_at = %s{extra} "
        "WHERE id = %s AND state = %s AND version = %s",
        [dst, now, now, *params, call["id"], src, call["version"]],
    ).rowcount
    if updated != 1:
        raise RuntimeError(f"call {call['id']} moved under us")
    call["version"] += 1
    # The product appends its audit events at the end of the transaction (recovery.audit.appends_at_commit).
    return {"task_id": call["task_id"], "call_id": call["id"], "token_id": token_id, "src": src, "dst": dst}


ALTERNATES = (
    "SELECT t.name FROM recovery_tool t JOIN recovery_tool_alternates a ON t.id = a.to_tool_id "
    "WHERE a.from_tool_id = %s"
)
TASK_VIEW = (
    "SELECT t.name, t.budgets, COUNT(c.id) AS n FROM recovery_call c JOIN recovery_tool t ON c.tool_id = t.id "
    "WHERE c.state = ANY(%s) AND c.task_id = %s GROUP BY 1, 2"
)
WINDOW = (
    "SELECT SUM({}) FROM recovery_breakerbucket u WHERE u.tool_id = t.id AND u.bucket_start > %s "
    "AND u.bucket_start <= %s"
)


def _authenticate(sql: _Statements, token: str, pepper: str) -> tuple[int, list[int]]:
    """The token and its tenants in one query (a row per tenant)."""
    rows = sql(
        "SELECT k.id, k.digest, k.last_used_at, t.id, t.name FROM recovery_apitoken k "
        "LEFT JOIN recovery_apitoken_tenants a ON k.id = a.apitoken_id "
        "LEFT JOIN recovery_tenant t ON a.tenant_id = t.id "
        "WHERE k.prefix = %s AND k.revoked_at IS NULL ORDER BY t.name",
        [token[:12]],
    ).fetchall()
    digest = hmac.new(pepper.encode(), token.encode(), hashlib.sha256).hexdigest()
    if not rows or not hmac.compare_digest(rows[0][1], digest):
        raise NotFound("token")
    return rows[0][0], [row[3] for row in rows if row[3] is not None]


def _call(sql: _Statements, call_id: int, tenants: list[int]) -> dict:
    found = sql(
        "SELECT c.id, c.task_id, c.step_id, c.tool_id, c.arguments, c.state, c.version, c.attempts_count, "
        "c.idempotency_key, c.fingerprint, k.rounds_used, k.budget, t.name AS tool, t.budgets, t.breaker, "
        "t.required_result_fields, p.name AS provider, n.name AS tenant, s.index "
        "FROM recovery_call c JOIN recovery_task k ON c.task_id = k.id "
        "JOIN recovery_tenant n ON k.tenant_id = n.id "
        "JOIN recovery_step s ON c.step_id = s.id JOIN recovery_tool t ON c.tool_id = t.id "
        "JOIN recovery_provider p ON t.provider_id = p.id WHERE c.id = %s AND c.tenant_id = ANY(%s)",
        [call_id, tenants],
    )
    row = found.fetchone()
    if row is None:
        raise NotFound("call")
    return dict(zip([column.name for column in found.description], row, strict=True))


def _gate_reads(sql: _Statements, call: dict) -> None:
    """gate_context's reads for a call without attempts: its dependencies, the latest receipt, the breaker, the
    task view."""
    sql(
        "SELECT id, state FROM recovery_call WHERE step_id IN (SELECT u0.id FROM recovery_step u0 "
        "JOIN recovery_step_depends_on u1 ON u0.id = u1.to_step_id WHERE u1.from_step_id = %s)",
        [call["step_id"]],
    ).fetchall()
    sql(
        "SELECT observed, checked_at FROM recovery_receipt WHERE call_id = %s ORDER BY checked_at DESC LIMIT 1",
        [call["id"]],
    ).fetchall()
    sql(
        "SELECT state, opened_at, probes_reserved, probe_lease_until FROM recovery_breaker WHERE tool_id = %s "
        "ORDER BY id LIMIT 1",
        [call["tool_id"]],
    ).fetchall()
    sql(TASK_VIEW, [UNSETTLED, call["task_id"]]).fetchall()


def _count_breaker(sql: _Statements, call: dict, now: datetime) -> None:
    """breaker_record on a closed breaker: the bucket upsert, then the state with the window's sums."""
    bucket = int(now.timestamp() // BUCKET_S) * BUCKET_S
    sql(
        "INSERT INTO recovery_breakerbucket (tool_id, bucket_start, successes, failures) VALUES (%s, %s, 1, 0) "
        "ON CONFLICT (tool_id, bucket_start) DO UPDATE SET successes = recovery_breakerbucket.successes "
        "+ excluded.successes, failures = recovery_breakerbucket.failures + excluded.failures "
        "RETURNING successes + failures",
        [call["tool_id"], bucket],
    ).fetchone()
    sql(
        "SELECT b.state, b.opened_at, b.probes_reserved, b.probe_lease_until, "
        f"COALESCE(({WINDOW.format('u.successes + u.failures')}), 0), COALESCE(({WINDOW.format('u.failures')}), 0) "
        "FROM recovery_tool t LEFT JOIN recovery_breaker b ON t.id = b.tool_id WHERE t.id = %s",
        [bucket - WINDOW_S, bucket, bucket - WINDOW_S, bucket, call["tool_id"]],
    ).fetchone()


def single_shot(conn: psycopg.Connection, call_id: int, body: dict, token: str, pepper: str, trace=None) -> dict:
    """One single-shot attempt; returns the JSON answer. NotFound for an unknown token or call.

    Like the product: reads and the breaker count in autocommit (each its own transaction), then the attempt, the
    transitions and the stored answer in one transaction.
    """
    now = datetime.now(UTC)
    conn.autocommit = True
    with conn.cursor() as cursor:
        sql = _Statements(cursor, trace)
        token_id, tenants = _authenticate(sql, token, pepper)
        call = _call(sql, call_id, tenants)
        sql(ALTERNATES, [call["tool_id"]]).fetchall()  # the tool's policy: its alternates
        attempt_id, outcome = body["attempt_id"], body["outcome"]
        stored = sql(
            "SELECT id, request_hash, response FROM recovery_attempt WHERE attempt_id = %s AND call_id = %s "
            "ORDER BY call_id, number LIMIT 1",
            [attempt_id, call_id],
        ).fetchone()
        if stored is not None:
            return stored[2]
        _gate_reads(sql, call)
        number = call["attempts_count"] + 1
        _count_breaker(sql, call, now)
        request_hash = _hash(body)
        print_ = _hash({"tool": call["tool"], "arguments": call["arguments"]})
        with conn.transaction():
            (attempt_pk,) = sql(
                "INSERT INTO recovery_attempt (call_id, attempt_id, number, tool_id, arguments, fingerprint, "
                "evidence, policy_bypassed, breaker_probe, admitted_at, error_kind, error_code, provider_request_id, "
                "failure_class, request_hash, outcome_request_hash, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, false, false, %s, '', '', '', '', %s, '', %s) RETURNING id",
                [
                    call_id,
                    attempt_id,
                    number,
                    call["tool_id"],
                    Jsonb(call["arguments"]),
                    print_,
                    Jsonb([]),
                    now,
                    request_hash,
                    now,
                ],
            ).fetchone()
            sql(
                "INSERT INTO recovery_gatedecision (call_id, attempt_id, candidate_attempt_id, candidate, dry_run, "
                "allowed, reason, evidence_used, checks, required_next, actor_token_id, created_at) "
                "VALUES (%s, %s, %s, %s, false, true, 'first_attempt', '', %s, %s, %s, %s) RETURNING id",
                [
                    call_id,
                    attempt_pk,
                    attempt_id,
                    Jsonb({"tool": call["tool"], "fingerprint": print_}),
                    Jsonb([]),
                    Jsonb({}),
                    token_id,
                    now,
                ],
            )
            sql("UPDATE recovery_task SET rounds_used = rounds_used + 1 WHERE id = %s", [call["task_id"]])
            extra, params = ", attempts_count = %s, sent_at = %s", [number, now]
            events = [_transition(sql, call, call["state"], "SENT", token_id, now, extra, params)]
            failure = {"side_effect": "sent", "row": "9", "phase": "response"}
            sql(
                "UPDATE recovery_attempt SET facts = %s, connection_opened = %s, sent = %s, http_status = %s, "
                "error_kind = '', error_code = '', provider_request_id = '', retry_after_ms = NULL, "
                "tokens_used = NULL, started_at = NULL, finished_at = NULL, reported_at = %s, failure = %s, "
                "failure_class = '', diagnostic_id = NULL WHERE id = %s",
                [
                    Jsonb(outcome),
                    outcome.get("connection_opened"),
                    outcome.get("sent"),
                    outcome.get("http_status"),
                    now,
                    Jsonb(failure),
                    attempt_pk,
                ],
            )
            sql(
                "SELECT id, rounds_used, tokens_used, write_retries_used, budget, max_rounds, deadline, token_budget "
                "FROM recovery_task WHERE id = %s",
                [call["task_id"]],
            ).fetchone()
            sql(TASK_VIEW, [UNSETTLED, call["task_id"]]).fetchall()
            events.append(_transition(sql, call, "SENT", "COMMITTED", token_id, now))
            response = {
                "call_id": call_id,
                "attempt_id": attempt_id,
                "attempt_number": number,
                "call_state": "COMMITTED",
                "policy_bypassed": False,
                "failure": None,
                "decision": None,
                "breaker_state": "closed",
                "provider_ref": "",
            }
            sql(
                "UPDATE recovery_attempt SET response = %s, outcome_request_hash = %s, outcome_response = %s "
                "WHERE id = %s",
                [Jsonb(response), _hash(outcome), Jsonb(response), attempt_pk],
            )
            for event in events:
                _audit(sql, now=now, **event)
    return response


_connection: psycopg.Connection | None = None


def _conn() -> psycopg.Connection:
    """This worker's persistent connection, opened on first use and again after it broke."""
    global _connection
    if _connection is None or _connection.closed or _connection.broken:
        _connection = psycopg.connect(os.environ["DATABASE_URL"])
    return _connection


def _answer(start_response, status: str, body: dict) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def application(environ, start_response):
    match = _PATH.match(environ.get("PATH_INFO", ""))
    if environ["REQUEST_METHOD"] != "POST" or match is None:
        return _answer(start_response, "404 Not Found", {"error": {"code": "not_found"}})
    auth = environ.get("HTTP_AUTHORIZATION", "")
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = json.loads(environ["wsgi.input"].read(length))
    try:
        answer = single_shot(
            _conn(), int(match.group(1)), body, auth.removeprefix("Bearer "), os.environ["RECOVERY_TOKEN_PEPPER"]
        )
    except NotFound:
        return _answer(start_response, "404 Not Found", {"error": {"code": "not_found"}})
    return _answer(start_response, "201 Created", answer)

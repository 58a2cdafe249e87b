"""The `ingest` benchmark's baseline: a bare WSGI application (no framework, nothing of Django) that runs the
product's single-shot statements with psycopg over one persistent connection (docs/benchmarks.md, "The ingest
benchmark"). Served by gunicorn (`recovery.devtools.benchmarks.bare_wsgi:application`) with DATABASE_URL and
RECOVERY_TOKEN_PEPPER set. When the product's statements change, change `single_shot()` to match.
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


def _audit(sql: _Statements, events: list[dict], now: datetime) -> None:
    """recovery.audit.chain's statements for one transaction's events (all of one task's chain): both heads locked in
    one statement, the global one first, with the events' ids taken, every event in one INSERT, both heads moved in
    one UPDATE."""
    chain = f"task:{events[0]['task_id']}"
    heads = sql(
        "SELECT key, length, head_hash, head_event_id, (SELECT array_agg(nextval(pg_get_serial_sequence("
        f"'recovery_auditevent', 'id'))) FROM generate_series(1, {len(events)})) FROM recovery_auditchainhead "
        "WHERE key IN (%s, %s) ORDER BY key <> %s, key FOR UPDATE",
        ["global", chain, "global"],
    ).fetchall()
    (_, length, _, _, ids), (_, chain_seq, prev_hash, prev_id, _) = heads
    rows, params = [], []
    for position, (event, event_id) in enumerate(zip(events, sorted(ids), strict=True)):
        fields = {
            "seq": length + position + 1,
            "chain": chain,
            "chain_seq": chain_seq + position + 1,
            "prev_hash": prev_hash,
            **event,
            "created_at": now.isoformat(),
        }
        digest = _hash(fields)
        mac = hmac.new(b"bench-audit-key", f"bench:{digest}".encode(), hashlib.sha256).hexdigest()
        rows.append("(%s, %s, %s, %s, %s, %s, %s, 'bench', %s, %s, %s, 'token', 'token:bench', %s, "
                    "'call.transition', %s, %s, %s, %s, %s)")  # fmt: skip
        params += [event_id, fields["seq"], chain, fields["chain_seq"], prev_id, prev_hash, digest, mac]
        params += [event["task_id"], event["call_id"], event["token_id"], event["src"], event["dst"], "bench"]
        params += [Jsonb({}), now]
        prev_hash, prev_id = digest, event_id
    sql(
        "INSERT INTO recovery_auditevent (id, seq, chain, chain_seq, prev_id, prev_hash, hash, key_id, hmac, task_id, "
        "call_id, actor_kind, actor_label, actor_token_id, action, from_state, to_state, reason, evidence, "
        f"created_at) VALUES {', '.join(rows)}",
        params,
    )
    sql(
        "UPDATE recovery_auditchainhead SET length = CASE key WHEN %s THEN %s WHEN %s THEN %s END, "
        "head_hash = %s, head_event_id = %s, updated_at = %s WHERE key IN (%s, %s)",
        [chain, chain_seq + len(events), "global", length + len(events), prev_hash, prev_id, now, chain, "global"],
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
    # The product appends its audit events at the end of the transaction (recovery.audit.chain.appends_at_commit).
    return {"task_id": call["task_id"], "call_id": call["id"], "token_id": token_id, "src": src, "dst": dst}


WINDOW = (
    "SELECT SUM({}) FROM recovery_breakerbucket u WHERE u.tool_id = t.id AND u.bucket_start > %s "
    "AND u.bucket_start <= %s"
)


def _authenticate(sql: _Statements, token: str, pepper: str) -> tuple[int, list[int]]:
    """The token and its tenants in one query: its tenant links, each with its token and tenant."""
    rows = sql(
        "SELECT a.id, a.apitoken_id, a.tenant_id, k.id, k.digest, k.last_used_at, t.id, t.name "
        "FROM recovery_apitoken_tenants a JOIN recovery_apitoken k ON a.apitoken_id = k.id "
        "JOIN recovery_tenant t ON a.tenant_id = t.id "
        "WHERE k.prefix = %s AND k.revoked_at IS NULL ORDER BY t.name",
        [token[:12]],
    ).fetchall()
    digest = hmac.new(pepper.encode(), token.encode(), hashlib.sha256).hexdigest()
    if not rows or not hmac.compare_digest(rows[0][4], digest):
        raise NotFound("token")
    return rows[0][3], [row[6] for row in rows]


def _call(sql: _Statements, call_id: int, tenants: list[int], attempt_id: str) -> dict:
    """The call with what admission reads besides (selectors.tasks_calls.call_for_attempt's one statement)."""
    found = sql(
        "SELECT c.id, c.task_id, c.step_id, c.tool_id, c.arguments, c.state, c.version, c.attempts_count, "
        "c.idempotency_key, c.fingerprint, k.rounds_used, k.budget, t.name AS tool, t.budgets, t.breaker, "
        "t.required_result_fields, p.name AS provider, n.name AS tenant, s.index, b.state AS breaker_state, "
        "(SELECT u.id FROM recovery_attempt u WHERE u.call_id = c.id AND u.attempt_id = %s LIMIT 1) AS stored, "
        "(SELECT r.observed FROM recovery_receipt r WHERE r.call_id = c.id ORDER BY r.checked_at DESC LIMIT 1), "
        "(SELECT r.checked_at FROM recovery_receipt r WHERE r.call_id = c.id ORDER BY r.checked_at DESC LIMIT 1), "
        "EXISTS(SELECT 1 FROM recovery_call d WHERE d.step_id IN (SELECT e.to_step_id FROM recovery_step_depends_on e "
        "WHERE e.from_step_id = c.step_id)), "
        "COALESCE((SELECT COUNT(v.id) FROM recovery_call v WHERE v.task_id = c.task_id AND v.state = ANY(%s) "
        "GROUP BY v.task_id), 0), "
        "EXISTS(SELECT 1 FROM recovery_tool_alternates x WHERE x.from_tool_id = c.tool_id) "
        "FROM recovery_call c JOIN recovery_task k ON c.task_id = k.id "
        "JOIN recovery_tenant n ON k.tenant_id = n.id "
        "JOIN recovery_step s ON c.step_id = s.id JOIN recovery_tool t ON c.tool_id = t.id "
        "JOIN recovery_provider p ON t.provider_id = p.id LEFT JOIN recovery_breaker b ON b.tool_id = t.id "
        "WHERE c.id = %s AND c.tenant_id = ANY(%s) ORDER BY c.id LIMIT 1",
        [attempt_id, UNSETTLED, call_id, tenants],
    )
    row = found.fetchone()
    if row is None:
        raise NotFound("call")
    return dict(zip([column.name for column in found.description], row, strict=True))


def _count_breaker(sql: _Statements, call: dict, now: datetime) -> None:
    """breaker_record on a closed breaker: the bucket upsert and the state with the window's sums in one statement,
    the window's sums leaving the bucket just counted out and adding it as the upsert returned it."""
    bucket = int(now.timestamp() // BUCKET_S) * BUCKET_S
    others = f"{WINDOW} AND u.bucket_start <> %s"
    sql(
        "WITH counted AS (INSERT INTO recovery_breakerbucket (tool_id, bucket_start, successes, failures) "
        "VALUES (%s, %s, 1, 0) ON CONFLICT (tool_id, bucket_start) DO UPDATE SET successes = "
        "recovery_breakerbucket.successes + excluded.successes, failures = recovery_breakerbucket.failures "
        "+ excluded.failures RETURNING successes, failures) "
        "SELECT b.state, b.opened_at, b.probes_reserved, b.probe_lease_until, "
        f"COALESCE(({others.format('u.successes + u.failures')}), 0) + (SELECT successes + failures FROM counted), "
        f"COALESCE(({others.format('u.failures')}), 0) + (SELECT failures FROM counted), "
        "(SELECT successes + failures FROM counted) "
        "FROM recovery_tool t LEFT JOIN recovery_breaker b ON t.id = b.tool_id WHERE t.id = %s",
        [call["tool_id"], bucket, *[bucket - WINDOW_S, bucket, bucket] * 2, call["tool_id"]],
    ).fetchone()


def single_shot(conn: psycopg.Connection, call_id: int, body: dict, token: str, pepper: str, trace=None) -> dict:
    """One single-shot attempt, as the product makes it: the reads and the breaker count in autocommit (each its own
    transaction), then the rest in one transaction (_record). Returns the JSON answer; NotFound for an unknown token or
    call."""
    now = datetime.now(UTC)
    conn.autocommit = True
    with conn.cursor() as cursor:
        sql = _Statements(cursor, trace)
        token_id, tenants = _authenticate(sql, token, pepper)
        call = _call(sql, call_id, tenants, body["attempt_id"])
        if call["stored"] is not None:
            stored = sql("SELECT response FROM recovery_attempt WHERE id = %s", [call["stored"]]).fetchone()
            return stored[0]
        _count_breaker(sql, call, now)
        with conn.transaction():
            response = _record(sql, call_id, call, body, token_id, now)
    return response


def _record(sql: _Statements, call_id: int, call: dict, body: dict, token_id: int, now: datetime) -> dict:
    """The single shot's transaction: the task's counters, both transitions, the attempt, its gate answer, the
    audit events; returns the answer. Raw SQL by design: this is the no-framework baseline the ingest benchmark
    measures the product against, statement for statement."""
    number = call["attempts_count"] + 1
    sql(
        "UPDATE recovery_task SET rounds_used = rounds_used + %s, write_retries_used = write_retries_used + "
        "%s, tokens_used = tokens_used + %s WHERE id = %s RETURNING rounds_used, tokens_used, "
        "write_retries_used",
        [1, 0, 0, call["task_id"]],
    ).fetchone()
    extra, params = ", attempts_count = %s, sent_at = %s", [number, now]
    events = [_transition(sql, call, call["state"], "SENT", token_id, now, extra, params)]
    events.append(_transition(sql, call, "SENT", "COMMITTED", token_id, now))
    response = {
        "call_id": call_id,
        "attempt_id": body["attempt_id"],
        "attempt_number": number,
        "call_state": "COMMITTED",
        "policy_bypassed": False,
        "failure": None,
        "decision": None,
        "breaker_state": "closed",
        "provider_ref": "",
    }
    print_ = _hash({"tool": call["tool"], "arguments": call["arguments"]})
    attempt_pk = _insert_attempt(sql, call_id, call, body, number, print_, response, now)
    sql(
        "INSERT INTO recovery_gatedecision (call_id, attempt_id, candidate_attempt_id, candidate, dry_run, "
        "allowed, reason, evidence_used, checks, required_next, actor_token_id, created_at) "
        "VALUES (%s, %s, %s, %s, false, true, 'first_attempt', '', %s, %s, %s, %s) RETURNING id",
        [
            call_id,
            attempt_pk,
            body["attempt_id"],
            Jsonb({"tool": call["tool"], "fingerprint": print_}),
            Jsonb([]),
            Jsonb({}),
            token_id,
            now,
        ],
    )
    _audit(sql, events, now)
    return response


def _insert_attempt(
    sql: _Statements, call_id: int, call: dict, body: dict, number: int, print_: str, response: dict, now: datetime
) -> int:
    """The attempt row, its outcome and answer stored with it: its id."""
    outcome = body["outcome"]
    failure = {"side_effect": "sent", "row": "9", "phase": "response"}
    (attempt_pk,) = sql(
        "INSERT INTO recovery_attempt (call_id, attempt_id, number, tool_id, arguments, fingerprint, "
        "evidence, policy_bypassed, breaker_probe, admitted_at, facts, connection_opened, sent, http_status, "
        "error_kind, error_code, provider_request_id, reported_at, failure, failure_class, request_hash, "
        "response, outcome_request_hash, outcome_response, created_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, false, false, %s, %s, %s, %s, %s, '', '', '', %s, %s, '', %s, "
        "%s, %s, %s, %s) RETURNING id",
        [
            call_id,
            body["attempt_id"],
            number,
            call["tool_id"],
            Jsonb(call["arguments"]),
            print_,
            Jsonb([]),
            now,
            Jsonb(outcome),
            outcome.get("connection_opened"),
            outcome.get("sent"),
            outcome.get("http_status"),
            now,
            Jsonb(failure),
            _hash(body),
            Jsonb(response),
            _hash(outcome),
            Jsonb(response),
            now,
        ],
    ).fetchone()
    return attempt_pk


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

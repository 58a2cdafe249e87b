"""The sandbox's own store: SQLite in WAL mode, one connection per thread, lock-free reads, one lock around write
transactions (`BEGIN IMMEDIATE`), a write's effect, object and idempotency record in one transaction
(docs/sandbox.md, "How it is built").
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recovery.devtools.sandbox.kinds import KINDS_BY_NAME, synthetic_total_cents

log = logging.getLogger("recovery.sandbox")

SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    kind TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,  -- in_flight | done
    response_status INTEGER, response_body TEXT, created_at TEXT NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS objects (
    id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, key TEXT NOT NULL, ref TEXT NOT NULL,
    status TEXT NOT NULL, pending_checks INTEGER NOT NULL DEFAULT 0, final_status TEXT,
    route TEXT NOT NULL, data TEXT NOT NULL, request_body TEXT NOT NULL, state TEXT, created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS objects_kind_key ON objects (kind, key);
CREATE INDEX IF NOT EXISTS objects_kind_ref ON objects (kind, ref);
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, key TEXT NOT NULL, route TEXT NOT NULL,
    provider_ref TEXT NOT NULL, at TEXT NOT NULL, body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_key ON ledger (key);
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY, customer_id TEXT, status TEXT NOT NULL, total_cents INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL,
    key TEXT, status INTEGER, outcome TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS callbacks (
    id INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL, type TEXT NOT NULL, key TEXT NOT NULL,
    url TEXT NOT NULL, status INTEGER, error TEXT, at TEXT NOT NULL
);
"""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True, kw_only=True)
class IdempotencyRecord:
    fingerprint: str
    in_flight: bool
    response_status: int | None
    response_body: Any


@dataclass(frozen=True, kw_only=True)
class WriteObject:
    kind: str
    key: str
    ref: str
    status: str
    route: str
    data: dict[str, Any]
    state: str | None


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        # The request log is written off the request path: appended here, flushed in batches by a background
        # thread (and before anyone reads it), so a request never waits on the store's write lock just to be logged.
        self._log_lock = threading.Lock()
        self._pending_log: list[tuple] = []
        self._log_wanted = threading.Event()
        threading.Thread(target=self._log_flusher, name="sandbox-log", daemon=True).start()
        conn = self._conn()
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SCHEMA)
        # A claim still in flight at startup belongs to a request that died with the previous process before its
        # transaction committed: nothing was executed, so the key is free again.
        conn.execute("DELETE FROM idempotency WHERE state = 'in_flight'")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._write_lock:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def reset(self) -> None:
        with self._log_lock:
            self._pending_log.clear()
        with self.transaction() as conn:
            for table in ("idempotency", "objects", "ledger", "orders", "requests", "callbacks"):
                conn.execute(f"DELETE FROM {table}")  # fixed table names, not input

    # Idempotency records: call these inside `transaction()`.

    def idempotency_get(self, kind: str, key: str) -> IdempotencyRecord | None:
        row = self._conn().execute("SELECT * FROM idempotency WHERE kind = ? AND key = ?", (kind, key)).fetchone()
        if row is None:
            return None
        body = row["response_body"]
        return IdempotencyRecord(
            fingerprint=row["fingerprint"],
            in_flight=row["state"] == "in_flight",
            response_status=row["response_status"],
            response_body=json.loads(body) if body is not None else None,
        )

    def idempotency_claim(self, kind: str, key: str, fingerprint: str) -> None:
        self._conn().execute(
            "INSERT INTO idempotency (kind, key, fingerprint, state, created_at) VALUES (?, ?, ?, 'in_flight', ?)",
            (kind, key, fingerprint, now_iso()),
        )

    def idempotency_release(self, kind: str, key: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM idempotency WHERE kind = ? AND key = ? AND state = 'in_flight'", (kind, key))

    def record_write(
        self,
        *,
        obj: WriteObject,
        request_body: Any,
        fingerprint: str,
        pending_checks: int | None,
        final_status: str,
        response_status: int,
        response_body: Any,
    ) -> None:
        """Store an executed write: its object, its idempotency record (the first response wins, which is also
        what the broken ignore-keys mode relies on) and, unless it is pending, its business effect."""
        conn = self._conn()
        conn.execute(
            "INSERT INTO objects (kind, key, ref, status, pending_checks, final_status, route, data, request_body,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                obj.kind, obj.key, obj.ref, obj.status, pending_checks or 0, final_status, obj.route,
                json.dumps(obj.data), json.dumps(request_body), now_iso(),
            ),
        )  # fmt: skip
        conn.execute(
            "INSERT INTO idempotency (kind, key, fingerprint, state, response_status, response_body, created_at)"
            " VALUES (?, ?, ?, 'done', ?, ?, ?) ON CONFLICT (kind, key) DO UPDATE SET state = 'done',"
            " response_status = excluded.response_status, response_body = excluded.response_body"
            " WHERE idempotency.state = 'in_flight'",
            (obj.kind, obj.key, fingerprint, response_status, json.dumps(response_body), now_iso()),
        )
        if pending_checks is None:
            self._apply(obj, request_body)

    def _apply(self, obj: WriteObject, request_body: Any) -> None:
        """The business effect of a committed write: one ledger entry, plus what later reads should see."""
        conn = self._conn()
        conn.execute(
            "INSERT INTO ledger (kind, key, route, provider_ref, at, body) VALUES (?, ?, ?, ?, ?, ?)",
            (obj.kind, obj.key, obj.route, obj.ref, now_iso(), json.dumps(request_body)),
        )
        if obj.kind == "orders":
            conn.execute(
                "INSERT OR REPLACE INTO orders (order_id, customer_id, status, total_cents) VALUES (?, ?, 'open', ?)",
                (obj.ref, obj.data.get("customer_id"), obj.data.get("total_cents", 0)),
            )
        elif obj.kind == "cancellations":
            order_id = obj.data["order_id"]
            conn.execute(
                "INSERT INTO orders (order_id, status, total_cents) VALUES (?, 'cancelled', ?)"
                " ON CONFLICT (order_id) DO UPDATE SET status = 'cancelled'",
                (order_id, synthetic_total_cents(order_id)),
            )
        elif obj.kind == "access.revocations":
            conn.execute("UPDATE objects SET state = 'revoked' WHERE kind = 'access.grants' AND ref = ?", (obj.ref,))

    def check_pending(self, kind: str, key: str) -> tuple[WriteObject | None, bool]:
        """Count one status query against the key's latest object; a pending one answers "pending" while checks
        remain and then resolves to its final status. Returns the object and whether this query resolved it."""
        with self.transaction() as conn:
            row = conn.execute(
                "SELECT * FROM objects WHERE kind = ? AND key = ? ORDER BY id DESC LIMIT 1", (kind, key)
            ).fetchone()
            if row is None or row["status"] != "pending":
                return (_object(row) if row else None), False
            if row["pending_checks"] > 0:
                conn.execute("UPDATE objects SET pending_checks = pending_checks - 1 WHERE id = ?", (row["id"],))
                return _object(row), False
            conn.execute("UPDATE objects SET status = final_status WHERE id = ?", (row["id"],))
            obj = _object(conn.execute("SELECT * FROM objects WHERE id = ?", (row["id"],)).fetchone())
            if obj.status == KINDS_BY_NAME[kind].ok_status:
                self._apply(obj, json.loads(row["request_body"]))
            return obj, True

    # Reads: lock-free.

    def object_by_key(self, kind: str, key: str) -> WriteObject | None:
        row = (
            self._conn()
            .execute("SELECT * FROM objects WHERE kind = ? AND key = ? ORDER BY id DESC LIMIT 1", (kind, key))
            .fetchone()
        )
        return _object(row) if row else None

    def object_by_ref(self, kind: str, ref: str) -> WriteObject | None:
        row = (
            self._conn()
            .execute("SELECT * FROM objects WHERE kind = ? AND ref = ? ORDER BY id DESC LIMIT 1", (kind, ref))
            .fetchone()
        )
        return _object(row) if row else None

    def list_objects(self, kind: str, *, after_ref: str | None = None) -> list[tuple[WriteObject, Any, str]]:
        """The kind's objects in creation order (after the one with `after_ref`), each with its request's body and its
        creation time."""
        sql, args = "SELECT * FROM objects WHERE kind = ?", [kind]
        if after_ref:
            sql += " AND id > COALESCE((SELECT MAX(id) FROM objects WHERE kind = ? AND ref = ?), 0)"
            args += [kind, after_ref]
        rows = self._conn().execute(sql + " ORDER BY id", args).fetchall()
        return [(_object(row), json.loads(row["request_body"]), row["created_at"]) for row in rows]

    def effects(self, kind: str, key: str) -> int:
        return self._conn().execute("SELECT COUNT(*) FROM ledger WHERE kind = ? AND key = ?", (kind, key)).fetchone()[0]

    def ledger(self, key: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM ledger", ()
        if key is not None:
            sql, args = sql + " WHERE key = ?", (key,)
        rows = self._conn().execute(sql + " ORDER BY id", args).fetchall()
        return [
            {
                "key": row["key"],
                "kind": row["kind"],
                "route": row["route"],
                "provider_ref": row["provider_ref"],
                "at": row["at"],
                "body": json.loads(row["body"]),
            }
            for row in rows
        ]

    def order(self, order_id: str) -> dict[str, Any] | None:
        row = self._conn().execute("SELECT * FROM orders WHERE order_id = ?", (order_id,)).fetchone()
        return dict(row) if row else None

    def order_known(self, order_id: str) -> bool:
        return self.order(order_id) is not None

    def grant_known(self, grant_id: str) -> bool:
        grant = self.object_by_ref("access.grants", grant_id)
        return grant is not None and grant.status == "active"

    # Logs.

    def log_request(
        self, *, at: str, method: str, path: str, key: str | None, status: int | None, outcome: str
    ) -> None:
        with self._log_lock:
            self._pending_log.append((at, method, path, key, status, outcome))
        self._log_wanted.set()

    def flush_log(self) -> None:
        """Write the requests logged so far, in the order they were logged."""
        with self._log_lock:
            batch, self._pending_log = self._pending_log, []
        if not batch:
            return
        try:
            with self.transaction() as conn:
                conn.executemany(
                    "INSERT INTO requests (at, method, path, key, status, outcome) VALUES (?, ?, ?, ?, ?, ?)", batch
                )
        except Exception:
            with self._log_lock:
                self._pending_log[:0] = batch  # kept, in order, for the next flush
            raise

    def _log_flusher(self) -> None:
        while True:
            self._log_wanted.wait()
            time.sleep(0.05)  # gather a batch
            self._log_wanted.clear()
            try:
                self.flush_log()
            except Exception:  # a full disk must not kill the logger thread: the entries wait for the next flush
                log.exception("sandbox: writing the request log failed")

    def requests(
        self, *, path_prefix: str | None = None, key: str | None = None, method: str | None = None
    ) -> list[dict[str, Any]]:
        self.flush_log()
        sql, args = "SELECT at, method, path, key, status, outcome FROM requests WHERE 1 = 1", []
        if path_prefix:
            sql += " AND substr(path, 1, ?) = ?"
            args += [len(path_prefix), path_prefix]
        if key is not None:
            sql += " AND key = ?"
            args.append(key)
        if method:
            sql += " AND method = ?"
            args.append(method.upper())
        return [dict(row) for row in self._conn().execute(sql + " ORDER BY id", args).fetchall()]

    def log_callback(
        self, *, event_id: str, type: str, key: str, url: str, status: int | None, error: str | None
    ) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO callbacks (event_id, type, key, url, status, error, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (event_id, type, key, url, status, error, now_iso()),
            )

    def callbacks(self) -> list[dict[str, Any]]:
        rows = (
            self._conn()
            .execute("SELECT event_id, type, key AS idempotency_key, url, status, error, at FROM callbacks ORDER BY id")
            .fetchall()
        )
        return [dict(row) for row in rows]


def _object(row: sqlite3.Row) -> WriteObject:
    return WriteObject(
        kind=row["kind"],
        key=row["key"],
        ref=row["ref"],
        status=row["status"],
        route=row["route"],
        data=json.loads(row["data"]),
        state=row["state"],
    )

"""The audit history of the calls `queue_load.load(extra=AUDIT_HISTORY)` loads: the events their rows imply, COPYed
after the global head with their chains and heads (chained as recovery.audit.chain appends them, not hashed with its
canonical hash), for the metrics benchmark's fold (docs/benchmarks.md, "The metrics benchmark").
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
from collections.abc import Iterator

from recovery.audit.actions import AuditAction
from recovery.audit.chain import GLOBAL, Actor, Keyring, chain_key
from recovery.devtools.benchmarks.queue_load import (
    _LAST,
    CALLS_PER_TASK,
    PREFIX,
    STATES,
    SUBMITTED_S,
    UNKNOWN,
    N,
    _Calls,
    _copy,
    _task_outcome,
    _ts,
)
from recovery.models import ApiToken, AuditChainHead, AuditEvent, Tenant
from recovery.services.tokens import token_create

# --- the audit history (load(extra=AUDIT_HISTORY)) ------------------------------------------------------------------

# An attempt's outcome as its audit event tells it, per kind of outcome (_OUTCOMES): the state it led to, its row of
# docs/design/classification.md, its failure class and the decision's route (what the metrics fold reads), its HTTP
# status.
_TOLD = {
    "transient": ("RETRYABLE", "3", "transient", "retry", "503"),
    "timeout": (UNKNOWN, "8", "outcome_unknown", "reconcile", "null"),
    "rejected": ("FAILED_PERMANENT", "4", "invalid_arguments", "stop", "422"),
    "forbidden": ("HUMAN_REVIEW", "6", "authorization", "escalate", "403"),
    "committed": ("COMMITTED", "10", "", "", "200"),
    "accepted": ("ACCEPTED", "9", "", "", "202"),
}
RUNTIME_TOKEN = f"{PREFIX}-runtime"
_RUNTIME, _SWEEPER, _RECONCILER, _COMPENSATOR = range(4)  # who writes an event (_History.actors)
_TRANSITION, _CHECKED, _SUBMITTED = AuditAction.CALL_TRANSITION, AuditAction.CALL_CHECKED, AuditAction.TASK_SUBMITTED
# One event before numbering: (time, action, from state, to state, evidence as JSON, actor, reason, call id or None)
_Event = tuple[float, str, str, str, str, int, str, int | None]


class _History:
    """The audit events the loaded rows imply, in time order, numbered and chained as recovery.audit.chain appends them:
    per call the `call.transition` events its row's state and version say it went through and a `call.checked` per
    status check of an UNKNOWN call that learned nothing, per ended task its `task.submitted`. The hash is a digest of
    the event's fields, not event_hash's canonical one (it would double the load's time): verify_audit would flag them.
    """

    def __init__(self, calls: _Calls, *, first_id: int, first_seq: int, token_id: int):
        self.calls, self.next_id, self.next_seq = calls, first_id, first_seq
        self.chains: dict[int, list] = {}  # task id -> [length, last hash, last event id]
        self.last: tuple[int, str, int] | None = None  # the last event's seq, hash and id
        self.keyring = Keyring.from_settings()
        self.actors = (
            ("token", f"token:{RUNTIME_TOKEN}", str(token_id)),
            ("job", "job:sweep-sent", N),
            ("job", "job:reconcile", N),
            ("job", "job:compensations", N),
        )

    def lines(self) -> Iterator[str]:
        """The events' COPY lines in seq order: each task's events merged in as soon as nothing later can precede."""
        layout, heap, order = self.calls.layout, [], itertools.count()
        for k in range(layout.tasks):
            for event in self._task(k):
                heapq.heappush(heap, (event[0], next(order), k, event))
            # Every event still to come is later than the next task's creation (its first call comes 2 s after).
            bound = layout.task_at[k + 1] if k + 1 < layout.tasks else math.inf
            while heap and heap[0][0] < bound:
                _, _, task, event = heapq.heappop(heap)
                yield self._line(task, event)

    def heads(self) -> Iterator[str]:
        updated = _ts(self.calls.now)
        for task_id, (length, digest, pk) in self.chains.items():
            yield f"{chain_key(task_id)}\t{length}\t{digest}\t{pk}\t{updated}\n"

    def _line(self, k: int, event: _Event) -> str:
        at, action, src, dst, evidence, actor, reason, call_id = event
        task_id, seq, pk = self.calls.ids["task"] + k, self.next_seq, self.next_id
        length, prev_hash, prev_id = self.chains.get(task_id) or (0, "", N)
        chain, created = chain_key(task_id), _ts(at)
        digest = hashlib.sha256(
            f"{seq}|{chain}|{length + 1}|{prev_hash}|{call_id}|{action}|{src}|{dst}|{evidence}|{created}".encode()
        ).hexdigest()
        self.chains[task_id], self.last = [length + 1, digest, pk], (seq, digest, pk)
        self.next_seq, self.next_id = seq + 1, pk + 1
        kind, label, token = self.actors[actor]
        return (
            f"{pk}\t{seq}\t{chain}\t{length + 1}\t{prev_id}\t{prev_hash}\t{digest}\t{self.keyring.signing_id}\t"
            f"{self.keyring.sign(digest)}\t{task_id}\t{N if call_id is None else call_id}\t{kind}\t{label}\t{N}\t"
            f"{token}\t{action}\t{src}\t{dst}\t{reason}\t{evidence}\t{created}\n"
        )

    def _task(self, k: int) -> list[_Event]:
        layout = self.calls.layout
        events = [
            event
            for i in range(k * CALLS_PER_TASK, min((k + 1) * CALLS_PER_TASK, layout.calls))
            for event in self._call(i)
        ]
        if outcome := _task_outcome(layout, k):
            at, evidence = layout.task_at[k] + SUBMITTED_S, f'{{"outcome": "{outcome}"}}'
            events.append((at, _SUBMITTED, "", "", evidence, _RUNTIME, f"submitted: {outcome}", None))
        return events

    def _call(self, i: int) -> list[_Event]:
        calls, layout = self.calls, self.calls.layout
        state, count, call_id = STATES[layout.state[i]], layout.attempts[i], calls.ids["call"] + i
        events = []
        for number in range(1, count + 1):
            at = calls.sent_at[i] + 4 * (number - 1)
            src, evidence = ("READY", "") if number == 1 else ("RETRYABLE", "time_elapsed")
            admitted = f'{{"attempt_id": "att-{call_id}-{number}", "gate": "allowed", "evidence": "{evidence}"}}'
            events.append((at, _TRANSITION, src, "SENT", admitted, _RUNTIME, f"attempt {number} admitted", call_id))
            if number < count:
                events.append(_outcome(at + 0.4, call_id, number, "transient"))
        if state in ("READY", "SENT"):
            return events
        changed, last_sent = calls.changed[i], calls.sent_at[i] + 4 * (count - 1)
        early = last_sent + 0.05  # the last outcome, when a receipt or a compensation moved the call after it
        if state == UNKNOWN:  # no outcome in time: swept, then checked (the status checks that learned nothing)
            events.append(_swept(changed, call_id, last_sent))
            for n in range(1, calls.checks[i] + 1):
                observed = calls.receipts[i] if n == calls.checks[i] else "pending"
                at = min(changed + 5 * 2**n, calls.now - 1)
                events.append(_receipt(at, call_id, UNKNOWN, UNKNOWN, observed, action=_CHECKED))
        elif state == "NOT_COMMITTED":
            events += [_outcome(early, call_id, count, "timeout"), _receipt(changed, call_id, UNKNOWN, state)]
        elif state == "COMMITTED" and calls.version[i] > 2 * count:  # settled by a status check
            write = calls.tools[layout.tool[i]].side_effect == "write"
            kind, src = ("timeout", UNKNOWN) if write else ("accepted", "ACCEPTED")
            events += [_outcome(early, call_id, count, kind), _receipt(changed, call_id, src, state)]
        elif state == "COMPENSATED":
            events.append(_outcome(early, call_id, count, "committed"))
            for at, src, dst in ((early + changed) / 2, "COMMITTED", "COMPENSATING"), (changed, "COMPENSATING", state):
                events.append((at, _TRANSITION, src, dst, '{"compensation": "cancel"}', _COMPENSATOR, dst, call_id))
        else:
            events.append(_outcome(changed, call_id, count, _LAST[state], calls.outcomes.get(i, "")))
        return events


def _outcome(at: float, call_id: int, number: int, kind: str, outcome: str = "") -> _Event:
    """An attempt's outcome reported: SENT -> the state its row leads to, as recovery.services.outcomes tells it."""
    dst, row, failure_class, route, status = _TOLD[kind]
    evidence = (
        f'{{"attempt_id": "att-{call_id}-{number}", "row": "{row}", "error": "{kind}", "http_status": {status}, '
        f'"class": "{failure_class}", "route": "{route}"' + (f', "outcome": "{outcome}"}}' if outcome else "}")
    )
    return at, _TRANSITION, "SENT", dst, evidence, _RUNTIME, f"attempt {number}: {kind} (row {row})", call_id


def _swept(at: float, call_id: int, sent: float) -> _Event:
    evidence = f'{{"sent_at": "{_ts(sent)}", "outcome_timeout_s": 30, "class": "outcome_unknown"}}'
    return at, _TRANSITION, "SENT", UNKNOWN, evidence, _SWEEPER, "no outcome 30 s after the attempt was sent", call_id


def _receipt(at: float, call_id: int, src: str, dst: str, observed: str = "", action: str = _TRANSITION) -> _Event:
    """A status query's receipt: the move it settled, or (`call.checked`) the check that moved nothing."""
    observed = observed or dst.lower()
    evidence = f'{{"observed": "{observed}", "provider_status": "{observed}", "source": "poll"}}'
    return at, action, src, dst, evidence, _RECONCILER, f"status check: {observed}", call_id


def runtime_token() -> int:
    """The token the loaded runtime events name as their actor (created once, as an admin would)."""
    if found := ApiToken.objects.filter(name=RUNTIME_TOKEN).values_list("pk", flat=True).first():
        return found
    tenants = list(Tenant.objects.filter(name__startswith=f"{PREFIX}-").values_list("name", flat=True))
    return token_create(name=RUNTIME_TOKEN, tenants=tenants, actor=Actor.system("bench"))[0].pk


_HEADS = AuditChainHead._meta.db_table
AUDIT_COLUMNS = tuple(field.column for field in AuditEvent._meta.concrete_fields)
HEAD_COLUMNS = ("key", "length", "head_hash", "head_event_id", "updated_at")


def copy_history(cursor, calls: _Calls, *, first_id: int, token_id: int) -> dict[str, int]:
    """COPY the calls' audit history after the global head, which is locked for it and then moved to its end (the
    heads' trigger lets a head move forward up to its events; INSERT is all the audit table's guard allows, and
    all this needs: no maintenance switch)."""
    cursor.execute(f"INSERT INTO {_HEADS} (key, length, head_hash, updated_at) VALUES (%s, 0, '', now()) "
                   "ON CONFLICT (key) DO NOTHING", [GLOBAL])  # fmt: skip
    cursor.execute(f"SELECT length FROM {_HEADS} WHERE key = %s FOR UPDATE", [GLOBAL])
    (length,) = cursor.fetchone()
    history = _History(calls, first_id=first_id, first_seq=length + 1, token_id=token_id)
    events = _copy(cursor, AuditEvent._meta.db_table, AUDIT_COLUMNS, history.lines())
    heads = _copy(cursor, _HEADS, HEAD_COLUMNS, history.heads())
    if history.last is not None:
        cursor.execute(
            f"UPDATE {_HEADS} SET length = %s, head_hash = %s, head_event_id = %s, updated_at = now() WHERE key = %s",
            [*history.last, GLOBAL],
        )
    return {"audit_events": events, "chain_heads": heads}


class _AuditHistory:
    """queue_load.load's extra rows: the loaded calls' audit history, after the events already there."""

    models = (AuditEvent, AuditChainHead)

    def __init__(self) -> None:
        self.token_id: int | None = None

    def prepare(self) -> None:
        self.token_id = runtime_token()

    def copy(self, cursor, calls: _Calls, ids: dict[str, int]) -> dict[str, int]:
        return copy_history(cursor, calls, first_id=ids["auditevent"], token_id=self.token_id)


AUDIT_HISTORY = _AuditHistory()

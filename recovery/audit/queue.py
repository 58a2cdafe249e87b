"""The events an appends_at_commit() block (recovery.audit.chain) holds until it ends, and what tells whether their
changes still stand: the savepoints rolled back inside the block, seen as their statements go by."""

from __future__ import annotations


class Queue:
    """An appends_at_commit() block's events, each with the savepoints open in the block when it was queued, and
    the savepoints rolled back since: told by the statements themselves, which pass watch() on their way."""

    _SQL = ("SAVEPOINT ", "RELEASE SAVEPOINT ", "ROLLBACK TO SAVEPOINT ")

    def __init__(self):
        self.events: list[dict] = []
        self.inside: list[tuple[str, ...]] = []
        self.open: list[str] = []
        self.rolled_back: set[str] = set()

    def add(self, fields: dict) -> None:
        self.events.append(fields)
        self.inside.append(tuple(self.open))

    def watch(self, execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if isinstance(sql, str) and sql.startswith(self._SQL):
            sid = sql.rsplit(" ", 1)[-1].strip('"`')
            if sql.startswith("SAVEPOINT "):
                self.open.append(sid)
            elif sql.startswith("ROLLBACK"):
                self.rolled_back.add(sid)
            elif sid in self.open:
                self.open.remove(sid)
        return result

    def undone(self) -> int:
        """How many events were queued inside a savepoint that was rolled back (their change undone, not them)."""
        return sum(1 for inside in self.inside if self.rolled_back.intersection(inside))

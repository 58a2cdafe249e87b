"""Django's PostgreSQL backend (DATABASES ENGINE "console.postgresql"), its health check without a round trip.

With CONN_HEALTH_CHECKS, Django asks a kept connection `SELECT 1` before a request first uses it: one round trip on
every request, the API's hot endpoints included (docs/benchmarks.md, the protected benchmark's sixth round). The
question it answers — did PostgreSQL go away while the connection sat idle? — has its answer already on the socket:
a server that ends a connection (a restart, pg_terminate_backend, an idle timeout, PgBouncer going down) says so in a
message or closes the socket, and either makes it readable. An idle connection with nothing to read is taken as
usable, as Django's check would find it; one with something to read is asked `SELECT 1` as before, and closed when
that fails. A server that vanished without a word (a host gone, a cable cut) is found by neither: the statement that
meets it fails, as it would after Django's check.
"""

from __future__ import annotations

import select

import psycopg
from django.db.backends.postgresql import base
from psycopg import pq

_SAID_SOMETHING = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | select.POLLNVAL


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        if self.connection is None or self.connection.closed or self.connection.broken:
            return False
        pgconn = self.connection.pgconn
        if pgconn.status != pq.ConnStatus.OK or pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return super().is_usable()
        try:
            poller = select.poll()
            poller.register(pgconn.socket, _SAID_SOMETHING)
            said = poller.poll(0)
        except (OSError, ValueError, psycopg.Error):
            return False
        return True if not said else super().is_usable()

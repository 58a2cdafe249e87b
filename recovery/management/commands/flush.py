"""`flush` with the audit tables' append-only guard lifted for the duration, and that use recorded in the log.

Django's test runner flushes between transactional tests; without this the guard (rightly) refuses. Any other
flush of a production database wipes the audit trail with it, so it is logged loudly.
"""

import logging

from django.core.management.commands.flush import Command as FlushCommand
from django.db import connections, transaction

from recovery.statemachine import dbguards

logger = logging.getLogger("recovery.audit")


class Command(FlushCommand):
    help = FlushCommand.help + " The audit maintenance switch is on for the flush, and its use is logged."

    def handle(self, **options):
        connection = connections[options["database"]]
        logger.warning(
            "flush: audit maintenance switch on for database %r (every audit row is deleted)", options["database"]
        )
        # One transaction, the switch local to it: behind PgBouncer in transaction mode a session setting would be
        # set on one server connection, the truncation run on another, and the switch left on for whoever came next.
        with transaction.atomic(using=options["database"]):
            dbguards.set_maintenance(connection, True, local=True)
            try:
                return super().handle(**options)
            finally:
                dbguards.set_maintenance(connection, False, local=True)

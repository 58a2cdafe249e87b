"""`manage.py nodes [--refunds 2000] [--keep DIR]`: the several-nodes scenario on this machine
(recovery/devtools/drills/nodes.py); needs PostgreSQL, REDIS_URL, Debian's nginx and pgbouncer and the production
settings the web processes start with. What it stands up, breaks and checks: docs/deploy.md ("Several nodes on one
machine").
"""

from __future__ import annotations

import shutil
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from recovery.devtools.drills.nodes import REFUNDS, run_nodes
from recovery.devtools.drills.servers import Nginx, PgBouncer


class Command(BaseCommand):
    help = (
        "Run the several-nodes scenario: nginx, two web processes, PgBouncer, four workers, two scheduler candidates "
        "and one Redis on this machine; refunds with lost replies while a web process, a worker and the scheduler's "
        "holder are killed; print the checks and times, exit non-zero on a failed check."
    )

    def add_arguments(self, parser):
        parser.add_argument("--refunds", type=int, default=REFUNDS, help=f"refunds to make ({REFUNDS:,})")
        parser.add_argument("--keep", type=Path, default=None, help="keep the processes' logs and files in this folder")

    def handle(self, *args, refunds: int, keep: Path | None, **options):
        if connection.vendor != "postgresql":
            raise CommandError(f"needs PostgreSQL (DATABASE_URL=postgres://...), this is {connection.vendor}")
        if not settings.REDIS_URL:
            raise CommandError("needs Redis (REDIS_URL=redis://...): the workers and scheduler candidates share it")
        for binary, package in ((Nginx.BINARY, "nginx-light"), (PgBouncer.BINARY, "pgbouncer")):
            if not Path(binary).exists() and not shutil.which(Path(binary).name):
                raise CommandError(f"needs {binary} (apt-get install {package})")
        if refunds < 8:
            raise CommandError("--refunds must be at least 8")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        result = run_nodes(refunds=refunds, env={}, redis_url=settings.REDIS_URL, log=self.stdout.write, work_dir=keep)
        for line in result.lines():
            self.stdout.write(line)
        if not result.passed:
            raise CommandError("a check failed (above)")

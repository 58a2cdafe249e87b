"""Several nodes on one machine (docs/design/quality-targets.md, docs/deploy.md; docs/deploy.md): nginx in front of two
web processes, PgBouncer in transaction mode, four workers, two scheduler candidates and one Redis, all real processes
started from the shipped configurations; 2,000 refunds with every reply lost, made through nginx while a web process, a
worker mid-check and the scheduler's holder are killed with SIGKILL (recovery/devtools/drills/nodes.py, also `manage.py
nodes`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from recovery.devtools.drills.nodes import REFUNDS, run_nodes
from recovery.devtools.drills.servers import Nginx, PgBouncer
from recovery.models import Call
from tests.conftest import missing_service
from tests.isolation import extra_redis_database, flush
from tests.servers import production_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CHECKS = (
    "every refund COMMITTED before its deadline",
    "one effect per key",
    "no call checked twice at once",
    "no acknowledged attempt lost",
    "every runtime got past the kills",
    "the standby scheduler held the lock within its lease",
)


@pytest.fixture
def redis_url():
    url = extra_redis_database("several-nodes")
    try:
        flush(url)
    except Exception as error:
        missing_service(f"needs Redis at {url} ({error})")
    return url


def test_two_thousand_refunds_survive_a_killed_web_process_worker_and_scheduler_holder(redis_url, tmp_path):
    for binary in (Nginx.BINARY, PgBouncer.BINARY):
        if not Path(binary).exists():
            missing_service(f"needs {binary} (Debian's nginx-light and pgbouncer: .ci/run installs them)")
    lines = []

    def log(line: str) -> None:
        lines.append(line)
        print(line)

    result = run_nodes(refunds=REFUNDS, env=production_env(), redis_url=redis_url, log=log, work_dir=tmp_path)

    print("\n".join(result.lines()))
    assert [check.name for check in result.checks] == list(CHECKS)
    failed = [f"{check.name}: {check.observed}" for check in result.checks if not check.passed]
    assert not failed, "\n".join(failed)
    assert REFUNDS == 2_000
    assert Call.objects.filter(tool__name="drill.refund.create", state="COMMITTED").count() == REFUNDS
    # Each kill happened while refunds were still being made, in the order the scenario names.
    killed = [result.times[f"kill -9 {name} at"] for name in ("web", "worker", "scheduler holder")]
    assert killed == sorted(killed) and killed[-1] < result.times["refunds made"]
    assert any("kill -9 worker" in line for line in lines)
    assert result.counts["calls the killed worker was checking"] > 0  # it died mid-check
    # nginx carried every runtime request; the killed web process cost the runtimes a resend, not an error.
    assert result.counts["requests through nginx"] >= 4 * REFUNDS


def test_the_command_says_what_it_needs_before_starting_anything(settings):
    settings.REDIS_URL = ""
    with pytest.raises(CommandError, match=r"needs (Redis|PostgreSQL)"):
        call_command("nodes", "--refunds", "20")

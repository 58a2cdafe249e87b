"""The metrics' reads cost the same whatever the history (docs/design/quality-targets.md): the metrics page, the JSON,
`/metrics` and the overview run the same SQL statements at 10 calls and at 20,000 calls (with their attempts and audit
events, folded by the product's own fold and checked against counts made from the raw rows), since they read rollups and
the current queues, never the history. `make bench BENCH=metrics` holds the same at 10,000 and 1,000,000 calls, and
times them; this test keeps to a size CI folds in about a minute (the fold reads some 6 audit events a call)."""

from __future__ import annotations

import pytest

from recovery.audit.chain import Actor
from recovery.devtools.benchmarks.audit_load import AUDIT_HISTORY
from recovery.devtools.benchmarks.metrics import check_rollups, fold, measure, reads
from recovery.devtools.benchmarks.queue_load import load
from recovery.models import Call, Tenant, TokenScope
from recovery.services.tokens import token_create

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _statements(token: str) -> dict[str, int]:
    return {name: figures["statements"] for name, figures in measure(reads(token), 2).items()}


def test_the_metrics_reads_run_the_same_statements_at_10_and_at_20000_calls(settings, console_people):
    """(console_people: the role groups restored after an earlier transactional test's flush.)"""
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    load(10, unknown=1, seed=3, extra=AUDIT_HISTORY)
    fold()
    check_rollups()
    tenants = list(Tenant.objects.values_list("name", flat=True))
    _, token = token_create(name="scraper", tenants=tenants, actor=Actor.system("tests"), scope=TokenScope.METRICS)
    few = _statements(token)

    load(19_990, unknown=200, seed=4, extra=AUDIT_HISTORY)
    folded = fold()
    checked = check_rollups()

    assert Call.objects.count() == 20_000 and folded["events"] > 60_000
    assert checked["checked"]["calls"] > 18_000  # check_rollups raises on any difference from the raw rows
    many = _statements(token)
    assert set(few) >= {"prometheus_viewer", "prometheus_token", "metrics_page_24h", "metrics_page_30d", "overview"}
    assert many == few

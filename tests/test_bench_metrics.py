"""`manage.py bench metrics` at a tiny scale, so the benchmark (its audit history loader, the fold and its check, the
reads timed at both sizes, ingest with the fold process) cannot rot: 100 then 1,000 calls, 2 requests per read, two
ingest rounds of 20 single shots per series with a fold every second."""

from __future__ import annotations

import pytest

from recovery.devtools.benchmarks.metrics import bench_metrics
from recovery.models import AuditChainHead, AuditEvent, Call, MetricFold

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

READS = ("prometheus_viewer", "prometheus_token", "metrics_page_24h", "metrics_page_30d", "overview", "api_24h")
# What the benchmark figures quote: keep in step with /docs/benchmarks.md's metrics section and
# recovery/devtools/benchmarks/metrics.py.
README_KEYS = (
    "small_load", "big_load", "small_fold_events_per_s", "big_fold_events_per_s", "big_fold_s",
    *(f"{read}_{size}_{stat}" for read in READS for size in ("small", "big")
      for stat in ("median_ms", "p95_ms", "statements")),
    *(f"{read}_ratio_1m_over_10k" for read in READS),
    "ingest_attempts_per_s", "ingest_with_fold_attempts_per_s", "ingest_with_fold_ratio", "ingest_fold_every_s",
    "statements_constant", "rollups_checked", "meets_targets", "disk_needed_gb",
)  # fmt: skip


def test_the_metrics_benchmark_loads_folds_checks_and_times_both_sizes(console_people):
    # console_people: the role groups the benchmark's users are given (an earlier transactional test's flush removed
    # them; on a migrated database they are there).
    result = bench_metrics(2, calls=1000, small=100, ingest_attempts=40, ingest_rounds=2, fold_every=1)

    missing = [key for key in README_KEYS if key not in result]
    assert not missing, missing
    assert result["rollups_checked"] is True
    assert result["small_checked"]["calls"] <= 100 and result["big_checked"]["calls"] <= 1000
    assert result["big_checked"]["attempts"] > result["small_checked"]["attempts"]
    assert (result["small_load"]["calls"], result["big_load"]["calls"]) == (100, 900)
    assert result["big_load"]["attempts"] == 3 * 900
    # The history grows, the backlog the queues hold does not: the growth leaves no call in a reviewer's queue.
    assert result["small_open_items"] > 0 and result["big_open_items"] == result["small_open_items"]
    assert result["big_load"]["unknown"] == 0 and result["big_load"]["queued"] is False
    # Every loaded event folded; the audit trail's global head at its last event, each task's at its chain's end.
    loaded = result["small_load"]["audit_events"] + result["big_load"]["audit_events"]
    assert result["small_fold_events"] + result["big_fold_events"] >= loaded
    head = AuditChainHead.objects.get(key="global")
    assert head.length == AuditEvent.objects.count() and head.head_event_id == AuditEvent.objects.latest("seq").pk
    assert MetricFold.objects.get(key="audit").seq <= head.length
    # The statements of each read are the same at both sizes.
    for read in READS:
        assert result[f"{read}_small_statements"] == result[f"{read}_big_statements"] > 0, read
        assert result[f"{read}_ratio_1m_over_10k"] > 0
    assert result["statements_constant"] is True
    assert result["ingest_fold_runs"] >= 2 and result["ingest_with_fold_ratio"] > 0
    assert Call.objects.filter(task__external_id__startswith="fold-").count() == 2 * (20 + 40)

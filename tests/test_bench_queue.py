"""`manage.py bench queue` at a tiny scale, so the benchmark (its COPY loader, its three pages and their checks)
cannot rot: 2,000 calls, 200 of them UNKNOWN, the deep page after 100 rows, 3 requests per page."""

from __future__ import annotations

import pytest
from django.db.models import F

from recovery.devtools.benchmarks.queue import bench_queue
from recovery.devtools.benchmarks.queue_load import BYTES_PER_CALL, disk_check, load
from recovery.models import Attempt, Call, Step, Task, Tool
from tests.conftest import missing_service

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

# What the benchmark figures quote: keep in step with /docs/benchmarks.md's queue row and section and
# recovery/devtools/benchmarks/queue.py.
README_KEYS = (
    "calls", "attempts", "unknown", "tasks", "load_s", "depth",
    *(f"{page}_{which}_{stat}" for page in ("product", "bare", "admin", "admin50") for which in ("first", "deep")
      for stat in ("median_ms", "p95_ms")),
    "ratio_product_bare_first", "ratio_product_bare_deep", "ratio_admin_product_first", "ratio_admin_product_deep",
    "ratio_admin50_product_first", "ratio_admin50_product_deep",
    *(f"statements_{page}_{which}" for page in ("product", "bare", "admin", "admin50") for which in ("first", "deep")),
    "statements_constant", "meets_targets",
)  # fmt: skip


def test_the_queue_benchmark_loads_measures_and_reports():
    result = bench_queue(3, calls=2000, unknown=200)

    assert (result["calls"], result["attempts"], result["unknown"]) == (2000, 6000, 200)
    assert (result["tasks"], result["steps"]) == (500, 1000)
    assert Call.objects.count() == 2000 and Attempt.objects.count() == 6000
    assert Task.objects.count() == 500 and Step.objects.count() == 1000
    assert Call.objects.filter(state="UNKNOWN").count() == 200
    assert not Call.objects.filter(state="UNKNOWN", tool__side_effect="read").exists()
    assert Call.objects.filter(state="UNKNOWN", claimed_by__isnull=False).exists()
    # Every call belongs to its task's tenant, and its attempts are numbered 1..attempts_count.
    assert not Call.objects.exclude(tenant=F("task__tenant")).exists()
    assert all(
        call.attempts_count == len(numbers) and numbers == list(range(1, len(numbers) + 1))
        for call in Call.objects.prefetch_related("attempts")[:200]
        for numbers in [sorted(a.number for a in call.attempts.all())]
    )

    assert result["depth"] == 100 and result["deep_url"].startswith("/queues/unknown/?after=")
    assert result["statements_product_first"] == result["statements_product_deep"]
    assert result["statements_constant"] is True
    assert result["statements_bare_first"] == result["statements_bare_deep"] == 1
    # The call page: its statements the same for the queue's call with the fewest attempts and the one with the most.
    assert result["call_few_attempts"] < result["call_many_attempts"]
    assert result["statements_call_few"] == result["statements_call_many"]
    assert result["call_many_median_ms"] > 0
    # The disk it took, against the estimate the loader checks free space with before it writes anything.
    assert 0 < result["database_bytes_added"] <= result["disk_estimate_bytes"]
    assert result["disk_free_bytes"] is None or result["disk_free_bytes"] > result["disk_estimate_bytes"]
    missing = [key for key in README_KEYS if key not in result]
    assert not missing, missing
    assert all(result[f"{page}_median_ms"] > 0 for page in ("product_first", "bare_deep", "admin_deep"))


def test_a_load_larger_than_the_free_disk_is_refused_before_anything_is_written():
    free = disk_check(1)["disk_free_bytes"]
    if free is None:
        missing_service("needs a local PostgreSQL whose data directory this test can see (the free-space check)")
    too_many = int(free / BYTES_PER_CALL) + 1

    with pytest.raises(ValueError, match=r"needs about .* GB free|GB free") as refused:
        load(too_many)

    assert f"loading {too_many:,} calls needs about" in str(refused.value)
    assert not Call.objects.exists() and not Tool.objects.exists()

"""`manage.py bench otlp` at a tiny scale, so the benchmark cannot rot: one batch of spans in-process and one through
the whole stack, beside as many single shots, every intent committed."""

from __future__ import annotations

import pytest

from recovery.devtools.benchmarks.otlp import BATCH, bench_otlp
from recovery.models import Call, ObservedSpan

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_otlp_benchmark_records_every_span_as_a_committed_observed_call():
    result = bench_otlp(BATCH)

    assert result["count"] == BATCH
    for key in ("single_shots_per_s", "spans_per_s", "spans_http_per_s", "ratio_spans_to_single_shots"):
        assert result[key] > 0, key
    assert 0 < result["statements_per_single_shot"] < result["statements_per_span"]
    # warm-up, in-process, through HTTP, and the counted batch: four batches of spans, all recorded and committed
    observed = Call.objects.filter(observed=True)
    assert observed.count() == ObservedSpan.objects.count() == 4 * BATCH
    assert set(observed.values_list("state", flat=True)) == {"COMMITTED"}

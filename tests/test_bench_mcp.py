"""`manage.py bench mcp` at a tiny scale, so the benchmark cannot rot: every case measured both ways, sequentially and
with concurrent sessions, against real servers (mcp-server-git and our 50 ms server), and what went through the
gateway recorded as calls."""

from __future__ import annotations

import pytest

from recovery.devtools.benchmarks.mcp import bench_mcp
from recovery.models import Call, McpCall

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("mcp_servers")]

CASES = ("git_create_branch (write)", "sleep_read 50 ms (read)")


def test_the_mcp_benchmark_measures_each_case_both_ways_and_records_every_gateway_call():
    result = bench_mcp(2, sessions=2, per_session=1, only=CASES)

    assert result["benchmark"] == "mcp" and list(result["cases"]) == list(CASES)
    for name, case in result["cases"].items():
        for mode, calls in (("sequential", 2), ("2_sessions", 2)):
            figures = case[mode]
            assert figures["calls"] == calls, (name, mode)
            for key in ("direct_median_ms", "gateway_median_ms", "direct_p95_ms", "gateway_p95_ms", "ratio_median"):
                assert figures[key] > 0, (name, mode, key)
            assert figures["gateway_p95_ms"] >= figures["gateway_median_ms"]
            assert figures["gateway_cpu_ms_per_call"] > 0
        assert case["statements_per_call"] > 5, name  # registered, admitted, reported: each a transaction
    # the 50 ms tool takes its 50 ms directly, and no less through the gateway
    for name in CASES[1:]:
        assert result["cases"][name]["sequential"]["direct_median_ms"] >= 50
        assert result["cases"][name]["sequential"]["gateway_median_ms"] >= 50
    # each case through the gateway: 3 warm-up and 4 measured calls, then 2 + 10 counting statements; all committed
    assert Call.objects.count() == McpCall.objects.count() == 2 * (3 + 2 + 2 + 2 + 10)
    assert set(Call.objects.values_list("state", flat=True)) == {"COMMITTED"}

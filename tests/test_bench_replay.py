"""`manage.py bench replay` at a tiny scale, so the benchmark (its stage, the probe, both cases and their report)
cannot rot: 2 intents per case (at the sandbox's own speed and with its refunds held 400 ms), the probed key aged
2 s (the cases' replays are younger)."""

from __future__ import annotations

import math

import pytest
from recovery_client.runtime import LONG_POLL_MS

from recovery.devtools.benchmarks.replay import bench_replay
from recovery.models import Call, DuplicateProbe, Tool

pytestmark = pytest.mark.django_db(transaction=True)

# What the benchmark figures quote: keep in step with /docs/benchmarks.md's replay rows and
# recovery/devtools/benchmarks/replay.py.
CASE_KEYS = (
    "intents", "committed", "product_median_ms", "product_p95_ms", "bare_median_ms", "bare_p95_ms", "ratio_median",
    "ratio_p95", "duplicates", "people", "settled_by", "status_checks", "write_requests_per_intent",
    "round_trip_median_ms", "breakdown_median_ms",
)  # fmt: skip


def test_the_replay_benchmark_proves_the_tool_then_settles_both_cases_without_duplicates_or_people():
    result = bench_replay(2, probe_key_age_s=2)

    probe = result["probe"]
    assert (probe["decision"], probe["retry_path"], probe["observed_effects"]) == ("retry_path_safe", "safe", 1)
    assert probe["key_age_s"] >= 2 and DuplicateProbe.objects.count() == 1
    assert Tool.objects.get(name="refund.create").retry_path == "safe"
    lost, down = result["reply_lost"], result["status_down"]
    slow_lost, slow_down = result["reply_lost-400ms"], result["status_down-400ms"]
    for case in (lost, down, slow_lost, slow_down):
        missing = [key for key in CASE_KEYS if key not in case]
        assert not missing, missing
        assert case["intents"] == case["committed"] == 2 and case["outcomes"] == {"committed": 2}
        assert (case["duplicates"], case["bare_duplicates"], case["people"]) == (0, 0, 0)
        assert case["effects"] == case["bare_effects"] == case["bare_settled"] == 2
        assert case["bare_write_requests_per_intent"] == 2  # the lost reply, then the same key once more
        assert case["ratio_median"] > 0 and case["product_median_ms"] > 0
        # The runtime waits on a long poll: one read after its report, then one request per change of the call
        # (UNKNOWN → COMMITTED; with the status API down, UNKNOWN → STILL_UNKNOWN → COMMITTED), and one more per
        # LONG_POLL_MS a slow check (a worker still starting) keeps it waiting — never a poll loop.
        changes = 2 if case is down or case is slow_down else 1
        patience = math.ceil(case["product_p95_ms"] / LONG_POLL_MS)
        assert case["round_trips_per_intent"]["get_call"] <= 1 + changes + patience, case
    # The status query settles a lost reply with no second request; with the status API down, the one replay does.
    for quick, slow in ((lost, slow_lost), (down, slow_down)):
        assert quick["settled_by"] == slow["settled_by"] and slow["bare_median_ms"] >= 2 * 400  # two held requests
    assert lost["settled_by"] == {"poll": 2} and lost["write_requests_per_intent"] == 1
    assert down["settled_by"] == {"idempotent_replay": 2} and down["write_requests_per_intent"] == 2
    assert set(down["status_checks"]) <= {"failed", "unreachable"}
    assert Call.objects.filter(state="COMMITTED").count() == 9  # the probe's refund and the eight intents
    assert set(result["meets_target"]) == {"reply_lost", "status_down", "reply_lost-400ms", "status_down-400ms"}

"""Data migrations, run forward and back on the test database: what they rewrite, and that nothing else moves."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("recovery", "0013_audit_heads_move_by_many")
AFTER = ("recovery", "0014_call_max_attempts_none")


def _migrate(target: tuple[str, str]):
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    return MigrationExecutor(connection).loader.project_state([target]).apps


def test_0014_stores_no_attempt_limit_as_null_and_back():
    apps = _migrate(BEFORE)
    try:
        tenant = apps.get_model("recovery", "Tenant").objects.create(name="m-tenant")
        provider = apps.get_model("recovery", "Provider").objects.create(name="m-provider", base_url="http://m")
        tool = apps.get_model("recovery", "Tool").objects.create(name="m.tool", provider=provider, side_effect="read")
        task = apps.get_model("recovery", "Task").objects.create(tenant=tenant, external_id="m", agent="m", goal="m")
        step = apps.get_model("recovery", "Step").objects.create(task=task, index=1)
        Call = apps.get_model("recovery", "Call")
        common = {"tenant": tenant, "task": task, "step": step, "tool": tool, "side_effect": "read", "risk": "low"}
        unlimited = Call.objects.create(idempotency_key="k-none", max_attempts=1_000_000, **common).pk
        limited = Call.objects.create(idempotency_key="k-three", max_attempts=3, **common).pk

        Call = _migrate(AFTER).get_model("recovery", "Call")
        assert Call.objects.get(pk=unlimited).max_attempts is None
        assert Call.objects.get(pk=limited).max_attempts == 3

        Call = _migrate(BEFORE).get_model("recovery", "Call")  # and back: the old spelling again
        assert Call.objects.get(pk=unlimited).max_attempts == 1_000_000
        assert Call.objects.get(pk=limited).max_attempts == 3
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes("recovery")[0])


def test_0023_adds_every_tools_sum_to_rollups_folded_before_it_and_back():
    before, after = ("recovery", "0022_drop_audit_unknown_flow_idx"), ("recovery", "0023_metric_rollup_all_tools")
    apps = _migrate(before)
    try:
        Rollup = apps.get_model("recovery", "MetricRollup")
        hour = 1_700_000_000 // 3600 * 3600
        for tenant, tool, series, label, n in [
            (0, 3, "attempts", "committed", 5),
            (0, 4, "attempts", "committed", 2),
            (0, 4, "attempts", "failed", 1),
            (7, 3, "attempts", "committed", 5),
            (0, 0, "task_outcomes", "completed", 4),
        ]:
            Rollup.objects.create(
                period=3600, start=hour, tenant_id=tenant, tool_id=tool, series=series, label=label, value=n
            )

        Rollup = _migrate(after).get_model("recovery", "MetricRollup")
        summed = Rollup.objects.filter(tool_id=-1, period=3600, start=hour)
        sums = {(r.tenant_id, r.series, r.label): r.value for r in summed}
        assert sums == {
            (0, "attempts", "committed"): 7,
            (0, "attempts", "failed"): 1,
            (7, "attempts", "committed"): 5,
            (0, "task_outcomes", "completed"): 4,
        }
        assert Rollup.objects.exclude(tool_id=-1).count() == 5  # the per-tool rows as they were

        Rollup = _migrate(before).get_model("recovery", "MetricRollup")
        assert not Rollup.objects.filter(tool_id=-1).exists() and Rollup.objects.count() == 5
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes("recovery")[0])

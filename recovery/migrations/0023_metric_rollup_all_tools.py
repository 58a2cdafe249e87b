"""Every tool's sum in the rollups (tool_id -1, recovery.engine.metrics.ALL_TOOLS): a page without a tool filter reads
one row per point and label instead of one per tool, so its cost does not grow with the number of tools. Rollups
folded before this migration get their sums here, from their per-tool rows."""

from django.db import migrations, models
from django.db.models import Sum

ALL_TOOLS = -1  # recovery.engine.metrics.ALL_TOOLS, as of this migration


def add_every_tools_sum(apps, schema_editor):
    MetricRollup = apps.get_model("recovery", "MetricRollup")
    sums = (
        MetricRollup.objects.exclude(tool_id=ALL_TOOLS)
        .values_list("period", "start", "tenant_id", "series", "label")
        .annotate(n=Sum("value"))
        .order_by("period", "start", "tenant_id", "series", "label")
    )
    batch = []
    for period, start, tenant_id, series, label, n in sums.iterator(chunk_size=2000):
        batch.append(
            MetricRollup(
                period=period, start=start, tenant_id=tenant_id, tool_id=ALL_TOOLS, series=series, label=label, value=n
            )
        )
        if len(batch) == 2000:
            MetricRollup.objects.bulk_create(batch)
            batch = []
    MetricRollup.objects.bulk_create(batch)


def remove_every_tools_sum(apps, schema_editor):
    apps.get_model("recovery", "MetricRollup").objects.filter(tool_id=ALL_TOOLS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0022_drop_audit_unknown_flow_idx"),
    ]

    operations = [
        migrations.AlterField(
            model_name="metricrollup",
            name="tool_id",
            field=models.IntegerField(default=0),
        ),
        migrations.RunPython(add_every_tools_sum, remove_every_tools_sum),
    ]

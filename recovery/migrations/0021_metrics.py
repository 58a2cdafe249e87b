# Metrics (docs/metrics.md): rollups folded from the audit sequence, their watermark and per-call marks; token scopes.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0020_breaker_operations"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricCallMark",
            fields=[
                (
                    "call",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="recovery.call",
                    ),
                ),
                ("cohort", models.BigIntegerField(null=True)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("unknown", models.BooleanField(default=False)),
                ("settled", models.BooleanField(default=False)),
                ("human", models.BooleanField(default=False)),
                ("duplicate", models.BooleanField(default=False)),
                ("committed", models.BooleanField(default=False)),
                ("queue", models.CharField(blank=True, max_length=16)),
                ("queue_since", models.DateTimeField(null=True)),
            ],
        ),
        migrations.CreateModel(
            name="MetricFold",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=16, unique=True)),
                ("seq", models.BigIntegerField(default=0)),
                ("open_breakers", models.JSONField(blank=True, default=dict)),
                ("events", models.BigIntegerField(default=0)),
                ("folded_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.AddField(
            model_name="apitoken",
            name="scope",
            field=models.CharField(
                choices=[("runtime", "Runtime"), ("metrics", "Metrics")], default="runtime", max_length=16
            ),
        ),
        migrations.CreateModel(
            name="MetricRollup",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("period", models.PositiveIntegerField()),
                ("start", models.BigIntegerField()),
                ("tenant_id", models.PositiveIntegerField(default=0)),
                ("tool_id", models.PositiveIntegerField(default=0)),
                ("series", models.CharField(max_length=32)),
                ("label", models.CharField(blank=True, max_length=100)),
                ("value", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("period", "tenant_id", "start", "tool_id", "series", "label"), name="metric_rollup_key"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="MetricTotal",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("tenant_id", models.PositiveIntegerField(default=0)),
                ("tool_id", models.PositiveIntegerField(default=0)),
                ("series", models.CharField(max_length=32)),
                ("label", models.CharField(blank=True, max_length=100)),
                ("value", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("tenant_id", "tool_id", "series", "label"), name="metric_total_key")
                ],
            },
        ),
    ]

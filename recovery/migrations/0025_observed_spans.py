"""OpenTelemetry trace ingest (docs/otlp-ingest.md): calls marked observed, the spans as received (stored
once per trace and span id), the tools each runtime was seen calling, and the per-tenant count of ignored spans.
SQLite rebuilds the call table to add its column, which loses its guards: they are dropped first and installed again
after, as in 0012 and 0014."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

from recovery.migrations._frozen_guards import install, uninstall


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0024_call_backlog_idx"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ObservedSpan",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("trace_id", models.CharField(max_length=32)),
                ("span_id", models.CharField(max_length=16)),
                ("agent", models.CharField(max_length=200)),
                ("tool_name", models.CharField(max_length=200)),
                ("tool_call_id", models.CharField(blank=True, max_length=200)),
                ("idempotency_key", models.CharField(blank=True, max_length=255)),
                ("has_arguments", models.BooleanField(default=False)),
                (
                    "outcome",
                    models.CharField(
                        choices=[
                            ("recorded", "Recorded"),
                            ("possible_duplicate", "Possible Duplicate"),
                            ("protected", "Protected"),
                            ("unknown_tool", "Unknown Tool"),
                        ],
                        max_length=24,
                    ),
                ),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("received_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.CreateModel(
            name="ObservedTally",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("spans_ignored", models.PositiveBigIntegerField(default=0)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.CreateModel(
            name="ObservedTool",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("agent", models.CharField(max_length=200)),
                ("tool_name", models.CharField(max_length=200)),
                ("spans", models.PositiveBigIntegerField(default=0)),
                ("last_seen_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.RunPython(uninstall, migrations.RunPython.noop),
        migrations.AddField(
            model_name="call",
            name="observed",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(install, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="call",
            index=models.Index(
                condition=models.Q(("observed", True)),
                fields=["tenant", "tool", "fingerprint"],
                name="call_observed_intent_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(fields=["tenant", "agent"], name="task_tenant_agent_idx"),
        ),
        migrations.AddField(
            model_name="observedspan",
            name="attempt",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="recovery.attempt",
            ),
        ),
        migrations.AddField(
            model_name="observedspan",
            name="call",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="observed_spans",
                to="recovery.call",
            ),
        ),
        migrations.AddField(
            model_name="observedspan",
            name="task",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="observed_spans", to="recovery.task"
            ),
        ),
        migrations.AddField(
            model_name="observedspan",
            name="tenant",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="+", to="recovery.tenant"
            ),
        ),
        migrations.AddField(
            model_name="observedtally",
            name="tenant",
            field=models.OneToOneField(
                on_delete=django.db.models.deletion.PROTECT, related_name="+", to="recovery.tenant"
            ),
        ),
        migrations.AddField(
            model_name="observedtool",
            name="tenant",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="+", to="recovery.tenant"
            ),
        ),
        migrations.AddField(
            model_name="observedtool",
            name="tool",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+", to="recovery.tool"
            ),
        ),
        migrations.AddIndex(
            model_name="observedspan",
            index=models.Index(fields=["task", "started_at"], name="observed_span_task_idx"),
        ),
        migrations.AddConstraint(
            model_name="observedspan",
            constraint=models.UniqueConstraint(fields=("tenant", "trace_id", "span_id"), name="observed_span_unique"),
        ),
        migrations.AddConstraint(
            model_name="observedtool",
            constraint=models.UniqueConstraint(fields=("tenant", "agent", "tool_name"), name="observed_tool_unique"),
        ),
    ]

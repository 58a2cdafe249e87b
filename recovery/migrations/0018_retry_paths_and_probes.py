"""Duplicate probes and replay reconciliation (docs/replay.md).

A tool's retry path becomes tri-state (unprobed / safe / unsafe) from its latest probe: the old boolean defaulted to
true, which counted a tool nobody had probed as safe. A tool an admin had switched off stays unsafe; every other tool
is unprobed until a probe runs. The call gains the durable mark of its one replay reconciliation (a nullable column:
SQLite adds it in place, the call's guards stay); the tool remembers whether its registry entry named its key
retention (replay reconciliation needs an explicit one)."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def to_tri_state(apps, schema_editor):
    Tool = apps.get_model("recovery", "Tool")
    Tool.objects.filter(retry_path_safe=False).update(retry_path="unsafe")


def to_boolean(apps, schema_editor):
    Tool = apps.get_model("recovery", "Tool")
    Tool.objects.filter(retry_path="unsafe").update(retry_path_safe=False)


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0017_sagas"),
    ]

    operations = [
        migrations.AddField(
            model_name="call",
            name="replay_reconciled_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="tool",
            name="key_retention_declared",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="tool",
            name="retry_path",
            field=models.CharField(
                choices=[("unprobed", "Unprobed"), ("safe", "Safe"), ("unsafe", "Unsafe")],
                default="unprobed",
                max_length=8,
            ),
        ),
        migrations.RunPython(to_tri_state, to_boolean),
        migrations.RemoveField(
            model_name="tool",
            name="retry_path_safe",
        ),
        migrations.AddField(
            model_name="tool",
            name="retry_path_base_url",
            field=models.URLField(blank=True, max_length=500),
        ),
        migrations.AddField(
            model_name="tool",
            name="retry_path_changed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="tool",
            name="retry_path_key_age_s",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="tool",
            name="retry_path_reason",
            field=models.TextField(blank=True),
        ),
        migrations.AlterField(
            model_name="compensationreceipt",
            name="source",
            field=models.CharField(
                choices=[
                    ("poll", "Poll"),
                    ("callback", "Callback"),
                    ("runtime", "Runtime"),
                    ("operator", "Operator"),
                    ("idempotent_replay", "Idempotent Replay"),
                ],
                max_length=24,
            ),
        ),
        migrations.AlterField(
            model_name="receipt",
            name="source",
            field=models.CharField(
                choices=[
                    ("poll", "Poll"),
                    ("callback", "Callback"),
                    ("runtime", "Runtime"),
                    ("operator", "Operator"),
                    ("idempotent_replay", "Idempotent Replay"),
                ],
                max_length=24,
            ),
        ),
        migrations.CreateModel(
            name="DuplicateProbe",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("idempotency_key", models.CharField(max_length=255)),
                ("key_age_s", models.PositiveIntegerField()),
                ("provider_base_url", models.URLField(max_length=500)),
                ("first", models.CharField(max_length=32)),
                ("second", models.CharField(max_length=32)),
                ("http_status", models.PositiveIntegerField(blank=True, null=True)),
                ("first_business_id", models.CharField(blank=True, max_length=255)),
                ("second_business_id", models.CharField(blank=True, max_length=255)),
                ("expected_effects", models.PositiveIntegerField(default=1)),
                ("observed_effects", models.PositiveIntegerField(blank=True, null=True)),
                ("downstream_audit", models.CharField(max_length=32)),
                (
                    "decision",
                    models.CharField(
                        choices=[
                            ("retry_path_safe", "Safe"),
                            ("retry_path_unsafe", "Unsafe"),
                            ("inconclusive", "Inconclusive"),
                        ],
                        max_length=24,
                    ),
                ),
                ("detail", models.TextField()),
                ("request", models.JSONField(blank=True, default=dict)),
                ("response", models.JSONField(blank=True, default=dict)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "action",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="recovery.actionrequest",
                    ),
                ),
                (
                    "call",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="duplicate_probes", to="recovery.call"
                    ),
                ),
                (
                    "tool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="duplicate_probes", to="recovery.tool"
                    ),
                ),
            ],
        ),
        migrations.AddField(
            model_name="tool",
            name="retry_path_probe",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="recovery.duplicateprobe",
            ),
        ),
        migrations.AddIndex(
            model_name="duplicateprobe",
            index=models.Index(fields=["tool", "created_at"], name="probe_tool_idx"),
        ),
        migrations.AddIndex(
            model_name="duplicateprobe",
            index=models.Index(fields=["call", "created_at"], name="probe_call_idx"),
        ),
    ]

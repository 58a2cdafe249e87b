"""Compensation ledgers (docs/compensation.md): an entry per undo of a committed effect, with its own key, states,
attempts and receipts; its states are guarded by a trigger generated from recovery/engine/compensation_states.py
(frozen as SQL in _frozen_guards.py), as calls' are. Tools gain `refusal_codes`: provider codes that mean "refused, nothing
executed"."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

from recovery.migrations._frozen_guards import install_entry_guard as install


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0014_call_max_attempts_none"),
    ]

    operations = [
        migrations.AddField(
            model_name="tool",
            name="refusal_codes",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.CreateModel(
            name="CompensationEntry",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.PositiveIntegerField()),
                ("idempotency_key", models.CharField(max_length=255)),
                ("arguments", models.JSONField(default=dict)),
                ("target", models.CharField(max_length=300)),
                ("target_version", models.PositiveIntegerField()),
                ("expected_effect", models.CharField(max_length=300)),
                ("expected_effects", models.PositiveIntegerField(default=1)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("sent", "Sent"),
                            ("unknown", "Unknown"),
                            ("not_committed", "Not Committed"),
                            ("committed", "Committed"),
                            ("failed", "Failed"),
                            ("review", "Review"),
                        ],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("version", models.PositiveIntegerField(default=0)),
                ("state_changed_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("attempts_count", models.PositiveIntegerField(default=0)),
                ("max_attempts", models.PositiveIntegerField(blank=True, null=True)),
                ("provider_ref", models.CharField(blank=True, max_length=255)),
                ("provider_status", models.CharField(blank=True, max_length=64)),
                ("effects_observed", models.PositiveIntegerField(blank=True, null=True)),
                ("undone_amount", models.PositiveBigIntegerField(blank=True, null=True)),
                ("outcome", models.CharField(blank=True, max_length=64)),
                ("send_at", models.DateTimeField(blank=True, null=True)),
                ("checks_made", models.PositiveIntegerField(default=0)),
                ("next_check_at", models.DateTimeField(blank=True, null=True)),
                ("last_receipt_at", models.DateTimeField(blank=True, null=True)),
                ("lease_owner", models.CharField(blank=True, max_length=100)),
                ("lease_until", models.DateTimeField(blank=True, null=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "call",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="compensations", to="recovery.call"
                    ),
                ),
                (
                    "requested_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="compensation_entries",
                        to="recovery.actionrequest",
                    ),
                ),
                (
                    "tool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="compensation_entries",
                        to="recovery.tool",
                    ),
                ),
            ],
            options={
                "ordering": ["call", "number"],
            },
        ),
        migrations.CreateModel(
            name="CompensationAttempt",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.PositiveIntegerField()),
                ("request", models.JSONField(default=dict)),
                ("facts", models.JSONField(blank=True, default=dict)),
                ("http_status", models.PositiveIntegerField(blank=True, null=True)),
                ("error_kind", models.CharField(blank=True, max_length=32)),
                ("error_code", models.CharField(blank=True, max_length=100)),
                ("provider_ref", models.CharField(blank=True, max_length=255)),
                ("row", models.CharField(blank=True, max_length=16)),
                ("label", models.CharField(blank=True, max_length=64)),
                ("state_after", models.CharField(blank=True, max_length=16)),
                ("sent_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "entry",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="attempts",
                        to="recovery.compensationentry",
                    ),
                ),
            ],
            options={
                "ordering": ["entry", "number"],
            },
        ),
        migrations.CreateModel(
            name="CompensationReceipt",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "source",
                    models.CharField(
                        choices=[
                            ("poll", "Poll"),
                            ("callback", "Callback"),
                            ("runtime", "Runtime"),
                            ("operator", "Operator"),
                        ],
                        max_length=16,
                    ),
                ),
                (
                    "observed",
                    models.CharField(
                        choices=[
                            ("committed", "Committed"),
                            ("not_committed", "Not Committed"),
                            ("pending", "Pending"),
                            ("failed", "Failed"),
                            ("ambiguous", "Ambiguous"),
                            ("unreachable", "Unreachable"),
                        ],
                        max_length=16,
                    ),
                ),
                ("provider_status", models.CharField(blank=True, max_length=64)),
                ("provider_ref", models.CharField(blank=True, max_length=255)),
                ("effects_observed", models.PositiveIntegerField(blank=True, null=True)),
                ("request", models.JSONField(blank=True, default=dict)),
                ("response", models.JSONField(blank=True, default=dict)),
                ("http_status", models.PositiveIntegerField(blank=True, null=True)),
                ("state_before", models.CharField(max_length=16)),
                ("state_after", models.CharField(max_length=16)),
                ("applied", models.BooleanField(default=False)),
                ("evidence", models.JSONField(blank=True, default=dict)),
                ("checked_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "entry",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="receipts",
                        to="recovery.compensationentry",
                    ),
                ),
            ],
            options={
                "ordering": ["entry", "checked_at", "id"],
            },
        ),
        migrations.AddIndex(
            model_name="compensationentry",
            index=models.Index(
                condition=models.Q(("state", "unknown")), fields=["next_check_at"], name="compensation_due_check_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="compensationentry",
            index=models.Index(fields=["state", "state_changed_at"], name="compensation_state_idx"),
        ),
        migrations.AddConstraint(
            model_name="compensationentry",
            constraint=models.UniqueConstraint(fields=("call", "number"), name="compensation_unique_number"),
        ),
        migrations.AddConstraint(
            model_name="compensationentry",
            constraint=models.UniqueConstraint(fields=("tool", "idempotency_key"), name="compensation_unique_key"),
        ),
        migrations.AddConstraint(
            model_name="compensationentry",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state__in", ["not_committed", "pending", "review", "sent", "unknown"])),
                fields=("call",),
                name="compensation_one_open_per_call",
            ),
        ),
        migrations.AddConstraint(
            model_name="compensationattempt",
            constraint=models.UniqueConstraint(fields=("entry", "number"), name="compensation_attempt_unique"),
        ),
        migrations.AddIndex(
            model_name="compensationreceipt",
            index=models.Index(fields=["entry", "checked_at"], name="compensation_receipt_idx"),
        ),
        migrations.RunPython(install, migrations.RunPython.noop),
    ]

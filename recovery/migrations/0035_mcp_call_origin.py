# Where a call through the MCP gateway came from (docs/mcp-gateway.md, "The console's view"), and the holds' index.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0034_notify_cancelled"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="McpCall",
            fields=[
                (
                    "call",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        primary_key=True,
                        related_name="mcp_origin",
                        serialize=False,
                        to="recovery.call",
                    ),
                ),
                ("server", models.CharField(max_length=100)),
                ("tool", models.CharField(max_length=200)),
                ("client_name", models.CharField(blank=True, max_length=200)),
                ("client_version", models.CharField(blank=True, max_length=100)),
                (
                    "identity_source",
                    models.CharField(
                        choices=[
                            ("meta", "named in _meta"),
                            ("traceparent", "the W3C traceparent's trace"),
                            ("session", "the legacy MCP session"),
                            ("pair", "the (token, client name) pair"),
                        ],
                        max_length=16,
                    ),
                ),
                ("session_id", models.CharField(blank=True, max_length=100)),
                ("request", models.JSONField(default=dict)),
                ("reissues_absorbed", models.PositiveIntegerField(default=0)),
                ("last_reissue_at", models.DateTimeField(blank=True, null=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.AddIndex(
            model_name="gatedecision",
            index=models.Index(
                condition=models.Q(("allowed", False), ("dry_run", False), ("reason", "approval_required")),
                fields=["created_at"],
                name="gate_hold_created_idx",
            ),
        ),
        migrations.AddField(
            model_name="mcpcall",
            name="tenant",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="+", to="recovery.tenant"
            ),
        ),
        migrations.AddIndex(
            model_name="mcpcall",
            index=models.Index(fields=["tenant", "created_at"], name="mcpcall_tenant_created_idx"),
        ),
    ]

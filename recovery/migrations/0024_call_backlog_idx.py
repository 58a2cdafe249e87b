"""The open backlog's covering index (recovery.models.Call.Meta): the overview's and the queue sizes' counts read it
alone, so they cost what the backlog holds, never a read of each open call's row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0023_metric_rollup_all_tools"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="call",
            index=models.Index(
                condition=models.Q(
                    (
                        "state__in",
                        ["UNKNOWN", "STILL_UNKNOWN", "HUMAN_REVIEW", "PARTIAL_COMPENSATED", "COMPENSATION_FAILED"],
                    )
                ),
                fields=["state", "risk", "state_changed_at", "tool", "tenant", "id"],
                name="call_backlog_idx",
            ),
        ),
    ]

"""The compensation problems queue (docs/console.md): its three call states in page order, one partial index, so a page
reads its rows from the small set of calls being or having been compensated and stops, as the UNKNOWN queue's does
(0009). The entries each candidate needs are found by the (call, number) unique index of 0015."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0015_compensation_ledger"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name="call",
            index=models.Index(
                condition=models.Q(("state__in", ["COMPENSATING", "PARTIAL_COMPENSATED", "COMPENSATION_FAILED"])),
                fields=["state_changed_at", "id"],
                name="call_compensation_queue_idx",
            ),
        ),
    ]

# The overview reads its UNKNOWN flow from the metrics rollups now: the partial index that served its audit scan goes (one index less to write per audit event).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0021_metrics"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="auditevent",
            name="audit_unknown_flow_idx",
        ),
    ]

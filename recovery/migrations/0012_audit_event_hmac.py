"""Audit events carry an HMAC under a key kept outside the database (docs/design/audit.md). Events written before
have none and verify as "unkeyed". SQLite rebuilds the table to add the columns: its guards are dropped first (another
table's trigger naming it would stop the rebuild) and installed again after."""

from django.db import migrations, models

from recovery.migrations._frozen_guards import install, uninstall


class Migration(migrations.Migration):
    dependencies = [("recovery", "0011_action_requests")]

    operations = [
        migrations.RunPython(uninstall, migrations.RunPython.noop),
        migrations.AddField(model_name="auditevent", name="key_id", field=models.CharField(blank=True, max_length=32)),
        migrations.AddField(model_name="auditevent", name="hmac", field=models.CharField(blank=True, max_length=64)),
        migrations.RunPython(install, migrations.RunPython.noop),
    ]

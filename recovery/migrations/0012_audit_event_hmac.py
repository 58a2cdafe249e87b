"""Audit events carry an HMAC under a key kept outside the database (SPEC §15.6). Events written before have none
and verify as "unkeyed". SQLite rebuilds the table to add the columns: its guards are dropped first (another table's
trigger naming it would stop the rebuild) and installed again after."""

from django.db import migrations, models

from recovery import dbguards


def install(apps, schema_editor):
    dbguards.install(schema_editor)


def uninstall(apps, schema_editor):
    dbguards.uninstall_sqlite(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0011_action_requests")]

    operations = [
        migrations.RunPython(uninstall, migrations.RunPython.noop),
        migrations.AddField(model_name="auditevent", name="key_id", field=models.CharField(blank=True, max_length=32)),
        migrations.AddField(model_name="auditevent", name="hmac", field=models.CharField(blank=True, max_length=64)),
        migrations.RunPython(install, migrations.RunPython.noop),
    ]

"""Audit heads may move forward by several events at once — one UPDATE per transaction instead of one per event —
but never past the events they count: the guards of recovery.dbguards installed again with that rule."""

from django.db import migrations

from recovery import dbguards


def install(apps, schema_editor):
    dbguards.install(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0012_audit_event_hmac")]

    operations = [migrations.RunPython(install, migrations.RunPython.noop)]

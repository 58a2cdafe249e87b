"""Install the database guards of recovery.dbguards: the call state-machine trigger generated from
recovery/states.py, and the append-only triggers of the audit table."""

from django.db import migrations

from recovery import dbguards


def install(apps, schema_editor):
    dbguards.install(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0001_initial")]

    operations = [migrations.RunPython(install, migrations.RunPython.noop)]

"""A call with no attempt limit stores NULL (the engine's None) instead of the 1,000,000 that stood for it, so
"no limit" has one spelling in the database, the engine and the API (`null`). SQLite rebuilds the table to drop
the NOT NULL: its guards are dropped first and installed again after, as in 0012."""

from django.db import migrations, models

from recovery.migrations._frozen_guards import install, uninstall

OLD_NO_LIMIT = 1_000_000  # what call_add stored for "no limit" before this migration


def to_null(apps, schema_editor):
    apps.get_model("recovery", "Call").objects.filter(max_attempts__gte=OLD_NO_LIMIT).update(max_attempts=None)


def to_number(apps, schema_editor):
    apps.get_model("recovery", "Call").objects.filter(max_attempts__isnull=True).update(max_attempts=OLD_NO_LIMIT)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0013_audit_heads_move_by_many")]

    operations = [
        migrations.RunPython(uninstall, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="call",
            name="max_attempts",
            field=models.PositiveIntegerField(blank=True, default=3, null=True),
        ),
        migrations.RunPython(to_null, to_number),
        migrations.RunPython(install, migrations.RunPython.noop),
    ]

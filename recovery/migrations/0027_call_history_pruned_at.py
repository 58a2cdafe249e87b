"""Retention (docs/deploy.md): when a settled call's receipts, gate answers and response bodies were removed.
SQLite rebuilds the call table to add the column, which loses its guards: they are dropped first and installed
again after, as in 0025."""

from django.db import migrations, models

from recovery.migrations._frozen_guards import install, uninstall


class Migration(migrations.Migration):
    dependencies = [("recovery", "0026_tool_key_template")]

    operations = [
        migrations.RunPython(uninstall, install),
        migrations.AddField(
            model_name="call",
            name="history_pruned_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(install, uninstall),
    ]

"""A tool's key template (docs/otlp-ingest.md): how an intent's key derives from the arguments for an OpenTelemetry
span that names no key."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("recovery", "0025_observed_spans")]

    operations = [
        migrations.AddField(
            model_name="tool",
            name="key_template",
            field=models.CharField(blank=True, max_length=200),
        ),
    ]

"""Sagas (docs/compensation.md): a task's saga abort (its state, who executes its compensations, when it was asked), an
entry's executor, a runtime's attempt id on a compensation attempt, the task outcome `compensated`. SQLite rebuilds
the entry table to add a column, which drops its state guard: it is installed again after."""

from django.db import migrations, models

from recovery.migrations._frozen_guards import install_entry_guard as install


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0016_call_compensation_queue_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="compensationattempt",
            name="attempt_id",
            field=models.CharField(blank=True, max_length=100),
        ),
        migrations.AddField(
            model_name="compensationentry",
            name="executor",
            field=models.CharField(default="console", max_length=16),
        ),
        migrations.AddField(
            model_name="task",
            name="saga",
            field=models.CharField(blank=True, max_length=16),
        ),
        migrations.AddField(
            model_name="task",
            name="saga_executor",
            field=models.CharField(blank=True, max_length=16),
        ),
        migrations.AddField(
            model_name="task",
            name="saga_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="task",
            name="outcome",
            field=models.CharField(
                blank=True,
                choices=[
                    ("completed", "Completed"),
                    ("completed_with_unknowns", "Completed With Unknowns"),
                    ("failed", "Failed"),
                    ("degraded", "Degraded"),
                    ("abandoned", "Abandoned"),
                    ("compensated", "Compensated"),
                ],
                max_length=32,
            ),
        ),
        migrations.RunPython(install, migrations.RunPython.noop),
    ]

"""Sagas (docs/compensation.md): a task's saga abort (its state, who executes its compensations, when it was asked), an
entry's executor, a runtime's attempt id on a compensation attempt, the task outcome `compensated`. SQLite rebuilds
the entry table to add a column, which drops its state guard: it is installed again after."""

from django.db import migrations, models

# The compensation entries' state guard frozen as SQL, per database vendor: what install_entry_guard() of
# recovery/statemachine/dbguards.py generated when this migration was frozen (from the edges of
# recovery/engine/compensation_states.py). A migration must not change with the code: a later change to the guard or
# the state table is a new migration with its own frozen copy.
ENTRY_GUARD = {
    "postgresql": [
        """
        CREATE OR REPLACE FUNCTION recovery_entry_state_guard() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.state IS DISTINCT FROM OLD.state THEN
                IF NEW.version IS DISTINCT FROM OLD.version + 1 THEN
                    RAISE EXCEPTION 'compensation %: state change % -> % must bump version by one (% -> %)',
                        OLD.id, OLD.state, NEW.state, OLD.version, NEW.version USING ERRCODE = 'check_violation';
                END IF;
                IF NOT (OLD.state || '>' || NEW.state = ANY (ARRAY['not_committed>failed', 'not_committed>sent', 'pending>failed', 'pending>sent', 'review>committed', 'review>failed', 'sent>committed', 'sent>failed', 'sent>not_committed', 'sent>review', 'sent>unknown', 'unknown>committed', 'unknown>failed', 'unknown>not_committed', 'unknown>review'])) THEN
                    RAISE EXCEPTION 'compensation %: illegal state change % -> %', OLD.id, OLD.state, NEW.state
                        USING ERRCODE = 'check_violation';
                END IF;
            ELSIF NEW.version IS DISTINCT FROM OLD.version THEN
                RAISE EXCEPTION 'compensation %: version changes only with the state', OLD.id
                    USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END $$;
        """,
        "DROP TRIGGER IF EXISTS recovery_entry_state_guard ON recovery_compensationentry",
        """
        CREATE TRIGGER recovery_entry_state_guard BEFORE UPDATE OF state, version ON recovery_compensationentry
        FOR EACH ROW EXECUTE FUNCTION recovery_entry_state_guard()
        """,
    ],
    "sqlite": [
        "DROP TRIGGER IF EXISTS recovery_entry_state_edge",
        """
        CREATE TRIGGER recovery_entry_state_edge BEFORE UPDATE OF state ON recovery_compensationentry
        FOR EACH ROW WHEN NEW.state IS NOT OLD.state AND (OLD.state || '>' || NEW.state) NOT IN ('not_committed>failed', 'not_committed>sent', 'pending>failed', 'pending>sent', 'review>committed', 'review>failed', 'sent>committed', 'sent>failed', 'sent>not_committed', 'sent>review', 'sent>unknown', 'unknown>committed', 'unknown>failed', 'unknown>not_committed', 'unknown>review')
        BEGIN SELECT RAISE(ABORT, 'illegal compensation state change: not an edge of the state table'); END
        """,
        "DROP TRIGGER IF EXISTS recovery_entry_state_version",
        """
        CREATE TRIGGER recovery_entry_state_version BEFORE UPDATE OF state, version ON recovery_compensationentry
        FOR EACH ROW WHEN (NEW.state IS NOT OLD.state AND NEW.version IS NOT OLD.version + 1)
                       OR (NEW.state IS OLD.state AND NEW.version IS NOT OLD.version)
        BEGIN SELECT RAISE(ABORT, 'compensation version must rise by exactly one with each state change'); END
        """,
    ],
}


def install(apps, schema_editor):
    """Install (or replace) the entries' state guard on the migration's connection."""
    vendor = schema_editor.connection.vendor
    if vendor not in ENTRY_GUARD:
        raise RuntimeError(f"no database guards for {vendor}: only PostgreSQL and SQLite are supported")
    for statement in ENTRY_GUARD[vendor]:
        schema_editor.execute(statement, params=None)  # None: '%' in PL/pgSQL is not a placeholder


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

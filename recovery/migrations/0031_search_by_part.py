"""Trigram indexes for searching the queues by part of a task's external id or a call's idempotency key
(docs/console.md, "Search"): on PostgreSQL only (pg_trgm is a trusted extension: the database's owner may create
it); the embedded SQLite database scans, which its size allows."""

from django.db import migrations

INDEXES = (
    ("recovery_task_external_id_trgm", "recovery_task", "external_id"),
    ("recovery_call_idempotency_key_trgm", "recovery_call", "idempotency_key"),
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # Raw DDL, not django.contrib.postgres's GinIndex in the models' Meta: a model index would be built on the
    # embedded SQLite too, which has no GIN nor trigrams; the queries stay the ORM's (`__contains`).
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    for name, table, column in INDEXES:
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} USING gin ({column} gin_trgm_ops)")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _table, _column in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0030_provider_wire_format"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]

"""Audit heads may move forward by several events at once — one UPDATE per transaction instead of one per event —
but never past the events they count: the database guards installed again with that rule (frozen as SQL in _frozen_guards.py)."""

from django.db import migrations

from recovery.migrations._frozen_guards import install


class Migration(migrations.Migration):
    dependencies = [("recovery", "0012_audit_event_hmac")]

    operations = [migrations.RunPython(install, migrations.RunPython.noop)]

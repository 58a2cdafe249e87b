"""Install the database guards (recovery/statemachine/dbguards.py, frozen as SQL in _frozen_guards.py): the call state-machine
trigger generated from recovery/engine/states.py, and the append-only triggers of the audit table."""

from django.db import migrations

from recovery.migrations._frozen_guards import install


class Migration(migrations.Migration):
    dependencies = [("recovery", "0001_initial")]

    operations = [migrations.RunPython(install, migrations.RunPython.noop)]

"""The four role groups with their permissions, and the audit heads every append locks (global first)."""

from django.db import migrations
from django.utils import timezone

from recovery.migrations._frozen_roles import sync_roles


def create_roles(apps, schema_editor):
    sync_roles(apps)


def create_heads(apps, schema_editor):
    AuditChainHead = apps.get_model("recovery", "AuditChainHead")
    for key in ("global", "system"):
        AuditChainHead.objects.get_or_create(key=key, defaults={"updated_at": timezone.now()})


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0002_database_guards"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(create_roles, migrations.RunPython.noop),
        migrations.RunPython(create_heads, migrations.RunPython.noop),
    ]

"""The four roles of docs/design/README.md as Django groups with explicit permissions, synced on every migrate.
A migration that changes this table freezes its own copy of the table and of `sync_roles` (docs/architecture.md).
"""

from __future__ import annotations

VIEWER, REVIEWER, APPROVER, ADMIN = "viewer", "reviewer", "approver", "admin"
ROLES = (VIEWER, REVIEWER, APPROVER, ADMIN)

# Models every role may read. Diagnostics (raw failure detail, redacted) are for reviewers and above.
_READABLE = (
    "tenant", "provider", "tool", "task", "step", "call", "attempt", "decision", "gatedecision", "receipt",
    "auditevent", "auditchainhead", "drillrun", "actionrequest",
)  # fmt: skip
_REGISTRY = ("tenant", "provider", "tool", "apitoken")
_NOTIFICATIONS = ("notificationchannel", "notificationrule")  # configured by admins (docs/notifications.md)

_VIEW = [f"recovery.view_{model}" for model in _READABLE] + ["recovery.export_audit"]

ROLE_PERMISSIONS: dict[str, list[str]] = {
    VIEWER: _VIEW,
    REVIEWER: [*_VIEW, "recovery.view_diagnostic", "recovery.review_call"],
    APPROVER: [*_VIEW, "recovery.view_diagnostic", "recovery.approve_action"],
    ADMIN: _VIEW
    + ["recovery.view_diagnostic", "recovery.verify_audit", "recovery.view_apitoken"]
    + [f"recovery.{verb}_{model}" for model in _REGISTRY for verb in ("add", "change", "delete")]
    + [f"recovery.{verb}_{model}" for model in _NOTIFICATIONS for verb in ("view", "add", "change", "delete")]
    + [f"auth.{verb}_{model}" for model in ("user", "group") for verb in ("view", "add", "change")],
}


def sync_roles(apps) -> None:
    """Create or update the groups so each holds exactly its permissions (usable from a migration)."""
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        # create_permissions skips an app whose models_module is unset (as in a migration's app registry); the
        # real registry's value is put back, or later test-database flushes would stop recreating permissions.
        previous = getattr(app_config, "models_module", None)
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = previous
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for role, names in ROLE_PERMISSIONS.items():
        perms = []
        for name in names:
            app_label, codename = name.split(".")
            if not _model_exists(apps, app_label, codename):
                continue  # its model comes with a later migration, which syncs the roles again
            perms.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(perms)


def _model_exists(apps, app_label: str, codename: str) -> bool:
    """False only for a default permission (view_/add_/change_/delete_<model>) of a model the migration state does
    not have yet; any other name is looked up, so a misspelt permission still fails loudly."""
    verb, _, model = codename.partition("_")
    if verb not in ("view", "add", "change", "delete"):
        return True
    try:
        apps.get_model(app_label, model)
    except LookupError:
        return False
    return True

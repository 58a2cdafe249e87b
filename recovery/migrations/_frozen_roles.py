"""The role table of recovery/models/roles.py (ROLE_PERMISSIONS) and its `sync_roles`, frozen as they stood when the
migrations stopped importing it, for migrations 0003, 0008 and 0011. A default permission (view_/add_/change_/
delete_) of a model a migration's state does not have yet is skipped: 0003 skips view_drillrun and view_actionrequest
(0008 and 0011 sync the roles again), 0008 skips view_actionrequest, 0011 skips nothing.

History: never edit this module. A later change to the roles is a new migration with a frozen copy of its own.
"""

_VIEW = [
    "recovery.view_tenant",
    "recovery.view_provider",
    "recovery.view_tool",
    "recovery.view_task",
    "recovery.view_step",
    "recovery.view_call",
    "recovery.view_attempt",
    "recovery.view_decision",
    "recovery.view_gatedecision",
    "recovery.view_receipt",
    "recovery.view_auditevent",
    "recovery.view_auditchainhead",
    "recovery.view_drillrun",
    "recovery.view_actionrequest",
    "recovery.export_audit",
]
ROLE_PERMISSIONS = {
    "viewer": _VIEW,
    "reviewer": [*_VIEW, "recovery.view_diagnostic", "recovery.review_call"],
    "approver": [*_VIEW, "recovery.view_diagnostic", "recovery.approve_action"],
    "admin": [
        *_VIEW,
        "recovery.view_diagnostic",
        "recovery.verify_audit",
        "recovery.view_apitoken",
        "recovery.add_tenant",
        "recovery.change_tenant",
        "recovery.delete_tenant",
        "recovery.add_provider",
        "recovery.change_provider",
        "recovery.delete_provider",
        "recovery.add_tool",
        "recovery.change_tool",
        "recovery.delete_tool",
        "recovery.add_apitoken",
        "recovery.change_apitoken",
        "recovery.delete_apitoken",
        "auth.view_user",
        "auth.add_user",
        "auth.change_user",
        "auth.view_group",
        "auth.add_group",
        "auth.change_group",
    ],
}


def sync_roles(apps):
    """Create or update the groups so each holds exactly its permissions (sync_roles of recovery/models/roles.py,
    frozen with the table above)."""
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


def _model_exists(apps, app_label, codename):
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

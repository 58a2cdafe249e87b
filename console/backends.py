"""Django's model backend, with a user's permissions read in one statement.

Every console page checks a permission, and the layout checks more: Django's ModelBackend reads a user's own
permissions and their groups' permissions in two statements (each joining permission and content type, each built by
the ORM) the first time a request asks. Roles are groups here (recovery/roles.py), so both sets are wanted on every
page: this backend reads them together, in one statement written once from the models, and fills ModelBackend's own
per-request caches, so `has_perm`, `get_user_permissions`, `get_group_permissions` and `get_all_permissions` answer
exactly as ModelBackend's would, with no further statement. A superuser's permissions are ModelBackend's (all).
"""

from __future__ import annotations

from functools import cache

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection


class RoleBackend(ModelBackend):
    def get_all_permissions(self, user_obj, obj=None):
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            if user_obj.is_superuser:
                return super().get_all_permissions(user_obj, obj)
            _load(user_obj)
        return user_obj._perm_cache

    def _get_permissions(self, user_obj, obj, from_name):
        wanted = user_obj.is_active and not user_obj.is_anonymous and obj is None and not user_obj.is_superuser
        if wanted and not hasattr(user_obj, f"_{from_name}_perm_cache"):
            _load(user_obj)
        return super()._get_permissions(user_obj, obj, from_name)


def _load(user) -> None:
    """The user's own and their groups' permissions, into ModelBackend's three caches."""
    mine, theirs = set(), set()
    with connection.cursor() as cursor:
        cursor.execute(_permissions_sql(), [user.pk, user.pk])
        for app_label, codename, own in cursor.fetchall():
            (mine if own else theirs).add(f"{app_label}.{codename}")
    user._user_perm_cache, user._group_perm_cache, user._perm_cache = mine, theirs, mine | theirs


@cache
def _permissions_sql() -> str:
    """(app label, codename, 1 if the user's own else 0) for each of the user's permissions, from either source."""
    user_permissions = get_user_model().user_permissions.through
    user_groups = get_user_model().groups.through
    group_permissions = Group.permissions.through

    def column(model, name: str) -> str:
        return f'"{model._meta.get_field(name).column}"'

    return (
        f"SELECT ct.{column(ContentType, 'app_label')}, p.{column(Permission, 'codename')}, s.own FROM ("
        f"SELECT u.{column(user_permissions, 'permission')} AS permission_id, 1 AS own "
        f"FROM {user_permissions._meta.db_table} u WHERE u.{column(user_permissions, 'user')} = %s "
        f"UNION ALL SELECT g.{column(group_permissions, 'permission')}, 0 "
        f"FROM {group_permissions._meta.db_table} g JOIN {user_groups._meta.db_table} m "
        f"ON m.{column(user_groups, 'group')} = g.{column(group_permissions, 'group')} "
        f"WHERE m.{column(user_groups, 'user')} = %s) s "
        f"JOIN {Permission._meta.db_table} p ON p.{column(Permission, 'id')} = s.permission_id "
        f"JOIN {ContentType._meta.db_table} ct "
        f"ON ct.{column(ContentType, 'id')} = p.{column(Permission, 'content_type')}"
    )

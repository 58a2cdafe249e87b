from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.db import transaction

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.models.roles import ADMIN, ROLES


def user_save_with_roles(*, username: str, roles: list[str], password: str, actor: Actor, email: str = ""):
    """Create the user, or reset an existing one's roles and password. Raises ValidationError on a weak password."""
    unknown = sorted(set(roles) - set(ROLES))
    if unknown or not roles:
        raise ValueError(f"roles must be among {', '.join(ROLES)}; got {', '.join(unknown) or 'none'}")
    User = get_user_model()
    validate_password(password, User(username=username, email=email))
    with transaction.atomic():
        user, created = User.objects.get_or_create(username=username, defaults={"email": email})
        user.set_password(password)
        user.is_staff = ADMIN in roles  # the Django admin (registry, tokens) is for admins only
        user.save()
        user.groups.set(Group.objects.filter(name__in=roles))
        append_event(
            action=AuditAction.USER_CREATED if created else AuditAction.USER_UPDATED,
            actor=actor,
            reason=f"roles: {', '.join(sorted(roles))}",
            evidence={"username": username, "roles": sorted(roles)},
        )
    return user, created

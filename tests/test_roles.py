"""The four roles of docs/console.md as groups with explicit permissions, and the `create_user` command that grants
them."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command

from recovery.audit.chain import Actor, verify_chain
from recovery.models import AuditEvent
from recovery.models.roles import ADMIN, APPROVER, REVIEWER, ROLE_PERMISSIONS, ROLES, VIEWER
from recovery.services.users import user_save_with_roles

User = get_user_model()
PASSWORD = "correct-horse-battery-9"


def _user_with(*roles: str, username: str | None = None):
    user, _ = user_save_with_roles(
        username=username or "-".join(roles), roles=list(roles), password=PASSWORD, actor=Actor.system("tests")
    )
    return User.objects.get(pk=user.pk)  # fresh: no cached permissions


def _create_user(*args: str) -> str:
    out = StringIO()
    call_command("create_user", *args, stdout=out)
    return out.getvalue()


# --- the groups ----------------------------------------------------------------------------------------------------


def test_it_creates_the_four_role_groups(db):
    assert set(Group.objects.values_list("name", flat=True)) == {"viewer", "reviewer", "approver", "admin"}
    assert set(ROLES) == {"viewer", "reviewer", "approver", "admin"}


@pytest.mark.parametrize("role", ROLES)
def test_each_group_holds_exactly_its_permissions(db, role):
    group = Group.objects.get(name=role)
    held = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}
    assert held == set(ROLE_PERMISSIONS[role])
    assert len(ROLE_PERMISSIONS[role]) == len(held)  # no duplicates hiding a missing permission


def test_a_viewer_reads_but_sees_no_diagnostics_and_acts_on_nothing(db):
    viewer = _user_with(VIEWER)
    assert viewer.has_perms(["recovery.view_call", "recovery.view_task", "recovery.view_auditevent"])
    assert viewer.has_perm("recovery.export_audit")
    assert not viewer.has_perm("recovery.view_diagnostic")
    assert not viewer.has_perm("recovery.review_call")
    assert not viewer.has_perm("recovery.approve_action")
    assert not viewer.has_perm("recovery.verify_audit")
    assert not viewer.is_staff


def test_a_reviewer_reviews_but_does_not_approve(db):
    reviewer = _user_with(REVIEWER)
    assert reviewer.has_perm("recovery.review_call")
    assert reviewer.has_perm("recovery.view_diagnostic")
    assert not reviewer.has_perm("recovery.approve_action")


def test_an_approver_approves_but_does_not_review(db):
    approver = _user_with(APPROVER)
    assert approver.has_perm("recovery.approve_action")
    assert approver.has_perm("recovery.view_diagnostic")
    assert not approver.has_perm("recovery.review_call")


def test_roles_add_up(db):
    both = _user_with(REVIEWER, APPROVER)
    assert both.has_perms(["recovery.review_call", "recovery.approve_action"])


@pytest.mark.parametrize("role", ROLES)
def test_only_an_admin_edits_the_registry(db, role):
    user = _user_with(role)
    is_admin = role == ADMIN
    assert user.has_perm("recovery.change_tool") is is_admin
    assert user.has_perm("recovery.add_provider") is is_admin
    assert user.has_perm("recovery.delete_tenant") is is_admin
    assert user.has_perm("auth.change_user") is is_admin
    assert user.is_staff is is_admin
    # Nobody, not even an admin, is granted a way to rewrite what the engine recorded.
    for perm in ("change_call", "delete_call", "add_auditevent", "change_auditevent", "delete_auditevent"):
        assert not user.has_perm(f"recovery.{perm}")


# --- create_user ---------------------------------------------------------------------------------------------------


def test_it_creates_a_user_with_the_given_roles(db, monkeypatch):
    monkeypatch.setenv("RECOVERY_PASSWORD", PASSWORD)
    out = _create_user("rita", "--role", "reviewer", "--role", "approver", "--email", "rita@example.com")
    assert "created rita with roles approver, reviewer" in out
    rita = User.objects.get(username="rita")
    assert set(rita.groups.values_list("name", flat=True)) == {"reviewer", "approver"}
    assert rita.email == "rita@example.com"
    assert rita.check_password(PASSWORD)
    assert not rita.check_password("something-else-entirely")
    assert not rita.is_staff
    assert not rita.is_superuser


def test_it_makes_only_admins_staff(db, monkeypatch):
    monkeypatch.setenv("RECOVERY_PASSWORD", PASSWORD)
    _create_user("ada", "--role", "admin")
    _create_user("vic", "--role", "viewer")
    assert User.objects.get(username="ada").is_staff
    assert not User.objects.get(username="ada").is_superuser
    assert not User.objects.get(username="vic").is_staff


def test_running_it_again_updates_the_roles_and_password(db, monkeypatch):
    monkeypatch.setenv("RECOVERY_PASSWORD", PASSWORD)
    _create_user("sam", "--role", "admin")
    new_password = "staple-battery-horse-42"
    monkeypatch.setenv("RECOVERY_PASSWORD", new_password)
    out = _create_user("sam", "--role", "viewer")
    assert "updated sam with roles viewer" in out
    assert User.objects.filter(username="sam").count() == 1
    sam = User.objects.get(username="sam")
    assert list(sam.groups.values_list("name", flat=True)) == ["viewer"]
    assert not sam.is_staff  # losing the admin role takes the Django admin away
    assert sam.check_password(new_password)
    assert not sam.check_password(PASSWORD)
    assert AuditEvent.objects.filter(action="user.updated", evidence__username="sam").count() == 1


def test_it_refuses_a_weak_password_and_creates_nothing(db, monkeypatch):
    monkeypatch.setenv("RECOVERY_PASSWORD", "123")
    events_before = AuditEvent.objects.count()
    with pytest.raises(CommandError, match="password refused"):
        _create_user("weak", "--role", "viewer")
    assert not User.objects.filter(username="weak").exists()
    assert AuditEvent.objects.count() == events_before


def test_a_weak_password_leaves_an_existing_user_as_it_was(db, monkeypatch):
    monkeypatch.setenv("RECOVERY_PASSWORD", PASSWORD)
    _create_user("kim", "--role", "reviewer")
    monkeypatch.setenv("RECOVERY_PASSWORD", "password")
    with pytest.raises(CommandError, match="password refused"):
        _create_user("kim", "--role", "admin")
    kim = User.objects.get(username="kim")
    assert kim.check_password(PASSWORD)
    assert list(kim.groups.values_list("name", flat=True)) == ["reviewer"]
    assert not kim.is_staff


def test_it_rejects_an_unknown_role(db, monkeypatch):
    monkeypatch.setenv("RECOVERY_PASSWORD", PASSWORD)
    with pytest.raises(CommandError, match="invalid choice: 'superuser'"):
        _create_user("eve", "--role", "superuser")
    with pytest.raises(ValueError, match="roles must be among"):
        user_save_with_roles(username="eve", roles=["root"], password=PASSWORD, actor=Actor.system("tests"))
    assert not User.objects.filter(username="eve").exists()


def test_it_requires_a_role(db, monkeypatch):
    monkeypatch.setenv("RECOVERY_PASSWORD", PASSWORD)
    with pytest.raises(CommandError, match="--role"):
        _create_user("nobody")
    assert not User.objects.filter(username="nobody").exists()


def test_it_records_the_new_user_in_the_system_audit_chain(db, monkeypatch):
    monkeypatch.setenv("RECOVERY_PASSWORD", PASSWORD)
    _create_user("ann", "--role", "approver", "--role", "viewer")
    event = AuditEvent.objects.get(action="user.created", evidence__username="ann")
    assert event.chain == "system"
    assert event.task_id is None
    assert (event.actor_kind, event.actor_label) == ("system", "system:create_user")
    assert event.evidence == {"username": "ann", "roles": ["approver", "viewer"]}
    assert PASSWORD not in str(event.evidence) + event.reason
    assert verify_chain("system").ok

"""The navigation's "Approvals" count, read where the layout draws it: only for people with the approver role (the
template asks for it under `perms.recovery.approve_action`), so no one else's page pays its statement."""

from __future__ import annotations

from django import template
from django.utils import timezone

from recovery.selectors.approvals import pending_approvals_count

register = template.Library()


@register.simple_tag
def pending_approvals() -> int:
    return pending_approvals_count(now=timezone.now())

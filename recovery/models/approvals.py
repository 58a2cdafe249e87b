"""Four eyes, the rows' part (docs/actions.md#four-eyes): what every request a second person decides shares — who
requested it and why, who decided and why, when it expires — and the database constraint that the decider is never
the requester. Its kinds: ActionRequest, BulkAction, BreakerOperation; its steps: recovery.services.approvals."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

# Every kind's status while it waits for a second person (each kind's own choices name it too).
REQUESTED = "requested"


def _four_eyes_condition() -> Q:
    return Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by"))


def four_eyes(name: str) -> models.CheckConstraint:
    """The four-eyes constraint under its kind's own name: whoever approves or rejects did not request it."""
    return models.CheckConstraint(condition=_four_eyes_condition(), name=name)


class FourEyesRequest(models.Model):
    """A request one person makes with a reason and a different person decides with theirs, before `expires_at`.

    Each kind adds its `status` (its own choices, REQUESTED among them) and lists `four_eyes(<its name>)` in its
    Meta's constraints; a kind whose columns differ (a BreakerOperation is created requested) overrides the field.
    """

    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    requested_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)  # the requester's
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    expires_at = models.DateTimeField()
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True

    @classmethod
    def four_eyes_constraint(cls) -> str:
        """The name of this kind's four-eyes constraint (a refusal names it when the database refuses a decision)."""
        condition = _four_eyes_condition()
        constraints = cls._meta.constraints
        return next(c.name for c in constraints if isinstance(c, models.CheckConstraint) and c.condition == condition)

    def requested_by_user(self, user) -> bool:
        return self.requested_by_id is not None and self.requested_by_id == user.pk

    def past_expiry(self, now) -> bool:
        return self.expires_at is not None and now >= self.expires_at

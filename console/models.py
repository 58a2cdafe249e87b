"""The console's own records: failed sign-ins, for throttling (docs/console.md)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class SignInFailure(models.Model):
    """One failed sign-in: enough of them for a username or from an address within the window lock it out."""

    username = models.CharField(max_length=150)
    address = models.GenericIPAddressField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["username", "at"], name="signin_failure_user_idx"),
            models.Index(fields=["address", "at"], name="signin_failure_address_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.username} from {self.address} at {self.at:%Y-%m-%d %H:%M:%S}"

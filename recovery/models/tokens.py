"""API tokens: how agent runtimes and metrics scrapers authenticate, and the scopes a token may have."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from recovery.models.registry import Tenant


class TokenScope(models.TextChoices):
    RUNTIME = "runtime"  # an agent runtime: the machine API, for its tenants
    METRICS = "metrics"  # a metrics scraper: GET /metrics and GET /api/v1/metrics only, for its tenants


class ApiToken(models.Model):
    name = models.CharField(max_length=100, unique=True)
    scope = models.CharField(max_length=16, choices=TokenScope.choices, default=TokenScope.RUNTIME)
    # The first characters of the token, shown in lists and used to find the row; the rest is only in `digest`.
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, unique=True)  # HMAC-SHA256(pepper, token), hex
    tenants = models.ManyToManyField(Tenant, related_name="api_tokens")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

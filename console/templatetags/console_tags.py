"""Template filters every console page may use. All of them return plain text: the template escapes it, so text an
agent or a provider supplied can never become markup (SPEC §15: untrusted text is shown, never rendered)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from django import template
from django.utils import timezone

from console.views.common import age_text
from recovery.selectors.call_page import receipt_source as receipt_source_text

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """JSON indented for reading (keys in their stored order); the template escapes the result."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def age(value) -> str:
    """How long ago a moment was ("3 h 12 min"), or a duration written the same way; "" for None."""
    if value is None or value == "":
        return ""
    if isinstance(value, datetime):
        value = timezone.now() - value
    if isinstance(value, (int, float)):
        value = timedelta(seconds=value)
    return age_text(value)


@register.filter
def utc(value) -> str:
    """A moment as the console writes it everywhere: "2026-11-30 08:12:03 UTC"."""
    if value is None or value == "":
        return ""
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


@register.filter
def receipt_source(value) -> str:
    """A receipt's source in the pages' words: "idempotent replay (replay reconciliation)" for replay
    reconciliation's one same-key replay (SPEC §10.1), the stored value otherwise."""
    return receipt_source_text(str(value or ""))

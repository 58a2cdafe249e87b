"""The design system's marks (docs/console.md, "The design system"): one badge per call state, risk, breaker state and
task outcome, drawn the same on every page; and the copy button beside a truncated id or key. Each returns escaped
markup: an agent's or a provider's text stays text."""

from __future__ import annotations

from django import template
from django.utils.html import format_html, format_html_join

register = template.Library()

# The tone of each value a badge shows: good (settled as wanted), warn (waits: for the provider, a check or a person),
# bad (failed or stands against what was wanted), info (in flight), neutral (nothing to say). Its colours are the
# --tone-* tokens of static/console/console.css.
TONES = {
    "good": {
        "COMMITTED",
        "COMPENSATED",
        "closed",
        "completed",
        "committed",
        "compensated",
        "done",
        "approved",
        "executed",
        "low",
        "delivered",
        "safe",
        "passed",
    },
    "warn": {
        "UNKNOWN",
        "STILL_UNKNOWN",
        "HUMAN_REVIEW",
        "ACCEPTED",
        "COMPENSATING",
        "PARTIAL_COMPENSATED",
        "half_open",
        "completed_with_unknowns",
        "degraded",
        "review",
        "unknown",
        "pending",
        "requested",
        "running",
        "medium",
        "unprobed",
        "retrying",
        "sent",
    },
    "bad": {
        "FAILED_PERMANENT",
        "COMPENSATION_FAILED",
        "open",
        "forced_open",
        "failed",
        "abandoned",
        "rejected",
        "high",
        "stopped",
        "unsafe",
        "expired",
        "refused",
    },
    "info": {"READY", "SENT", "RETRYABLE", "NOT_COMMITTED", "previewed", "open_task"},
}
TONE = {value: tone for tone, values in TONES.items() for value in values}


@register.filter
def tone(value) -> str:
    """The tone a value's badge takes ("neutral" for one no tone names)."""
    return TONE.get(str(value or ""), "neutral")


def _badge(kind: str, value, attrs: dict) -> str:
    text = str(value if value not in (None, "") else "—")
    extra = format_html_join("", ' {}="{}"', ((k.replace("_", "-"), v) for k, v in attrs.items() if k != "cls"))
    cls = f" {attrs['cls']}" if attrs.get("cls") else ""
    return format_html(
        '<span class="{} badge-mark tone-{} {}-{}{}"{}>{}</span>',
        kind,
        tone(text),
        kind,
        text.lower(),
        cls,
        extra,
        text,
    )


@register.simple_tag
def state_badge(value, **attrs) -> str:
    """A call state as its badge: `{% state_badge call.state data_fact="state" %}` (keyword arguments become
    attributes, underscores as dashes; `cls` adds classes)."""
    return _badge("state", value, attrs)


@register.simple_tag
def risk_badge(value, **attrs) -> str:
    """A tool's risk (low, medium, high) as its badge."""
    return _badge("risk", value, attrs)


@register.simple_tag
def copy_button(value, what: str = "value") -> str:
    """The button that copies a truncated id or key whole (static/console/console.js); its name says what it copies."""
    if value in (None, ""):
        return ""
    return format_html(
        '<button type="button" class="copy" data-copy="{}" aria-label="Copy the {}" title="Copy the {}"></button>',
        value, what, what,
    )  # fmt: skip

"""Template filters every console page may use. All of them return plain text: the template escapes it, so text an
agent or a provider supplied can never become markup (docs/console.md: untrusted text is shown, never rendered)."""

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
def until(value) -> str:
    """How long until a moment ("12 s", "3 min"), written as ages are; "" for None."""
    if value is None or value == "":
        return ""
    return age_text(value - timezone.now())


@register.filter
def utc(value) -> str:
    """A moment as the console writes it everywhere: "2026-11-30 08:12:03 UTC"."""
    if value is None or value == "":
        return ""
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


@register.filter
def duration(value) -> str:
    """A setting in seconds as a person reads it, in its two largest units: 86400 → "1 d", 90 → "1 min 30 s",
    5400 → "1 h 30 min", 45 → "45 s"."""
    if value is None or value == "":
        return ""
    left = round(float(value))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        whole, left = divmod(left, size)
        if whole:
            parts.append(f"{whole} {unit}")
    return " ".join(parts[:2]) or "0 s"


@register.filter
def worker(value) -> str:
    """A process as the jobs name it ("host:pid:thread-or-token") in words: "host, process 11097"; anything else as
    it is."""
    parts = str(value or "").split(":")
    if len(parts) >= 2 and parts[1].isdigit():
        return f"{parts[0]}, process {parts[1]}"
    return str(value or "")


@register.filter
def receipt_source(value) -> str:
    """A receipt's source in the pages' words: "idempotent replay (replay reconciliation)" for replay
    reconciliation's one same-key replay (docs/replay.md), the stored value otherwise."""
    return receipt_source_text(str(value or ""))


MCP_HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


@register.filter
def mcp_hints(mcp: dict | None) -> list[tuple[str, str]]:
    """An MCP tool's annotations as (hint, what the server said) for each of the four, "not given" where it is silent:
    the server's untrusted hints, shown and never acted on (docs/mcp-gateway.md)."""
    annotations = (mcp or {}).get("annotations") or {}
    return [(name, str(annotations[name]).lower() if name in annotations else "not given") for name in MCP_HINTS]


@register.filter
def json_line(value, limit: int = 90) -> str:
    """JSON on one line, cut at `limit` characters with an ellipsis: the summary a folded piece of evidence shows."""
    text = json.dumps(value, ensure_ascii=False, default=str, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


@register.filter
def mcp_origin(call):
    """A call's origin through the MCP gateway (recovery.models.McpCall), or None for any other call: read with the
    call where its page selects it along, never a statement of its own there."""
    return getattr(call, "mcp_origin", None)

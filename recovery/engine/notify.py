"""What a notification says (docs/notifications.md): one message per delivery, made only from our own words — each
waiting item's title, why (a code of ours), its age, due time and a link — as a webhook's JSON, Slack Block Kit and an
e-mail's plain text and HTML; and which addresses an outbound message may go to. Pure Python: no Django, no I/O.
"""

from __future__ import annotations

import html
import ipaddress
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

MAX_LISTED = 20  # items a message lists by name; the rest are counted
SLACK_TEXT_MAX = 3000  # a section block's text limit (Slack's Block Kit reference)


@dataclass(frozen=True, kw_only=True)
class Item:
    event: str  # an EventKind value
    subject: str
    title: str
    reason: str
    link: str  # absolute, no credentials
    at: datetime  # when the event happened
    due_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class Message:
    delivery_id: str
    rule: str
    items: tuple[Item, ...]
    now: datetime
    follows: str = ""  # the delivery id of the message this one follows up (its thread)

    @property
    def headline(self) -> str:
        kinds = sorted({item.event for item in self.items})
        if kinds == ["resolved"]:
            return f"Resolved: {len(self.items)} item{'s' if len(self.items) != 1 else ''}"
        if len(self.items) == 1:
            return self.items[0].title
        return f"{len(self.items)} items need a person ({', '.join(kinds)})"


def age_text(seconds: float) -> str:
    """A short age: 45 s, 12 min, 3 h 5 min, 2 d 4 h."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, hours = seconds // 60, seconds // 3600
    if hours < 1:
        return f"{minutes} min"
    if hours < 48:
        return f"{hours} h {minutes % 60} min"
    return f"{hours // 24} d {hours % 24} h"


def _due_text(item: Item, now: datetime) -> str:
    if item.due_at is None:
        return ""
    if item.due_at <= now:
        return f"overdue by {age_text((now - item.due_at).total_seconds())}"
    return f"due in {age_text((item.due_at - now).total_seconds())}"


def item_line(item: Item, now: datetime) -> str:
    parts = [item.title]
    if item.reason:
        parts.append(f"why: {item.reason}")
    parts.append(f"age {age_text((now - item.at).total_seconds())}")
    if due := _due_text(item, now):
        parts.append(due)
    return " · ".join(parts)


def webhook_body(message: Message) -> dict:
    """The webhook's JSON: the delivery id (also the Recovery-Delivery-Id header) and every item."""
    return {
        "delivery_id": message.delivery_id,
        "follows": message.follows or None,
        "rule": message.rule,
        "text": message.headline,
        "items": [
            {
                "event": item.event,
                "subject": item.subject,
                "title": item.title,
                "reason": item.reason,
                "age_s": max(0, int((message.now - item.at).total_seconds())),
                "due_at": item.due_at.isoformat() if item.due_at else None,
                "link": item.link,
            }
            for item in message.items
        ],
    }


def _listed(message: Message) -> tuple[list[Item], int]:
    return list(message.items[:MAX_LISTED]), max(0, len(message.items) - MAX_LISTED)


def slack_blocks(message: Message) -> list[dict]:
    """Block Kit: a header, one section per listed item (its line and a link button), and a count of the rest."""
    listed, more = _listed(message)
    blocks: list[dict] = [{"type": "header", "text": {"type": "plain_text", "text": message.headline[:150]}}]
    for item in listed:
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": _slack_escape(item_line(item, message.now))[:SLACK_TEXT_MAX]},
                "accessory": {
                    "type": "button",
                    "text": {"type": "plain_text", "text": "Open"},
                    "url": item.link,
                    "action_id": f"open-{item.subject}"[:255],
                },
            }
        )
    if more:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"and {more} more"}]})
    return blocks


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def email_subject(message: Message) -> str:
    prefix = "Re: " if message.follows else ""
    return f"{prefix}[Recovery Console] {message.headline}"[:200]


def email_text(message: Message) -> str:
    listed, more = _listed(message)
    lines = [message.headline, ""]
    for item in listed:
        lines += [f"- {item_line(item, message.now)}", f"  {item.link}"]
    if more:
        lines.append(f"and {more} more")
    lines += ["", f"Delivery {message.delivery_id} (rule {message.rule})"]
    return "\n".join(lines) + "\n"


def email_html(message: Message) -> str:
    listed, more = _listed(message)
    esc = html.escape
    rows = "".join(
        f'<li><a href="{esc(item.link)}">{esc(item.title)}</a><br>'
        f"<small>{esc(item_line(item, message.now))}</small></li>"
        for item in listed
    )
    tail = f"<p>and {more} more</p>" if more else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>'
        f"{esc(message.headline)}</title></head>"
        '<body style="font-family: sans-serif; max-width: 40em">'
        f'<h1 style="font-size: 1.2em">{esc(message.headline)}</h1><ul>{rows}</ul>{tail}'
        f'<p style="color: #555"><small>Delivery {esc(message.delivery_id)} (rule {esc(message.rule)})</small></p>'
        "</body></html>"
    )


def host_refusal(url: str, *, allowed_hosts: tuple[str, ...], addresses: tuple[str, ...], allow_private: bool) -> str:
    """Why an outbound message may not go to `url` ("" when it may): the host must be on the allow-list (a name or
    a `.suffix`), and every address it resolves to public unless the channel allows private ones."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("https", "http") or not host:
        return "the URL must be http(s) with a host"
    if parts.username or parts.password:
        return "the URL must not carry credentials"
    if parts.scheme == "http" and not allow_private:
        return "the URL must be https"
    if not any(host == h or (h.startswith(".") and host.endswith(h)) for h in allowed_hosts):
        return f"{host} is not on RECOVERY_NOTIFY_HOSTS"
    if not addresses:
        return f"{host} does not resolve"
    for address in addresses:
        ip = ipaddress.ip_address(address)
        if not allow_private and (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved):
            return f"{host} resolves to a private or loopback address ({address})"
    return ""

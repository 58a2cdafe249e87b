"""Sending a notification to the outside (docs/notifications.md): a signed webhook POST, Slack's Web API
(chat.postMessage, chat.update; conversations.history and .replies to look a message up) and SMTP through Django's
e-mail framework. One try per call, explicit timeouts, no retry underneath: the delivery job decides. Each answer says
whether the receiver may have the message (`unknown`: a timeout after sending), which the job turns into a re-send
under the same delivery id, or for Slack a lookup first.
"""

from __future__ import annotations

import json
import smtplib
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection

from recovery.engine.notify import host_refusal
from recovery.engine.redact import redact

SENT, FAILED, UNKNOWN = "sent", "failed", "unknown"
ANSWER_MAX = 300


@dataclass(frozen=True, kw_only=True)
class Sent:
    outcome: str  # sent, failed, unknown
    reason: str = ""  # our words
    status_code: int | None = None
    answer: str = ""  # the start of the receiver's answer, redacted (for the delivery log, never a message)
    ref: str = ""  # what the receiver named the message: Slack's ts


def resolve(host: str) -> tuple[str, ...]:
    try:
        return tuple(sorted({info[4][0] for info in socket.getaddrinfo(host, None)}))
    except OSError:
        return ()


def url_refusal(url: str, *, allow_private: bool) -> str:
    """Why `url` may not be sent to ("" when it may), its host resolved now."""
    host = urlsplit(url).hostname or ""
    return host_refusal(
        url,
        allowed_hosts=tuple(settings.RECOVERY_NOTIFY_HOSTS),
        addresses=resolve(host) if host else (),
        allow_private=allow_private,
    )


def _timeout() -> tuple[float, float]:
    return (settings.RECOVERY_NOTIFY_CONNECT_TIMEOUT_S, settings.RECOVERY_NOTIFY_READ_TIMEOUT_S)


def _excerpt(text: str) -> str:
    return redact(text[:ANSWER_MAX])


def post_json(url: str, body: bytes, headers: dict[str, str], *, allow_private: bool) -> tuple[Sent, dict | None]:
    """POST `body`; the outcome and, on a 2xx JSON answer, the answer parsed."""
    if refusal := url_refusal(url, allow_private=allow_private):
        return Sent(outcome=FAILED, reason=f"refused: {refusal}"), None
    try:
        reply = requests.post(
            url,
            data=body,
            headers={"Content-Type": "application/json", **headers},
            timeout=_timeout(),
            allow_redirects=False,
        )
    except requests.ConnectTimeout:
        return Sent(outcome=FAILED, reason="could not connect in time"), None
    except requests.ReadTimeout:
        return Sent(outcome=UNKNOWN, reason="timed out after sending: the receiver may have it"), None
    except requests.ConnectionError as exc:
        if _never_connected(exc):
            return Sent(outcome=FAILED, reason="could not connect"), None
        return Sent(outcome=UNKNOWN, reason="connection lost after sending: the receiver may have it"), None
    answer = _excerpt(reply.text)
    if not 200 <= reply.status_code < 300:
        return Sent(
            outcome=FAILED, reason=f"HTTP {reply.status_code}", status_code=reply.status_code, answer=answer
        ), None
    try:
        parsed = reply.json()
    except ValueError:
        parsed = None
    return Sent(outcome=SENT, status_code=reply.status_code, answer=answer), parsed


def _never_connected(exc: BaseException) -> bool:
    """Whether a connection error happened before anything was sent (refused, no route, name not found)."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ in ("NewConnectionError", "NameResolutionError", "ConnectionRefusedError"):
            return True
        seen = (
            seen.__cause__
            or seen.__context__
            or (seen.args[0] if seen.args and isinstance(seen.args[0], BaseException) else None)
        )
    return False


def slack_call(base_url: str, method: str, token: str, payload: dict, *, allow_private: bool) -> Sent:
    """One Slack Web API method (chat.postMessage, chat.update) with the bot token; `ok: false` is a failure named
    by Slack's error code (a code, never a message text)."""
    body = json.dumps(payload).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json; charset=utf-8"}
    sent, parsed = post_json(f"{base_url.rstrip('/')}/{method}", body, headers, allow_private=allow_private)
    if sent.outcome != SENT:
        return sent
    if not isinstance(parsed, dict) or not parsed.get("ok"):
        code = str((parsed or {}).get("error", "no answer"))[:60] if isinstance(parsed, dict) else "not JSON"
        return Sent(
            outcome=FAILED, reason=f"Slack refused it: {code}", status_code=sent.status_code, answer=sent.answer
        )
    return Sent(outcome=SENT, status_code=sent.status_code, answer=sent.answer, ref=str(parsed.get("ts", "")))


def slack_read(base_url: str, method: str, token: str, params: dict, *, allow_private: bool) -> tuple[Sent, dict]:
    """One Slack Web API read method (conversations.history, conversations.replies) by GET with the bot token: `sent`
    when Slack answered `ok`, with its answer parsed; anything else a failure in our words (a lookup is read-only:
    whatever happened, nothing was posted)."""
    url = f"{base_url.rstrip('/')}/{method}"
    if refusal := url_refusal(url, allow_private=allow_private):
        return Sent(outcome=FAILED, reason=f"refused: {refusal}"), {}
    headers = {"Authorization": f"Bearer {token}"}
    try:
        reply = requests.get(url, params=params, headers=headers, timeout=_timeout(), allow_redirects=False)
    except requests.RequestException:
        return Sent(outcome=FAILED, reason=f"{method} did not answer"), {}
    if reply.status_code != 200:
        return Sent(outcome=FAILED, reason=f"{method}: HTTP {reply.status_code}", status_code=reply.status_code), {}
    try:
        parsed = reply.json()
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed.get("ok"):
        code = str(parsed.get("error", "no answer"))[:60] if isinstance(parsed, dict) else "not JSON"
        return Sent(outcome=FAILED, reason=f"{method}: Slack refused it: {code}", status_code=200), {}
    return Sent(outcome=SENT, status_code=200), parsed


def send_email(*, to: list[str], subject: str, text: str, html: str, message_id: str, in_reply_to: str = "") -> Sent:
    """One e-mail over SMTP (EMAIL_* settings), plain text and HTML, under a stable Message-ID."""
    headers = {"Message-ID": message_id}
    if in_reply_to:
        headers.update({"In-Reply-To": in_reply_to, "References": in_reply_to})
    mail = EmailMultiAlternatives(subject, text, settings.DEFAULT_FROM_EMAIL, to, headers=headers)
    mail.attach_alternative(html, "text/html")
    try:
        with get_connection(fail_silently=False) as connection:
            connection.send_messages([mail])
    except (ConnectionRefusedError, socket.gaierror, smtplib.SMTPConnectError):
        return Sent(outcome=FAILED, reason="could not connect to the SMTP server")
    except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused) as exc:
        return Sent(outcome=FAILED, reason="the SMTP server refused the addresses", answer=_excerpt(str(exc)))
    except smtplib.SMTPResponseException as exc:
        return Sent(outcome=FAILED, reason=f"SMTP {exc.smtp_code}", status_code=exc.smtp_code)
    except (OSError, smtplib.SMTPException):
        return Sent(outcome=UNKNOWN, reason="the SMTP session broke off: the server may have it")
    return Sent(outcome=SENT, reason="accepted by the SMTP server")

"""Redaction of secrets before anything is stored for operators (its rules and their two deliberate exceptions:
docs/architecture.md, "How recovery is decided"): `redact(text)` masks what looks like a credential or a card number
in free text; `redact_data` walks a JSON value and also masks everything stored under a sensitive key.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

MASK = "[REDACTED]"


def _marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


# --- free text -----------------------------------------------------------------------------------------------------

# "Authorization: Bearer xyz", "authorization=Basic ...", '"Authorization": "Bearer xyz"', and the same escaped
# inside a JSON string. The scheme is kept (it tells an operator which kind of credential was sent); the value is
# masked up to the end of the line or the closing quote.
_AUTH_HEADER = re.compile(
    r"""(?i)(\b(?:proxy-)?authorization\\?["']?\s*[:=]\s*\\?["']?)"""
    r"""((?:bearer|basic|digest|token|bot|apikey|negotiate|ntlm|aws4-hmac-sha256)\s+)?"""
    r"""([^\s"'\\][^"'\\\r\n]*)"""
)
_COOKIE_HEADER = re.compile(r"""(?i)(\b(?:set-)?cookie\\?["']?\s*:\s*\\?["']?)([^\s"'\\][^"'\\\r\n]*)""")
# A bearer token anywhere else ("... with Bearer eyJhbGci..."): at least 8 token68 characters, so that English
# ("the bearer of") survives.
_BEARER = re.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9\-._~+/]{8,}=*)")
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.DOTALL
)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/@]+:)([^\s/@]+)(@)")

# Known key shapes: (pattern, kind)
_KEY_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]+"), "jwt"),
    (re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{4,}"), "api_key"),  # Stripe secret and restricted keys
    (re.compile(r"\bwhsec_[A-Za-z0-9+/=]{8,}"), "api_key"),  # webhook signing secrets
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), "api_key"),  # "sk-..." keys of model providers
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "aws_key"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), "github_token"),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), "github_token"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{8,}"), "slack_token"),
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"), "api_key"),
)

# `name=value` / `"name": "value"` where the name says "secret". Names that are always secret mask any value;
# names that merely end in key/token mask only a value shaped like a generated secret (see _looks_generated).
_NAMED_VALUE = re.compile(
    r"""(?i)\b([A-Za-z0-9_\-]*?(?:passw(?:or)?d|passphrase|pwd|secret|api[_\-]?key|apikey|access[_\-]?key|"""
    r"""private[_\-]?key|key|token|credentials?|session[_\-]?id))\b(\\?["']?\s*[:=]\s*\\?["']?)"""
    r"""([^\s"'\\,;&})\]]+)"""
)
_ALWAYS_SECRET_NAME = re.compile(
    r"(?i)(passw(?:or)?d|passphrase|pwd|secret|api[_\-]?key|apikey|access[_\-]?key|private[_\-]?key|"
    r"(?:access|refresh|auth|id|bearer|session)[_\-]?token|credentials?|session[_\-]?id)$"
)
_HEX_SECRET = re.compile(r"[0-9a-fA-F]{16,}")
_BASE64_SECRET = re.compile(r"[A-Za-z0-9+/_\-]{20,}={0,2}")

# Card numbers: a run of digit groups separated by single spaces or dashes, not part of a word or a decimal.
_DIGIT_RUN = re.compile(r"(?<![\w.])\d+(?:[ \-]\d+)*(?![\w]|\.\d)")


def _looks_generated(value: str) -> bool:
    if _HEX_SECRET.fullmatch(value):
        return True
    if _BASE64_SECRET.fullmatch(value):
        # Random base64 of this length practically always mixes cases and digits; a slug or an identifier
        # ("refund-order-8848-v3") does not.
        return any(c.islower() for c in value) and any(c.isupper() for c in value) and any(c.isdigit() for c in value)
    return False


def _named_value(match: re.Match[str]) -> str:
    name, separator, value = match.group(1), match.group(2), match.group(3)
    if "idempotency" in name.lower() or value.startswith("[REDACTED"):
        return match.group(0)
    if _ALWAYS_SECRET_NAME.search(name) or _looks_generated(value):
        return f"{name}{separator}{_marker('secret')}"
    return match.group(0)


def luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        digit = int(char)
        if index % 2 == 1:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


def _is_card(digits: str) -> bool:
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _mask_cards(match: re.Match[str]) -> str:
    """Mask every Luhn-valid card inside one run of digit groups, keeping the rest of the run."""
    run = match.group(0)
    groups = [(m.start(), m.end()) for m in re.finditer(r"\d+", run)]
    pieces: list[str] = []
    cursor = 0
    index = 0
    while index < len(groups):
        span = _card_window(run, groups, index)
        if span is None:
            index += 1
            continue
        end_index, start, end = span
        pieces.append(run[cursor:start])
        pieces.append(_marker("card"))
        cursor = end
        index = end_index + 1
    pieces.append(run[cursor:])
    return "".join(pieces)


def _card_window(run: str, groups: list[tuple[int, int]], first: int) -> tuple[int, int, int] | None:
    """The longest card starting at group `first`, as (last group, start, end): one unbroken run of 13-19 digits,
    or up to five groups of 3 to 6 digits (4-4-4-4, 4-6-5, 4-4-4-4-3)."""
    start, end = groups[first]
    if end - start > 6:
        return (first, start, end) if _is_card(run[start:end]) else None
    best = None
    digits = ""
    for last in range(first, min(first + 5, len(groups))):
        group_start, group_end = groups[last]
        if not 3 <= group_end - group_start <= 6:
            break
        digits += run[group_start:group_end]
        if len(digits) > 19:
            break
        if _is_card(digits):
            best = (last, start, group_end)
    return best


@lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid redaction pattern {pattern!r}: {exc}") from exc


def redact(text: str, extra_patterns: tuple[str, ...] = ()) -> str:
    """Mask credentials, key shapes, card numbers and every match of `extra_patterns` (regular expressions)."""
    if not text:
        return text
    for pattern in extra_patterns:
        text = _compile(pattern).sub(_marker("pattern"), text)
    text = _PRIVATE_KEY.sub(_marker("private_key"), text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{_marker('authorization')}", text)
    text = _COOKIE_HEADER.sub(lambda m: f"{m.group(1)}{_marker('cookie')}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{_marker('bearer')}", text)
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{_marker('password')}{m.group(3)}", text)
    for pattern, kind in _KEY_SHAPES:
        text = pattern.sub(_marker(kind), text)
    text = _DIGIT_RUN.sub(_mask_cards, text)
    return _NAMED_VALUE.sub(_named_value, text)


# --- JSON values ---------------------------------------------------------------------------------------------------

_SENSITIVE_KEYS = frozenset(
    {
        "authorization",
        "proxy_authorization",
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "secret",
        "client_secret",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth_token",
        "api_key",
        "apikey",
        "x_api_key",
        "access_key",
        "secret_key",
        "private_key",
        "cookie",
        "set_cookie",
        "session",
        "session_id",
        "sessionid",
        "card_number",
        "cardnumber",
        "card_no",
        "pan",
        "cvc",
        "cvv",
        "cvv2",
        "cvc2",
        "pin",
        "credentials",
        "credential",
    }
)
_SENSITIVE_SUFFIXES = ("_password", "_secret", "_token", "_api_key", "_apikey", "_private_key", "_cookie")


def is_sensitive_key(key: str) -> bool:
    """A key whose value is secret whatever it looks like ("Authorization", "X-Api-Key", "db_password")."""
    normalized = key.strip().lower().replace("-", "_")
    return normalized in _SENSITIVE_KEYS or normalized.endswith(_SENSITIVE_SUFFIXES)


def redact_data(value: Any, extra_patterns: tuple[str, ...] = ()) -> Any:
    """A copy of a JSON value with sensitive keys' values masked and every string passed through redact().

    A null or empty value under a sensitive key is kept as it is: "no credential was sent" is worth seeing and
    reveals nothing. Integers that are Luhn-valid card numbers are masked too.
    """
    if isinstance(value, dict):
        return {
            key: (
                MASK
                if isinstance(key, str) and is_sensitive_key(key) and value[key] not in (None, "")
                else redact_data(value[key], extra_patterns)
            )
            for key in value
        }
    if isinstance(value, list):
        return [redact_data(item, extra_patterns) for item in value]
    if isinstance(value, tuple):
        return tuple(redact_data(item, extra_patterns) for item in value)
    if isinstance(value, str):
        return redact(value, extra_patterns)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0 and _is_card(str(value)):
        return _marker("card")
    return value


# --- a rejected value, echoed --------------------------------------------------------------------------------------

MAX_ECHO_CHARS = 200  # a longer text comes back cut, with "…": enough to recognise, never the whole of a big value
MAX_ECHO_ITEMS = 20


def echo_received(value: Any, field: str = "") -> Any:
    """A rejected value as a field error's `received` carries it back to the sender: a scalar, or a short list of
    scalars, redacted as anything stored is (masked whole under a sensitive field name) and texts cut at
    MAX_ECHO_CHARS. None for an object, a long or nested list, and what a JSON answer cannot carry (NaN, a lone
    surrogate, NUL): the field, `expected` and `suggestion` still say what to fix."""
    if field and is_sensitive_key(field.rsplit(".", 1)[-1]) and value not in (None, ""):
        return MASK
    if isinstance(value, list):
        if len(value) > MAX_ECHO_ITEMS or any(isinstance(item, dict | list) for item in value):
            return None
        return [echo_received(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return None
    if isinstance(value, str):
        if "\x00" in value or not _encodable(value):
            return None
        text = redact(value)
        return text if len(text) <= MAX_ECHO_CHARS else text[: MAX_ECHO_CHARS - 1] + "…"
    return redact_data(value) if value is None or isinstance(value, bool | int | float) else None


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True

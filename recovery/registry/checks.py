"""The building blocks of registry validation (docs/registry.md): errors with JSON paths, and checks that report to the
Context instead of raising and return whether the value passed, so a caller can skip cross-field rules that would
only repeat an error. No message repeats a value that might be a secret.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from jsonschema import Draft202012Validator

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
ENV_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
HEADER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")
DOTTED_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
PLACEHOLDER_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)*$")
SECRET_KEY_RE = re.compile(
    r"secret|token|passw(or)?d|api[_-]?key|credential|authorization|bearer|private[_-]?key|cookie", re.IGNORECASE
)
SCHEMA_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_SCHEMA_META = Draft202012Validator(
    Draft202012Validator.META_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER
)
_URL = URLValidator(schemes=["http", "https"])

INT_MAX = 2**31 - 1  # the columns are 32-bit integers on PostgreSQL
KINDS = ("tenants", "providers", "tools")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
OBSERVATIONS = ("committed", "not_committed", "pending")
# Placeholders every request template may use besides the tool's arguments.
CALL_PLACEHOLDERS = frozenset({"idempotency_key"})
STATUS_PLACEHOLDERS = frozenset({"idempotency_key", "provider_ref"})
COMPENSATION_ROOTS = frozenset({"result", "provider_ref", "idempotency_key"})


@dataclass(frozen=True, kw_only=True)
class RegistryError:
    path: str  # JSON path of the bad field: $.tools[2].budgets.max_attempts
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class RegistryInvalid(Exception):
    """A registry that fails validation; nothing of it was written."""

    def __init__(self, errors: list[RegistryError]):
        self.errors = tuple(errors)
        super().__init__(f"the registry has {len(errors)} error(s); first: {errors[0] if errors else '-'}")


# --- paths and messages -------------------------------------------------------------------------------------------


def child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key)}]"


def show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if is_json_scalar(value) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and (
        isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    )


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and (
        isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    )


# --- the context: errors, and the names a file may refer to ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ToolRef:
    side_effect: Any
    args_schema: Any


@dataclass
class Context:
    errors: list[RegistryError] = field(default_factory=list)
    providers: set[str] = field(default_factory=set)  # in the file or the database
    tools: dict[str, ToolRef] = field(default_factory=dict)

    def error(self, path: str, message: str) -> None:
        self.errors.append(RegistryError(path=path, message=message))


Check = Callable[[Context, Any, str], bool]


@dataclass(frozen=True)
class Key:
    check: Check
    required: bool = False


def check_object(ctx: Context, value: Any, path: str, spec: dict[str, Key], what: str) -> set[str] | None:
    """Check an object's keys against its spec; return the keys whose values passed, or None if not an object."""
    if not isinstance(value, dict):
        ctx.error(path, f"must be an object ({what})")
        return None
    passed = set()
    for key, item in value.items():
        where = child(path, key)
        if key in spec:
            if spec[key].check(ctx, item, where):
                passed.add(key)
        elif SECRET_KEY_RE.search(str(key)):
            ctx.error(
                where,
                f"secrets never go in the registry file ({key!r}): put the value in an environment variable "
                "and name that variable (the provider's auth.secret_env or callback_secret_env)",
            )
        else:
            close = difflib.get_close_matches(str(key), spec, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(spec)}"
            ctx.error(where, f"unknown key {key!r} in {what}; {hint}")
    for key, rule in spec.items():
        if rule.required and key not in value:
            ctx.error(child(path, key), f"required in {what}")
    return passed


# --- scalar checks --------------------------------------------------------------------------------------------------


def string(max_length: int = 200, *, empty: bool = True) -> Check:
    def check(ctx: Context, value: Any, path: str) -> bool:
        if not isinstance(value, str):
            ctx.error(path, "must be a string")
        elif not empty and not value.strip():
            ctx.error(path, "must not be empty")
        elif len(value) > max_length:
            ctx.error(path, f"must be at most {max_length} characters")
        else:
            return True
        return False

    return check


def name(max_length: int) -> Check:
    def check(ctx: Context, value: Any, path: str) -> bool:
        if not isinstance(value, str) or not NAME_RE.fullmatch(value) or len(value) > max_length:
            ctx.error(
                path,
                f"must be a name of lowercase letters, digits, '.', '_' and '-', starting with a letter or digit, "
                f"at most {max_length} characters (got {show(value)})",
            )
            return False
        return True

    return check


def choice(*options: str) -> Check:
    def check(ctx: Context, value: Any, path: str) -> bool:
        if value not in options or not isinstance(value, str):
            ctx.error(path, f"must be one of {', '.join(options)} (got {show(value)})")
            return False
        return True

    return check


def boolean(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        ctx.error(path, f"must be true or false (got {show(value)})")
        return False
    return True


def integer(minimum: int, maximum: int = INT_MAX) -> Check:
    upper = f" and at most {maximum}" if maximum != INT_MAX else ""

    def check(ctx: Context, value: Any, path: str) -> bool:
        if not _is_int(value) or value < minimum or value > maximum:
            ctx.error(path, f"must be an integer of at least {minimum}{upper} (got {show(value)})")
            return False
        return True

    return check


def number(*, above: float | None = None, minimum: float | None = None, maximum: float | None = None) -> Check:
    bounds = [
        f"greater than {above}" if above is not None else "",
        f"at least {minimum}" if minimum is not None else "",
    ]
    bounds.append(f"at most {maximum}" if maximum is not None else "")
    wanted = " and ".join(b for b in bounds if b)

    def check(ctx: Context, value: Any, path: str) -> bool:
        ok = _is_number(value)
        ok = ok and (above is None or value > above) and (minimum is None or value >= minimum)
        ok = ok and (maximum is None or value <= maximum)
        if not ok:
            ctx.error(path, f"must be a number {wanted} (got {show(value)})")
        return ok

    return check


def env_name(ctx: Context, value: Any, path: str) -> bool:
    # Never echo the value: a literal secret put here by mistake must not end up in logs.
    if not isinstance(value, str) or not ENV_RE.fullmatch(value) or len(value) > 100:
        ctx.error(
            path,
            "must name an environment variable (capital letters, digits and '_', e.g. SANDBOX_API_KEY); "
            "the secret itself never goes in the file",
        )
        return False
    return True


def dotted(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, str) or not DOTTED_RE.fullmatch(value) or len(value) > 100:
        ctx.error(path, f"must be a field path like 'refund_id' or 'data.refund_id' (got {show(value)})")
        return False
    return True


def string_list(item: Check, *, nonempty: bool = False) -> Check:
    def check(ctx: Context, value: Any, path: str) -> bool:
        if not isinstance(value, list):
            ctx.error(path, "must be a list")
            return False
        if nonempty and not value:
            ctx.error(path, "must not be empty")
            return False
        ok = True
        seen = set()
        for i, element in enumerate(value):
            if not item(ctx, element, child(path, i)):
                ok = False
            elif element in seen:
                ctx.error(child(path, i), f"{show(element)} is listed twice")
                ok = False
            else:
                seen.add(element)
        return ok

    return check


def json_schema(*, arguments: bool = False) -> Check:
    def check(ctx: Context, value: Any, path: str) -> bool:
        if not isinstance(value, dict):
            ctx.error(path, "must be a JSON Schema object")
            return False
        declared = value.get("$schema", SCHEMA_2020_12)
        if not isinstance(declared, str) or declared.rstrip("#") != SCHEMA_2020_12:
            ctx.error(child(path, "$schema"), f"schemas are JSON Schema 2020-12: use {SCHEMA_2020_12} or omit it")
            return False
        ok = True
        for error in sorted(_SCHEMA_META.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path]):
            where = path
            for part in error.absolute_path:
                where = child(where, part)
            ctx.error(where, f"not a valid JSON Schema: {error.message[:200]}")
            ok = False
        if ok and arguments and value.get("type") != "object":
            ctx.error(child(path, "type"), 'arguments are a JSON object: the schema needs "type": "object"')
            ok = False
        return ok

    return check


def placeholders(template: str) -> list[str]:
    """The names in a template's {placeholders}; {{ and }} are literal braces."""
    return PLACEHOLDER_RE.findall(template.replace("{{", "").replace("}}", ""))


def _literal_secret(key: str, value: Any) -> bool:
    """A secret-looking key whose value is written out in the file rather than filled in from the call."""
    return bool(SECRET_KEY_RE.search(key)) and isinstance(value, str) and value != "" and not placeholders(value)


def template_path(ctx: Context, value: Any, path: str) -> bool:
    # Secrets first, so that the format message below never echoes one.
    for key, item in parse_qsl(value.partition("?")[2] if isinstance(value, str) else "", keep_blank_values=True):
        if _literal_secret(key, item):
            ctx.error(path, f"the query parameter {key!r} looks like a secret: outbound auth belongs to the provider")
            return False
    if not isinstance(value, str) or not value.startswith("/") or len(value) > 500:
        ctx.error(path, f"must be a path template starting with '/', e.g. /refunds/{{refund_id}} (got {show(value)})")
        return False
    return True


def _body_secrets(ctx: Context, value: Any, path: str) -> bool:
    ok = True
    if isinstance(value, dict):
        for key, item in value.items():
            if _literal_secret(str(key), item):
                ctx.error(child(path, key), "looks like a secret: outbound auth belongs to the provider's auth")
                ok = False
            else:
                ok = _body_secrets(ctx, item, child(path, key)) and ok
    elif isinstance(value, list):
        for i, item in enumerate(value):
            ok = _body_secrets(ctx, item, child(path, i)) and ok
    return ok


def body_template(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, dict):
        ctx.error(path, "must be an object (the JSON body, with {placeholders} for arguments)")
        return False
    return _body_secrets(ctx, value, path)


def template_strings(value: Any, path: str):
    """Every string in a template, with its path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from template_strings(item, child(path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from template_strings(item, child(path, i))


def base_url(ctx: Context, value: Any, path: str) -> bool:
    # The value is never echoed: a malformed URL may still carry user:password@.
    if not isinstance(value, str) or len(value) > 500:
        ctx.error(path, "must be an http:// or https:// URL of at most 500 characters")
        return False
    if "@" in value.partition("://")[2].split("/")[0]:
        ctx.error(path, "must not hold credentials (user:password@): outbound auth comes from the provider's auth")
        return False
    try:
        parts = urlsplit(value)
        _URL(value)
    except (ValueError, ValidationError):
        ctx.error(path, "must be an http:// or https:// URL with a host, e.g. https://api.example.com")
        return False
    if parts.query or parts.fragment:
        ctx.error(path, "must not have a query string or fragment: tools add their own paths and queries")
        return False
    return True

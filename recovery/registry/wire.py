"""The registry's keys for a provider's wire format (docs/providers.md), checked field by field: a request's encoding,
query and key place (`request.encoding`, `request.query`, `request.key`), a provider's error-code paths and request-id
header. recovery.registry.format declares where each key goes; the rules that read two keys at once are here.
"""

from __future__ import annotations

from typing import Any

from recovery.engine.wire import parse_path
from recovery.registry.checks import (
    HEADER_RE,
    Context,
    Key,
    body_template,
    check_object,
    child,
    is_json_scalar,
    name,
    show,
)

ENCODINGS = ("json", "form", "none")
BODILESS = ("GET", "DELETE")


def header_name(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, str) or not HEADER_RE.fullmatch(value) or len(value) > 100:
        ctx.error(path, f"must be an HTTP header name such as X-Api-Key (got {show(value)})")
        return False
    return True


def answer_path(ctx: Context, value: Any, path: str) -> bool:
    if parse_path(value) is None:
        ctx.error(
            path,
            f"must be a path into the reply's body such as error.code, errors[0].code or name (got {show(value)})",
        )
        return False
    return True


def key_place(ctx: Context, value: Any, path: str) -> bool:
    """Where the call's idempotency key travels: {"header": name}, {"field": name} of the body, or null (nowhere)."""
    if value is None:
        return True
    passed = check_object(ctx, value, path, KEY_PLACE, "the key's place")
    if passed is None:
        return False
    if len(value) != 1:
        ctx.error(path, 'needs exactly one of header (e.g. {"header": "Idempotency-Key"}) or field, or null for none')
        return False
    return passed == set(value)


def query_template(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, dict):
        ctx.error(path, "must be an object: query parameter -> value, with {placeholders} for arguments")
        return False
    ok = True
    for key, item in value.items():
        if not key or len(key) > 100:
            ctx.error(child(path, key), "a query parameter's name is 1 to 100 characters")
            ok = False
        elif not (is_json_scalar(item) or (isinstance(item, list) and all(is_json_scalar(v) for v in item))):
            ctx.error(child(path, key), "must be a string, number, boolean or a list of them (one parameter each)")
            ok = False
    return body_template(ctx, value, path) and ok


KEY_PLACE = {
    "header": Key(header_name),
    "field": Key(name(100)),
}
ENCODINGS = ("json", "form", "none")


def check_request_wire(ctx: Context, request: dict, path: str, args: frozenset[str] | None) -> None:
    """A request's body rules: no body to encode on a GET or DELETE, none with encoding "none", and a key field
    only where there is a body that nothing else fills."""
    method = request.get("method")
    bodiless = method in BODILESS or request.get("encoding") == "none"
    if request.get("encoding") in ("json", "form") and method in BODILESS:
        ctx.error(
            child(path, "encoding"),
            f"a {method} request has no body to encode as {request['encoding']}: "
            'use "none" and put the arguments in the path or the query',
        )
    if "body" in request:
        if method in BODILESS:
            ctx.error(child(path, "body"), f"a {method} request has no body: put the arguments in the path or query")
        elif request.get("encoding") == "none":
            ctx.error(child(path, "body"), 'encoding "none" sends no body: put the arguments in the query')
    place = request.get("key")
    if isinstance(place, dict) and isinstance(place.get("field"), str):
        _check_key_field(ctx, request, place["field"], child(child(path, "key"), "field"), args, bodiless=bodiless)


def _check_key_field(ctx: Context, request: dict, field: str, path: str, args, *, bodiless: bool) -> None:
    """A key in a body field needs a body, and a field nobody else fills: the key must be the call's, unchanged."""
    if bodiless:
        ctx.error(path, "this request sends no body: put the key in a header, or null for none")
    elif args is not None and field in args:
        ctx.error(
            path,
            f"{field!r} is also an argument in args_schema: the key is the call's own, never an argument; "
            "drop it from the schema",
        )
    elif isinstance(request.get("body"), dict) and field in request["body"]:
        ctx.error(path, f"the body template also sets {field!r}: the key is put there by the console and the runtime")

"""Providers' wire formats (docs/providers.md), pure: the answer paths the registry names (`error.code`,
`errors[0].code`, `details[0].issue`), the error code a reply carries, and Stripe's form encoding.

A path is parsed once per distinct text (an LRU cache): the hot path reads codes with the paths of a handful of
providers, never parsing them again.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from recovery.engine.types import ErrorFacts, Facts

_SEGMENT = r"[A-Za-z_][A-Za-z0-9_-]*(?:\[[0-9]{1,4}\])*"
PATH_RE = re.compile(rf"^{_SEGMENT}(?:\.{_SEGMENT})*$")
_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)|\[([0-9]+)\]")
MISSING = object()


@lru_cache(maxsize=256)
def parse_path(text: str) -> tuple[str | int, ...] | None:
    """`errors[0].code` -> ("errors", 0, "code"); None when `text` is not a path."""
    if not isinstance(text, str) or len(text) > 200 or not PATH_RE.fullmatch(text):
        return None
    return tuple(name if name else int(index) for name, index in _PART.findall(text))


def read_path(value: Any, text: str) -> Any:
    """The value at path `text` in a JSON value, or MISSING (also for a text that is not a path)."""
    parts = parse_path(text)
    if parts is None:
        return MISSING
    node = value
    for part in parts:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return MISSING
        elif not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def error_code(result: Any, paths: tuple[str, ...]) -> str | None:
    """The first of `paths` that holds a code (a non-empty string, or an integer) in a reply's body; None if none
    does. Order matters: Stripe's `error.decline_code` before its more general `error.code`."""
    for text in paths:
        value = read_path(result, text)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) or (isinstance(value, str) and value.strip()):
            return str(value).strip()[:100]
    return None


def with_reply_code(facts: Facts, paths: tuple[str, ...]) -> Facts:
    """`facts` with the error code the provider's paths find in an error reply's body (the result the runtime
    reported), which wins over the code the runtime derived itself; unchanged when the provider names no paths, the
    reply is not an error or no path holds a code."""
    if not paths or facts.http_status is None or facts.http_status < 400:
        return facts
    code = error_code(facts.result, paths)
    if code is None:
        return facts
    error = facts.error or ErrorFacts()
    return replace(facts, error=ErrorFacts(kind=error.kind, code=code, message=error.message))


def form_scalar(value: Any) -> str:
    """A scalar as Stripe's libraries send it: true/false in lower case, numbers as written, null as empty."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return ""
    return str(value)


def form_pairs(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """A JSON object flattened with Stripe's bracketed nesting: {"metadata": {"a": 1}, "expand": ["x"]} ->
    [("metadata[a]", "1"), ("expand[0]", "x")] — objects as `[key]`, list items by index, as stripe-python does."""
    if isinstance(value, dict):
        pairs: list[tuple[str, str]] = []
        for key, item in value.items():
            pairs += form_pairs(item, f"{prefix}[{key}]" if prefix else str(key))
        return pairs
    if isinstance(value, list):
        pairs = []
        for index, item in enumerate(value):
            pairs += form_pairs(item, f"{prefix}[{index}]")
        return pairs
    return [(prefix, form_scalar(value))]


def form_encode(value: dict) -> str:
    """`application/x-www-form-urlencoded` text of a JSON object, brackets kept readable (Stripe's own encoding)."""
    return "&".join(f"{quote(key, safe='[]')}={quote(text, safe='')}" for key, text in form_pairs(value))

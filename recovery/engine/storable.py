"""What JSON parsing lets through but storage cannot keep (shared by the API's schemas and the callback endpoint)."""

from __future__ import annotations

import json
import math
from typing import Any

# Free-form JSON (arguments, results, deliverables) deeper than this is refused before anything walks it recursively.
MAX_JSON_DEPTH = 32


def check_storable(value: Any, where: str = "", depth: int = 0) -> None:
    """Raise ValueError, saying where, for what JSON parsing lets through but the databases cannot store or the
    fingerprint cannot hash: NUL characters (PostgreSQL text and jsonb refuse U+0000), lone surrogates (not UTF-8),
    NaN and infinities (not JSON numbers), and nesting deeper than MAX_JSON_DEPTH."""
    at = f" (at {where})" if where else ""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"text must not contain NUL (U+0000) characters{at}")
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:
                raise ValueError(f"text must be valid Unicode, not a lone surrogate escape{at}") from None
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"NaN and infinities are not JSON numbers{at}")
    elif isinstance(value, dict | list):
        if depth >= MAX_JSON_DEPTH:
            raise ValueError(f"JSON must not nest deeper than {MAX_JSON_DEPTH} levels{at}")
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            check_storable(key, f"a key in {where}" if where else "a key", depth + 1)
            check_storable(item, f"{where}.{key}" if where else str(key), depth + 1)


def loads(raw: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads for text from outside (request bodies, callbacks, provider replies), bounded in depth.

    Raises ValueError — never RecursionError — for what is not JSON or nests deeper than `max_depth`: Python's
    decoder recurses once per level and gives up with RecursionError near 1,000 levels, and every walk after it
    (redaction, storage checks) recurses too, so depth is refused here, iteratively, before anything walks it.
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"JSON must not nest deeper than {max_depth} levels") from None
    pending = [(value, 0)] if isinstance(value, dict | list) else []
    while pending:
        item, depth = pending.pop()
        if depth >= max_depth:
            raise ValueError(f"JSON must not nest deeper than {max_depth} levels")
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return value

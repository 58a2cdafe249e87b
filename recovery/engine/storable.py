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


class NotUtf8(ValueError):
    """A body that is not UTF-8: `encoding` names what it is (its byte order mark's, what its bytes look like, the
    charset its Content-Type declares), or is "invalid UTF-8" for bytes no UTF-8 text has."""

    def __init__(self, encoding: str, *, where: str = "") -> None:
        self.encoding = encoding
        said = {INVALID_UTF8: f"is not UTF-8{where}", UTF8_BOM: "starts with a byte order mark"}
        what = said.get(encoding, f"is {encoding}, not UTF-8")
        super().__init__(f"the body {what}: send it as UTF-8 JSON without a byte order mark")


INVALID_UTF8, UTF8_BOM = "invalid UTF-8", "UTF-8 with a byte order mark"
# Longest first: UTF-32-LE's mark starts with UTF-16-LE's.
_BOMS = (
    (b"\x00\x00\xfe\xff", "UTF-32-BE"),
    (b"\xff\xfe\x00\x00", "UTF-32-LE"),
    (b"\xef\xbb\xbf", UTF8_BOM),
    (b"\xfe\xff", "UTF-16-BE"),
    (b"\xff\xfe", "UTF-16-LE"),
)


def utf8_text(raw: bytes | bytearray) -> str:
    """`raw` decoded as UTF-8, or NotUtf8 naming the encoding: a byte order mark (even UTF-8's), UTF-16 or UTF-32
    without one (recognised as json.detect_encoding does, by where the NUL bytes of the first characters fall), or
    bytes that are not UTF-8 at all."""
    for bom, name in _BOMS:
        if raw.startswith(bom):
            raise NotUtf8(name)
    guessed = json.detect_encoding(bytes(raw[:4]))
    if guessed != "utf-8":
        raise NotUtf8(guessed.upper())
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(INVALID_UTF8, where=f" (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


def loads(raw: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads for text from outside (request bodies, callbacks, provider replies), bounded in depth.

    Raises ValueError — never RecursionError — for what is not JSON or nests deeper than `max_depth`: Python's
    decoder recurses once per level and gives up with RecursionError near 1,000 levels, and every walk after it
    (redaction, storage checks) recurses too, so depth is refused here, iteratively, before anything walks it.
    Bytes must be UTF-8 (RFC 8259, section 8.1), without a byte order mark: json.loads would also read UTF-16 and
    UTF-32 and skip a BOM, so a body in another encoding is refused here with its name (NotUtf8) rather than read.
    """
    if isinstance(raw, bytes | bytearray):
        raw = utf8_text(raw)
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

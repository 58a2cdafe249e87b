"""Canonical JSON (docs/design/gate.md, "The fingerprint"): one byte string per value, whatever the key order or number
spelling, so a value read back from PostgreSQL's jsonb or SQLite's JSON text hashes as it did when it was written.
Fingerprints and audit hashes both use it.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


def normalize(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError("NaN and infinities are not JSON numbers")
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"object keys must be strings, got {type(key).__name__}")
            out[key] = normalize(item)
        return out
    if isinstance(value, (list, tuple)):
        return [normalize(item) for item in value]
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def canonical_json(value: Any) -> str:
    return json.dumps(normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_digest(value: Any) -> str:
    """sha256 of the canonical JSON: the same value hashes the same whatever its key order or number spelling."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()

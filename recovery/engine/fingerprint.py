"""The call fingerprint of docs/design/gate.md: sha256(tool + ":" + canonical_json(args)), the key of its two guards
(no progress, duplicate intent).
"""

from __future__ import annotations

import hashlib

from recovery.engine.canonical import canonical_json


def fingerprint(tool: str, args: dict) -> str:
    return hashlib.sha256(f"{tool}:{canonical_json(args)}".encode()).hexdigest()

"""The call fingerprint of docs/design/gate.md: sha256(tool + ":" + canonical_json(args)).

Key order and number spelling (800 vs 800.0) do not change it; any business field, or a value's type ("800" vs
800), does. Two guards use it: no progress (the same fingerprint is not re-admitted on time alone after a
non-transient failure) and duplicate intent (one write intent per task, whatever its idempotency key).
"""

from __future__ import annotations

import hashlib

from recovery.engine.canonical import canonical_json


def fingerprint(tool: str, args: dict) -> str:
    return hashlib.sha256(f"{tool}:{canonical_json(args)}".encode()).hexdigest()

"""Signed checkpoints of the audit heads, written outside the database, and their verification (docs/design/audit.md,
"Checkpoints outside the database"). No checkpoint is written when the database no longer holds what the last one
recorded: a rewound trail is never recorded as the truth.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import connections
from django.db.models import Q

from recovery.audit.chain import GLOBAL, Keyring, purged_chains, purged_ranges
from recovery.engine.canonical import canonical_json
from recovery.models import AuditChainHead, AuditEvent

logger = logging.getLogger("recovery.audit")
VERSION = 1
_PATTERN = "checkpoint-*.json"
_CHUNK = 500  # (chain, number) pairs looked up per statement when verifying


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    body: dict

    @property
    def global_length(self) -> int:
        return self.body["global"][0]


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob(_PATTERN)) if directory.is_dir() else []


def _read(path: Path, keyring: Keyring) -> tuple[Checkpoint | None, str | None]:
    """The checkpoint in `path` if its signature holds; else the problem."""
    try:
        document = json.loads(path.read_text())
        body, key_id, signature = document["body"], document["key_id"], document["signature"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"checkpoint {path.name} is not a readable checkpoint file"
    signed = keyring.check(canonical_json(body), key_id, signature)
    if signed is None:
        return None, f"checkpoint {path.name} is signed with audit key {key_id!r}, which RECOVERY_AUDIT_KEYS lacks"
    if not signed:
        return None, f"checkpoint {path.name} does not match its signature: the file was altered"
    return Checkpoint(path, body), None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def trail_directory(root: Path | None = None, using: str = "default") -> Path:
    """Where this database's checkpoints go: a folder of the root per database (vendor and name), so the trails of
    two databases — a test run's, a developer's — never mix in one directory."""
    root = Path(root or settings.RECOVERY_AUDIT_CHECKPOINT_DIR)
    config = connections[using].settings_dict
    name = Path(config["NAME"]).name if connections[using].vendor == "sqlite" else config["NAME"]
    host = f"{config.get('HOST') or 'local'}-{config.get('PORT') or ''}".strip("-")
    label = f"{connections[using].vendor}-{host}-{name}" if connections[using].vendor != "sqlite" else f"sqlite-{name}"
    return root / re.sub(r"[^A-Za-z0-9_.-]+", "_", label)


class CheckpointRefused(RuntimeError):
    """The database no longer holds the head the last checkpoint recorded: no new checkpoint may paper over it."""


def checkpoint_write(directory: Path | None = None, *, now: datetime | None = None) -> Path | None:
    """Write a checkpoint of the global head and of every chain head that moved since the last checkpoint in
    `directory` (default: this database's folder of RECOVERY_AUDIT_CHECKPOINT_DIR; all chains for the first one);
    None when nothing was appended since. Raises CheckpointRefused when the trail lost what the last checkpoint
    recorded (a checkpoint written now would record the rewound heads as if they were the truth)."""
    directory = Path(directory) if directory is not None else trail_directory()
    directory.mkdir(parents=True, exist_ok=True)
    keyring = Keyring.from_settings()
    files = _files(directory)
    last = _read(files[-1], keyring)[0] if files else None
    head = AuditChainHead.objects.filter(key=GLOBAL).values_list("length", "head_hash").first() or (0, "")
    since = last.global_length if last else 0
    if last is not None and (problem := _check_global(last, "default", current=head[0])):
        raise CheckpointRefused(
            f"{problem}. No checkpoint is written until this is resolved: run verify_audit --checkpoints {directory} "
            "(a database recreated on purpose needs a new checkpoint directory)"
        )
    if last is not None and head[0] == since:
        return None
    # Events commit in global order (the global head is locked to each commit), so the chains that moved since the
    # last checkpoint are the chains of events numbered after its global length.
    moved = AuditEvent.objects.filter(seq__gt=since).values_list("chain", flat=True).distinct()
    heads = AuditChainHead.objects.exclude(key=GLOBAL).filter(length__gt=0)
    heads = heads.filter(key__in=moved) if last is not None else heads
    first_keyed = (last.body.get("first_keyed_seq") if last else None) or (
        AuditEvent.objects.exclude(hmac="").order_by("seq").values_list("seq", flat=True).first()
    )
    now = now or datetime.now(UTC)
    body = {
        "version": VERSION,
        "written_at": now.isoformat(timespec="seconds"),
        "global": [head[0], head[1]],
        "chains": {
            key: [length, head_hash] for key, length, head_hash in heads.values_list("key", "length", "head_hash")
        },
        "first_keyed_seq": first_keyed,
        "previous": _digest(files[-1]) if files else None,
    }
    document = {"body": body, "key_id": keyring.signing_id, "signature": keyring.sign(canonical_json(body))}
    path = directory / f"checkpoint-{head[0]:012d}-{now:%Y%m%dT%H%M%SZ}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(document, separators=(",", ":")))
    os.replace(partial, path)  # a reader sees the whole file or none of it
    logger.info("audit checkpoint %s: global #%s, %s chain heads", path.name, head[0], len(body["chains"]))
    return path


@dataclass(frozen=True, kw_only=True)
class CheckpointReport:
    checkpoints: int
    chains: int
    covered_seq: int  # the global length the last checkpoint covers: events after it are the unprotected window
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify_checkpoints(directory: Path, using: str = "default") -> CheckpointReport:
    """Check the database against every checkpoint in `directory` — this database's folder, or a root holding it
    (see trail_directory) — as the module's text says."""
    keyring = Keyring.from_settings()
    directory = Path(directory)
    if not _files(directory) and _files(trail_directory(directory, using)):
        directory = trail_directory(directory, using)
    files = _files(directory)
    if not files:
        return CheckpointReport(checkpoints=0, chains=0, covered_seq=0, problem=f"no checkpoints in {directory}")
    # Per chain, the longest head any checkpoint recorded: events are append-only, so that event must still be there
    # (a chain recorded shorter by a later checkpoint was rewound between the two).
    latest: dict[str, tuple[int, str, str]] = {}  # chain -> (length, hash, the checkpoint that recorded it)
    previous, last = None, None
    for path in files:
        checkpoint, problem = _read(path, keyring)
        if problem:
            return CheckpointReport(checkpoints=0, chains=0, covered_seq=0, problem=problem)
        if last is not None and checkpoint.global_length < last.global_length:
            problem = f"checkpoint {path.name} records the trail shorter than {last.path.name}: it was rewound"
            return CheckpointReport(checkpoints=0, chains=0, covered_seq=0, problem=problem)
        if previous is not None and checkpoint.body.get("previous") != _digest(previous):
            problem = (
                f"checkpoint {path.name} does not follow {previous.name}: a checkpoint file was removed or altered"
            )
            return CheckpointReport(checkpoints=0, chains=0, covered_seq=0, problem=problem)
        for chain, (length, head_hash) in checkpoint.body["chains"].items():
            if chain in latest and length < latest[chain][0]:
                problem = (
                    f"checkpoint {path.name} records chain {chain} at #{length} after {latest[chain][2]} recorded "
                    f"#{latest[chain][0]}: the chain was rewound between them"
                )
                return CheckpointReport(checkpoints=0, chains=0, covered_seq=0, problem=problem)
            latest[chain] = (length, head_hash, path.name)
        previous, last = path, checkpoint
    problem = _check_chains(latest, using) or _check_global(last, using) or _check_keyed(last, using)
    return CheckpointReport(checkpoints=len(files), chains=len(latest), covered_seq=last.global_length, problem=problem)


def _check_chains(latest: dict[str, tuple[int, str, str]], using: str) -> str | None:
    purged = purged_chains(using)
    wanted = [(chain, entry) for chain, entry in sorted(latest.items()) if chain not in purged and entry[0] > 0]
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        match = Q()
        for chain, (length, _, _) in chunk:
            match |= Q(chain=chain, chain_seq=length)
        found = dict(
            ((chain, number), digest)
            for chain, number, digest in AuditEvent.objects.using(using)
            .filter(match)
            .values_list("chain", "chain_seq", "hash")
        )
        for chain, (length, head_hash, name) in chunk:
            digest = found.get((chain, length))
            if digest is None:
                return (
                    f"chain {chain}: event #{length}, its head in checkpoint {name}, is missing: the tail was removed"
                )
            if digest != head_hash:
                return (
                    f"chain {chain}: event #{length} is not the one checkpoint {name} recorded: the chain was rewritten"
                )
    return None


def _check_global(last: Checkpoint, using: str, *, current: int | None = None) -> str | None:
    length, head_hash = last.body["global"]
    if current is not None and current < length:
        return f"the global head is at #{current}, behind #{length} that checkpoint {last.path.name} recorded"
    if length == 0 or any(low <= length <= high for low, high in purged_ranges(using)):
        return None
    digest = AuditEvent.objects.using(using).filter(seq=length).values_list("hash", flat=True).first()
    if digest is None:
        return f"global event #{length}, the head in checkpoint {last.path.name}, is missing: the tail was removed"
    if digest != head_hash:
        return f"global event #{length} is not the one checkpoint {last.path.name} recorded: it was rewritten"
    return None


def _check_keyed(last: Checkpoint, using: str) -> str | None:
    first = last.body.get("first_keyed_seq")
    if first is None:
        return None
    stripped = AuditEvent.objects.using(using).filter(seq__gte=first, hmac="").values_list("seq", flat=True).first()
    if stripped is not None:
        return f"event #{stripped} carries no HMAC although keys signed every event from #{first} on: stripped"
    return None

"""`manage.py load_tools FILE.json`: create or update tenants, providers and tools from a registry file.

An invalid file is rejected whole: every error is printed with its JSON path and nothing is written. Loading the
same file again changes nothing and records nothing.
"""

import hashlib
import json
from collections import Counter
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from recovery.audit.chain import Actor
from recovery.registry import LoadReport, RegistryInvalid, load_registry, validate_registry


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict:
    counts = Counter(key for key, _ in pairs)
    duplicated = sorted(key for key, n in counts.items() if n > 1)
    if duplicated:
        # json would keep the last one silently; in a registry that hides a setting someone meant to apply.
        raise ValueError(f"the key {duplicated[0]!r} appears twice in one object")
    return dict(pairs)


def parse_registry(raw: bytes, source: str) -> object:
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant, object_pairs_hook=_refuse_duplicates)
    except UnicodeDecodeError:
        raise CommandError(f"{source} is not UTF-8 text: a registry file is JSON") from None
    except json.JSONDecodeError as exc:
        raise CommandError(f"{source} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        raise CommandError(f"{source} is not valid registry JSON: {exc}") from None


class Command(BaseCommand):
    help = (
        "Create or update tenants, providers and tools from a registry JSON file (see docs/registry.md). "
        "An invalid file is rejected whole, listing every error with its JSON path."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="the registry file, e.g. recovery/fixtures/registry.example.json")
        parser.add_argument("--check", action="store_true", help="validate only: report errors, write nothing")

    def handle(self, *args, file, check, **options):
        try:
            raw = Path(file).read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror}") from None
        data = parse_registry(raw, file)
        try:
            if check:
                errors = validate_registry(data)
                if errors:
                    raise RegistryInvalid(errors)
                self.stdout.write(f"{file}: valid")
                return
            report = load_registry(
                data, actor=Actor.system("load_tools"), source=file, sha256=hashlib.sha256(raw).hexdigest()
            )
        except RegistryInvalid as exc:
            for error in exc.errors:
                self.stderr.write(f"{error.path}: {error.message}")
            raise CommandError(f"{file}: {len(exc.errors)} error(s); nothing was loaded") from None
        self.stdout.write(summary(report, file))


def summary(report: LoadReport, source: str) -> str:
    lines = [f"{source} (sha256 {report.sha256[:12]}): {'loaded' if report.changed else 'nothing changed'}"]
    for kind, counts in report.counts().items():
        lines.append(
            f"  {kind + ':':<11}{counts['created']} created, {counts['updated']} updated, "
            f"{counts['unchanged']} unchanged"
        )
    for kind in ("tenants", "providers", "tools"):
        for name, fields in getattr(report, kind).updated.items():
            lines.append(f"  updated {kind[:-1]} {name}: {', '.join(fields)}")
    return "\n".join(lines)

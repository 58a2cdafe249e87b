"""`manage.py load_tools FILE.json`: create or update tenants, providers and tools from a registry file.

An invalid file is rejected whole: every error is printed with its JSON path and nothing is written. Loading the
same file again changes nothing and records nothing.
"""

import hashlib
import json
from collections import Counter
from pathlib import Path

import anyio
from django.core.management.base import BaseCommand, CommandError

from recovery.audit.chain import Actor
from recovery.models import Provider
from recovery.providers.mcp import list_tools
from recovery.registry import LoadReport, RegistryInvalid, load_registry, validate_registry
from recovery.registry.mcp import registry_stub


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
        parser.add_argument("file", nargs="?", help="the registry file, e.g. recovery/fixtures/registry.example.json")
        parser.add_argument("--check", action="store_true", help="validate only: report errors, write nothing")
        parser.add_argument(
            "--from-mcp",
            metavar="PROVIDER",
            help="print a registry stub of an MCP provider's live tools/list for an admin to review; loads nothing",
        )

    def handle(self, *args, file, check, from_mcp=None, **options):
        if from_mcp:
            self.stdout.write(json.dumps(mcp_stub(from_mcp), indent=2, sort_keys=True))
            return
        if not file:
            raise CommandError("name a registry file (or --from-mcp PROVIDER)")
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


def mcp_stub(name: str) -> dict:
    """The registry entries an MCP provider's tools/list suggests (docs/mcp-gateway.md)."""
    provider = Provider.objects.filter(name=name).first()
    if provider is None or not provider.mcp:
        raise CommandError(f"{name!r} is not an MCP provider of the registry")
    try:
        listed = anyio.run(list_tools, provider)
    except Exception as exc:  # the server's own failure, shown as the reason
        raise CommandError(f"{name}: tools/list failed: {type(exc).__name__}: {exc}") from None
    return registry_stub(name, [tool.model_dump(by_alias=True, exclude_none=True) for tool in listed])


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

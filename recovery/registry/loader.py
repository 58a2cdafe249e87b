"""Loading a registry file (docs/registry.md): all of it or nothing, declarative for the objects it names, never a
tool's retry path (a provider's new base URL voids it, docs/replay.md), and nothing at all when nothing changed —
values compared in canonical JSON, so 3 and 3.0 or a JSON field's key order are not changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from django.db import models, transaction

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.canonical import canonical_digest, canonical_json, normalize
from recovery.models import Provider, RetryPath, Tenant, Tool
from recovery.registry.checks import RegistryInvalid
from recovery.registry.format import validate_registry

CREATED, UPDATED, UNCHANGED = "created", "updated", "unchanged"
PROVIDER_FIELDS = (
    "base_url",
    "connect_timeout_s",
    "read_timeout_s",
    "auth",
    "callback_secret_env",
    "idempotency_conflict_codes",
    "status_breaker",
    "error_code_paths",
    "request_id_header",
    "mcp",
)
TOOL_FIELDS = (
    "description",
    "request",
    "side_effect",
    "risk",
    "replay_safe",
    "provider_ref_field",
    "key_template",
    "args_schema",
    "result_schema",
    "required_result_fields",
    "max_result_age_s",
    "result_time_field",
    "invariants",
    "approvable_codes",
    "refusal_codes",
    "outcome_timeout_s",
    "key_retention_s",
    "status_query",
    "reconcile",
    "compensation",
    "budgets",
    "backoff",
    "breaker",
    "fallback",
    "exhausted_to_review",
    "mcp",
)


@dataclass(frozen=True, kw_only=True)
class KindReport:
    created: tuple[str, ...] = ()
    updated: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> the fields that changed
    unchanged: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        return {CREATED: len(self.created), UPDATED: len(self.updated), UNCHANGED: len(self.unchanged)}


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    sha256: str
    tenants: KindReport
    providers: KindReport
    tools: KindReport
    audit_event_id: int | None = None  # the registry.loaded event; None when nothing changed

    @property
    def changed(self) -> bool:
        return any(kind.created or kind.updated for kind in (self.tenants, self.providers, self.tools))

    def counts(self) -> dict[str, dict[str, int]]:
        return {"tenants": self.tenants.counts(), "providers": self.providers.counts(), "tools": self.tools.counts()}


def registry_sha256(data: Any) -> str:
    """The hash of a registry's content (canonical JSON): whitespace and key order do not change it."""
    return canonical_digest(data)


def _default(model: type[models.Model], name: str) -> Any:
    return model._meta.get_field(name).get_default()


def _row(model: type[models.Model], item: dict, names: tuple[str, ...]) -> dict[str, Any]:
    """The column values an item describes: the file's (normalized JSON), else the model's default."""
    return {name: normalize(item[name]) if name in item else _default(model, name) for name in names}


def _same(a: Any, b: Any) -> bool:
    return canonical_json(a) == canonical_json(b)


class _Ledger:
    """What a load did, per kind; merges row and many-to-many changes of the same object."""

    def __init__(self) -> None:
        self.status: dict[str, dict[str, str]] = {"tenants": {}, "providers": {}, "tools": {}}
        self.fields: dict[str, dict[str, list[str]]] = {"tenants": {}, "providers": {}, "tools": {}}

    def record(self, kind: str, name: str, status: str, fields: list[str]) -> None:
        previous = self.status[kind].get(name)
        if previous == CREATED or status == CREATED:
            self.status[kind][name] = CREATED
        elif status == UPDATED or previous == UPDATED:
            self.status[kind][name] = UPDATED
        else:
            self.status[kind][name] = UNCHANGED
        self.fields[kind].setdefault(name, []).extend(fields)

    def report(self, kind: str) -> KindReport:
        by_status = self.status[kind]
        return KindReport(
            created=tuple(n for n, s in by_status.items() if s == CREATED),
            updated={n: tuple(self.fields[kind][n]) for n, s in by_status.items() if s == UPDATED},
            unchanged=tuple(n for n, s in by_status.items() if s == UNCHANGED),
        )


def _upsert(model: type[models.Model], name: str, row: dict[str, Any], existing: dict[str, Any]):
    """Create the row, or update only the fields that differ; returns (object, status, changed fields)."""
    obj = existing.get(name)
    if obj is None:
        return model.objects.create(name=name, **row), CREATED, []
    changed = [key for key, value in row.items() if not _same(getattr(obj, key), value)]
    if not changed:
        return obj, UNCHANGED, []
    for key in changed:
        setattr(obj, key, row[key])
    touched = ["updated_at"] if any(f.name == "updated_at" for f in model._meta.fields) else []
    obj.save(update_fields=changed + touched)
    return obj, UPDATED, [key.removesuffix("_id") for key in changed]


def _set_m2m(manager, wanted: dict[str, int], current: set[str]) -> bool:
    if set(wanted) == current:
        return False
    manager.set(list(wanted.values()))
    return True


def _load_providers(items: list[dict], ledger: _Ledger) -> None:
    existing = {p.name: p for p in Provider.objects.select_for_update().filter(name__in=[i["name"] for i in items])}
    for item in items:
        row = _row(Provider, item, PROVIDER_FIELDS)
        for key in ("connect_timeout_s", "read_timeout_s"):
            row[key] = float(row[key])
        before = existing.get(item["name"])
        old_url = before.base_url if before is not None else ""
        provider, status, changed = _upsert(Provider, item["name"], row, existing)
        if "base_url" in changed:
            void_retry_paths(provider, old_url)
        ledger.record("providers", item["name"], status, changed)


def _load_tools(items: list[dict], ledger: _Ledger) -> None:
    names = [item["name"] for item in items]
    existing = {
        t.name: t for t in Tool.objects.select_for_update().filter(name__in=names).prefetch_related("alternates")
    }
    provider_ids = dict(Provider.objects.filter(name__in={i["provider"] for i in items}).values_list("name", "id"))
    saved = {}
    for item in items:
        row = {"provider_id": provider_ids[item["provider"]], **_row(Tool, item, TOOL_FIELDS)}
        if row["status_query"] is None:  # the registry declares no status API (replay reconciliation only)
            row["status_query"] = {}
        row["key_retention_declared"] = "key_retention_s" in item
        saved[item["name"]], status, changed = _upsert(Tool, item["name"], row, existing)
        ledger.record("tools", item["name"], status, changed)
    # Alternates may name tools created just above, so they are set once every row exists.
    wanted = {a for item in items for a in item.get("alternates", [])}
    tool_ids = dict(Tool.objects.filter(name__in=wanted).values_list("name", "id"))
    for item in items:
        tool = saved[item["name"]]
        current = set() if item["name"] not in existing else {a.name for a in tool.alternates.all()}
        alternates = {name: tool_ids[name] for name in item.get("alternates", [])}
        if _set_m2m(tool.alternates, alternates, current):
            ledger.record("tools", item["name"], UPDATED, ["alternates"])


def _load_tenants(items: list[dict], ledger: _Ledger) -> None:
    existing = {
        t.name: t
        for t in Tenant.objects.select_for_update()
        .filter(name__in=[i["name"] for i in items])
        .prefetch_related("tools")
    }
    wanted = {name for item in items if isinstance(item.get("tools"), list) for name in item["tools"]}
    tool_ids = dict(Tool.objects.filter(name__in=wanted).values_list("name", "id"))
    for item in items:
        listed = item.get("tools", [])
        row = _row(Tenant, item, ("display_name", "sandbox"))
        row["all_tools"] = listed == "*"
        tenant, status, changed = _upsert(Tenant, item["name"], row, existing)
        current = set() if item["name"] not in existing else {t.name for t in tenant.tools.all()}
        tools = {} if listed == "*" else {name: tool_ids[name] for name in listed}
        if _set_m2m(tenant.tools, tools, current):
            status, changed = (status if status == CREATED else UPDATED), [*changed, "tools"]
        ledger.record("tenants", item["name"], status, changed)


def load_registry(data: dict, *, actor: Actor, source: str = "", sha256: str | None = None) -> LoadReport:
    """Validate, then create or update everything the file names in one transaction; raises RegistryInvalid.

    `sha256` is the file's own hash when the caller read a file (load_tools does), else the canonical content's.
    """
    ledger = _Ledger()
    with transaction.atomic():
        # Validated inside the transaction, so the rows a reference was checked against are the ones it links to.
        errors = validate_registry(data)
        if errors:
            raise RegistryInvalid(errors)
        sha256 = sha256 or registry_sha256(data)
        # Rows are locked in a fixed order (providers, tools, tenants), so two concurrent loads queue, not deadlock;
        # two loads creating the same new name race on its unique index and the loser rolls back whole.
        _load_providers(data.get("providers", []), ledger)
        _load_tools(data.get("tools", []), ledger)
        _load_tenants(data.get("tenants", []), ledger)
        report = LoadReport(
            sha256=sha256,
            tenants=ledger.report("tenants"),
            providers=ledger.report("providers"),
            tools=ledger.report("tools"),
        )
        if not report.changed:
            return report
        event = append_event(
            action=AuditAction.REGISTRY_LOADED,
            actor=actor,
            reason=_reason(report),
            evidence=_evidence(report, source),
        )
    return replace(report, audit_event_id=event.pk)


def provider_move(*, name: str, base_url: str, actor: Actor, source: str) -> bool:
    """Point provider `name` at `base_url`, nothing else changed, audited as a load of that one field; whether it
    moved (False when it is there already or there is no such provider). `make run` keeps the shipped sandbox
    provider at RECOVERY_SANDBOX_ADDR with it."""
    ledger = _Ledger()
    with transaction.atomic():
        existing = {p.name: p for p in Provider.objects.select_for_update().filter(name=name)}
        if name not in existing:
            return False
        old_url = existing[name].base_url
        provider, status, changed = _upsert(Provider, name, {"base_url": base_url}, existing)
        if status == UNCHANGED:
            return False
        void_retry_paths(provider, old_url)
        ledger.record("providers", name, status, changed)
        report = LoadReport(
            sha256=registry_sha256({"providers": [{"name": name, "base_url": base_url}]}),
            tenants=ledger.report("tenants"),
            providers=ledger.report("providers"),
            tools=ledger.report("tools"),
        )
        append_event(
            action=AuditAction.REGISTRY_LOADED, actor=actor, reason=_reason(report), evidence=_evidence(report, source)
        )
    return True


def void_retry_paths(provider: Provider, old_url: str) -> int:
    """A provider moved: its tools' probes proved what the old address answered, so their retry paths go back to
    unprobed (in the load's transaction); how many tools had one."""
    from django.utils import timezone

    reason = f"voided: the provider's base URL changed from {old_url} to {provider.base_url}"
    voided = list(
        Tool.objects.filter(provider=provider)
        .exclude(retry_path=RetryPath.UNPROBED)
        .values_list("pk", "name", "retry_path")
    )
    Tool.objects.filter(pk__in=[pk for pk, _, _ in voided]).update(
        retry_path=RetryPath.UNPROBED,
        retry_path_probe=None,
        retry_path_key_age_s=None,
        retry_path_reason=reason,
        retry_path_changed_at=timezone.now(),
    )
    for _, name, before in voided:
        append_event(
            action=AuditAction.RETRY_PATH_CHANGED,
            actor=Actor.system("registry"),
            from_state=before,
            to_state=RetryPath.UNPROBED,
            reason=f"{name}: retry path {before} → unprobed: {reason}",
            evidence={"tool": name, "probe": None, "base_url": provider.base_url},
        )
    return len(voided)


def _reason(report: LoadReport) -> str:
    parts = []
    for kind, counts in report.counts().items():
        if counts[CREATED] or counts[UPDATED]:
            parts.append(f"{kind}: {counts[CREATED]} created, {counts[UPDATED]} updated")
    return "registry loaded; " + "; ".join(parts)


def _evidence(report: LoadReport, source: str) -> dict:
    kinds = {"tenants": report.tenants, "providers": report.providers, "tools": report.tools}
    return {
        "sha256": report.sha256,
        "source": source,
        "counts": report.counts(),
        "created": {kind: list(r.created) for kind, r in kinds.items() if r.created},
        "updated": {kind: {n: list(f) for n, f in r.updated.items()} for kind, r in kinds.items() if r.updated},
    }

"""The tool registry as configuration (docs/registry.md; docs/design/classification.md-docs/breakers.md,
docs/design/idempotency.md, docs/reconciliation.md, docs/design/budgets.md).

- `validate_registry(data)` lists every problem of a registry file with its JSON path;
- `load_registry(data, actor=...)` creates or updates tenants, providers and tools, all or nothing, with one audit
  event when something changed (`manage.py load_tools FILE.json` is its command line);
- `tool_policy(tool)` is the engine's frozen view of a Tool row.

The Django admin validates its edits with the same rules (recovery/admin.py).
"""

from recovery.registry.checks import RegistryError, RegistryInvalid
from recovery.registry.format import validate_registry
from recovery.registry.loader import KindReport, LoadReport, load_registry, provider_move, registry_sha256
from recovery.registry.policy import policy_tools, tool_policy, with_alternates

__all__ = [
    "KindReport",
    "LoadReport",
    "RegistryError",
    "RegistryInvalid",
    "load_registry",
    "policy_tools",
    "provider_move",
    "registry_sha256",
    "tool_policy",
    "validate_registry",
    "with_alternates",
]

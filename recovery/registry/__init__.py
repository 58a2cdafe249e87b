"""The tool registry as configuration (docs/registry.md): `validate_registry(data)` lists every problem of a file with
its JSON path, `load_registry(data, actor=...)` loads it all or nothing (`manage.py load_tools`), and
`tool_policy(tool)` is the engine's frozen view of a Tool row. The Django admin validates with the same rules.
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

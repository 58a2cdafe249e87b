"""Deprecated: the Python client is the distribution `recovery-console-client` now (clients/python; how to install
it and which consoles it talks to: docs/recovered-tools.md#install). Import `recovery_client` instead:

    from recovery_client import RecoveryClient, recovered      # instead of: from recovery.client import ...

This package only re-exports it, for this release, and goes in the next one: `recovery.client`,
`recovery.client.recovered`, `recovery.client.runtime` and `recovery.client.types` are the very modules of
`recovery_client`, and importing it warns (DeprecationWarning). Nothing in this repository imports it
(tests/test_layout.py). The demo agent's registry-driven tool calls (`Agent.run_call`, `ToolBook`) were never part
of the client: they are the console's tooling, `recovery.devtools.agent`.
"""

import sys
import warnings

import recovery_client
from recovery_client import *  # noqa: F403  (its public names, `__all__`)
from recovery_client import __all__, __version__, recovered, runtime, types  # noqa: F401

warnings.warn(
    "recovery.client is deprecated and goes in the next release: import recovery_client "
    "(pip install clients/python; docs/recovered-tools.md#install)",
    DeprecationWarning,
    stacklevel=2,
)

# `import recovery.client.recovered` (and the others) finds the same module as before the move.
for _name in ("recovered", "runtime", "types"):
    sys.modules[f"{__name__}.{_name}"] = getattr(recovery_client, _name)

"""Deprecated: the Python client is the distribution `recovery-console-client` (clients/python;
docs/recovered-tools.md#install). Import `recovery_client` instead. This package only re-exports it for this release,
warns on import (DeprecationWarning), and goes in the next one; nothing in this repository imports it.
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

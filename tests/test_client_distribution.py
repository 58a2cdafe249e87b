"""The client as the distribution agents install (clients/python, docs/recovered-tools.md#install).

- `recovery.client` is still importable for this release, as a re-export of `recovery_client` that warns.
"""

from __future__ import annotations

import subprocess
import sys

from tests.servers import ROOT


def test_recovery_client_is_still_importable_as_a_deprecated_re_export():
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import recovery.client as old, recovery.client.recovered as old_recovered\n"
        "    from recovery.client.runtime import Runtime\n"
        "    from recovery.client.types import Task\n"
        "import sys, recovery_client as new, recovery_client.runtime\n"
        "assert [w.category for w in seen] == [DeprecationWarning], seen\n"
        "assert 'import recovery_client' in str(seen[0].message), seen[0].message\n"
        "assert old.__all__ == new.__all__ and all(getattr(old, n) is getattr(new, n) for n in new.__all__)\n"
        "assert old_recovered is new.recovered and Runtime is recovery_client.runtime.Runtime and Task is new.Task\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'ninja', 'pydantic')]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

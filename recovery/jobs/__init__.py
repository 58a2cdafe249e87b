"""Background jobs (docs/reconciliation.md): the thin job functions (recovery.jobs.tasks), how they are queued on RQ
or in-process, and the periodic schedule.

Jobs queued before the job functions moved into recovery.jobs.tasks are stored in Redis under their old dotted path
`recovery.jobs.<name>`; this module resolves those names so such jobs still run.
"""

import importlib


def __getattr__(name: str):
    # Called only for names this package does not have; a submodule being imported is never asked for here.
    if name.startswith("_") or name in {"tasks", "queueing", "inprocess", "cron", "schedule"}:
        raise AttributeError(f"module 'recovery.jobs' has no attribute {name!r}")
    try:
        return getattr(importlib.import_module("recovery.jobs.tasks"), name)
    except AttributeError:
        raise AttributeError(f"module 'recovery.jobs' has no attribute {name!r}") from None

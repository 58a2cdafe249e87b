"""Fault drills (docs/drills.md): the demo agent driven through the real API, jobs and sandbox, against pinned
expectations. `stage` starts what a run needs; `table` pins each drill's ends; `cases` holds the drills (one module
each, playing on a `framework.Run` and stating `checks`); `judge` compares a run with the table from the sandbox's and
the database's `evidence`; `report` prints it; `runner` runs one; `manage.py drill` runs them and stores a DrillRun.
"""

"""Fault drills (docs/drills.md): the demo agent driven through the real API, jobs and sandbox, against pinned
expectations.

`stage` starts (or borrows) what a run needs — a sandbox process, the API over HTTP, background jobs — and loads the
drill registry (the shipped sandbox registry under `drill.` names, quick schedules, its own tenant and provider).
`table` pins what each drill must end with; `cases` holds the drills, one module each, playing on a `framework.Run`
and stating their checks as expected and observed values (`checks`); `judge` compares a run with the table from the
sandbox's ledger and request log and the database's audit trail (`evidence`); `report` prints it; `runner` runs
drills one after another; `manage.py drill` runs them and stores a DrillRun.
"""

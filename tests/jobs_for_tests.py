"""Job functions for tests/test_jobs.py: real module-level functions, so an RQ worker process can import them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from recovery.jobs import queueing


def append_line(path: str, text: str) -> None:
    with Path(path).open("a") as file:
        file.write(text + "\n")


def append_slowly(path: str, text: str, seconds: float) -> None:
    time.sleep(seconds)
    append_line(path, text)


def fail(message: str) -> None:
    raise RuntimeError(message)


# A kicked job (recovery.jobs.queueing.kick_now) that starts as recovery.jobs.tasks.reconcile_now does, then holds its
# thread until the test lets it go.
kicked_runs: list[str] = []
kicked_release = threading.Event()


def kicked(name: str, token: str) -> None:
    queueing.kick_started(name, token)
    kicked_runs.append(token)
    kicked_release.wait(10)

"""Job functions for tests/test_jobs.py: real module-level functions, so an RQ worker process can import them."""

from __future__ import annotations

import time
from pathlib import Path


def append_line(path: str, text: str) -> None:
    with Path(path).open("a") as file:
        file.write(text + "\n")


def append_slowly(path: str, text: str, seconds: float) -> None:
    time.sleep(seconds)
    append_line(path, text)


def fail(message: str) -> None:
    raise RuntimeError(message)

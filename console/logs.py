"""Logging filters for the console's settings (console/settings.py's LOGGING)."""

from __future__ import annotations

import logging

EXPECTED = {409}  # the API's refusals: an answer to the runtime, not a fault of the server


class ExpectedRefusals(logging.Filter):
    """A request log record of an expected refusal is lowered from WARNING to INFO (kept, never dropped)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) in EXPECTED and record.levelno == logging.WARNING:
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True

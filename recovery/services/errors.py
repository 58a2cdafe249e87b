"""A service's refusal as a value (docs/design/gate.md): one type for every service, raised before anything is written.
The API maps it to its error envelope (recovery.api.routes), the console to a message beside the form field it names
(console.views.common.place_refusal); both answer with its HTTP status."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict

from recovery.engine.types import FieldError

# The status of a refusal whose raiser names none: bad input is 400, a missing role 403, the rest a conflict with the
# state of things (stale, expired, not pending, forbidden here, four eyes…).
STATUS_BY_CODE = {"reason": 400, "evidence": 400, "selection": 400, "role": 403}


class Refusal(Exception):
    """A refusal: a machine code, a message for a person, its HTTP status, and what it is about — `field` (the form
    field a page shows it next to) and/or `field_errors` (the API's per-field errors) — with any detail."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        field: str = "",
        field_errors: Iterable[FieldError | dict] = (),
        detail: dict | None = None,
    ):
        super().__init__(message)
        self.code, self.message, self.field = code, message, field
        self.status = status if status is not None else STATUS_BY_CODE.get(code, 409)
        self.field_errors = tuple(field_errors)
        self.detail = detail or {}


def field_errors_json(errors: Iterable[FieldError | dict]) -> list[dict]:
    return [asdict(e) if isinstance(e, FieldError) else dict(e) for e in errors]

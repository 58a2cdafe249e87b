"""A service's refusal as a value (docs/design/gate.md): an HTTP status, a machine code, a message, the fields at fault
and any detail. A refused request writes nothing; the API turns the error into its one error envelope."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict

from recovery.engine.types import FieldError


class ServiceError(Exception):
    """A refusal with an HTTP status, a machine code, a message and optional field errors or details."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field_errors: Iterable[FieldError | dict] = (),
        detail: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.field_errors = tuple(field_errors)
        self.detail = detail or {}


def field_errors_json(errors: Iterable[FieldError | dict]) -> list[dict]:
    return [asdict(e) if isinstance(e, FieldError) else dict(e) for e in errors]

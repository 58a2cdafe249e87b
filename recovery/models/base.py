"""Field helpers shared by the recovery models: the name validator of registry names, and a plain enum's
members as a field's choices."""

from __future__ import annotations

from enum import StrEnum

from django.core.validators import RegexValidator

name_validator = RegexValidator(r"^[a-z0-9][a-z0-9_.-]*$", "Use lowercase letters, digits, '.', '_' and '-'.")


def _choices(values: type[StrEnum]) -> list[tuple[str, str]]:
    """A plain enum's members as a field's choices, labelled as Django's TextChoices label them (the states and
    the observations are plain Python, shared with the engine)."""
    return [(member.value, member.name.replace("_", " ").title()) for member in values]

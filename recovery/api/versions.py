"""Which API this console speaks, and which clients it still serves (docs/api.md#versions): every answer under /api/
carries `Recovery-Api-Version`, and a recovery-console-client older than OLDEST_CLIENT gets 426 before anything is
processed. Tests answer as another console through settings (RECOVERY_API_VERSION, RECOVERY_OLDEST_CLIENT).
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from ninja import NinjaAPI

from recovery.api.errors import error_response
from recovery.registry.lookup import marker_paths
from recovery.services.errors import Refusal

API_VERSION = (
    "1.2"  # the API this console answers: 1.<minor> (1.1: the admission's `wire`; 1.2: admit on add, `report`)
)
OLDEST_CLIENT = "0.1.0"  # the oldest recovery-console-client it serves
MARKERS_CLIENT = "0.3.0"  # the first recovery-console-client that puts the key at the admission's `key_markers`
HEADER = "Recovery-Api-Version"
CLIENT_NAME = "recovery-console-client"
_CLIENT_AGENT = re.compile(rf"(?:^|[\s(;]){re.escape(CLIENT_NAME)}/(\d+)\.(\d+)\.(\d+)")


def api_version() -> str:
    return getattr(settings, "RECOVERY_API_VERSION", API_VERSION)


def oldest_client() -> str:
    return getattr(settings, "RECOVERY_OLDEST_CLIENT", OLDEST_CLIENT)


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def client_version(user_agent: str) -> str | None:
    """The recovery-console-client version a User-Agent names, or None for any other client."""
    found = _CLIENT_AGENT.search(user_agent or "")
    return ".".join(found.groups()) if found else None


def refuse_old_client(request: HttpRequest) -> JsonResponse | None:
    """426 for a recovery-console-client older than the oldest this console serves; None for every other request."""
    version = client_version(request.headers.get("User-Agent", ""))
    oldest = oldest_client()
    if version is None or _numbers(version) >= _numbers(oldest):
        return None
    served = api_version()
    return error_response(
        426,
        "client_too_old",
        f"{CLIENT_NAME} {version} is older than the oldest this console serves ({oldest}; it answers API {served}): "
        f"install {CLIENT_NAME}>={oldest}; nothing was processed",
        detail={"client_version": version, "oldest_client": oldest, "api_version": served},
    )


def refuse_markerless_client(request: HttpRequest, tool: Any) -> None:
    """Refusal (426, before anything is admitted) of a recovery-console-client older than MARKERS_CLIENT for a tool
    whose lost outcome is found by a listing matching a marker in its request (docs/providers.md): that client sends
    no marker, so the listing would never find its refund and, after the visibility window, call it not committed."""
    markers = marker_paths(tool.request)
    version = client_version(request.headers.get("User-Agent", ""))
    if not markers or version is None or _numbers(version) >= _numbers(MARKERS_CLIENT):
        return
    raise Refusal(
        "client_too_old",
        f"{CLIENT_NAME} {version} does not put the call's key at {', '.join(markers)}, the marker {tool.name}'s "
        f"status lookup matches: install {CLIENT_NAME}>={MARKERS_CLIENT}; nothing was admitted",
        status=426,
    )


class VersionedNinjaAPI(NinjaAPI):
    """The API whose OpenAPI document states its version and declares the version header on every answer."""

    def __init__(self, **options: Any) -> None:
        super().__init__(version=API_VERSION, **options)

    def validation_error_from_error_contexts(self, error_contexts: list[Any]) -> Any:
        """Ninja's, with each error's rejected value kept: Ninja drops pydantic's `input`, which the API echoes
        (redacted, cut) as the field error's `received` (routes._validation_error)."""
        error = super().validation_error_from_error_contexts(error_contexts)
        inputs = [
            found.get("input")
            for context in error_contexts
            for found in context.pydantic_validation_error.errors(include_url=False)
        ]
        for item, value in zip(error.errors, inputs, strict=True):
            item["input"] = value
        return error

    def get_openapi_schema(self, **options: Any) -> Any:
        schema = super().get_openapi_schema(**options)
        version = api_version()
        schema["info"].update({"version": version, "x-api-version": version, "x-oldest-client": oldest_client()})
        schema["components"].setdefault("headers", {})[HEADER] = {
            "description": "The API version this console answers, 1.<minor> (docs/api.md#versions).",
            "required": True,
            "schema": {"type": "string", "pattern": r"^[0-9]+\.[0-9]+$"},
        }
        header = {HEADER: {"$ref": f"#/components/headers/{HEADER}"}}
        for methods in schema["paths"].values():
            for operation in methods.values():
                for answer in operation["responses"].values():
                    answer.setdefault("headers", {}).update(header)
        return schema

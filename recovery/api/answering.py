"""The hot endpoints' answers written as built, without validating them against their schema on every request
(docs/benchmarks.md, "The protected benchmark"): Ninja would validate the dict into the answer's pydantic model and
dump it again — our own answer, checked against our own schema, per request, in production.

With RECOVERY_CHECK_ANSWERS on (the test suite's settings), every answer is still checked: the body validated and
dumped as Ninja would, and compared with what is written; a difference is an AnswerDrift (a 500, and a failed test).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from pydantic import TypeAdapter


class AnswerDrift(AssertionError):
    """An answer as written differs from the same answer validated against its schema."""


@cache
def _adapter(schema: Any) -> TypeAdapter:
    return TypeAdapter(schema)


def written(api, request, status: int, body: dict, schema: Any) -> HttpResponse:
    """`body` as the API's JSON answer with `status`; under RECOVERY_CHECK_ANSWERS, checked against `schema` first."""
    response = api.create_response(request, body, status=status)
    if settings.RECOVERY_CHECK_ANSWERS:
        adapter = _adapter(schema)
        checked = adapter.dump_python(adapter.validate_python(body), by_alias=True)
        expected = json.loads(api.renderer.render(request, checked, response_status=status))
        differences = _differences(expected, json.loads(response.content))
        if differences:
            raise AnswerDrift(f"the {status} answer differs from its schema's at {', '.join(differences)}")
    return response


def _differences(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where `actual` differs from `expected`: the paths (`failure.class`, `checks[2]`), each with both values."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        return [
            found
            for key in sorted(set(expected) | set(actual))
            for found in _differences(expected.get(key, "<absent>"), actual.get(key, "<absent>"), f"{path}.{key}")
        ]
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        return [
            found
            for n, pair in enumerate(zip(expected, actual, strict=True))
            for found in _differences(*pair, f"{path}[{n}]")
        ]
    return [] if expected == actual else [f"{path.lstrip('.') or 'the answer'} ({expected!r} != {actual!r})"]

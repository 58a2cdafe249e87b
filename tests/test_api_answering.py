"""The hot endpoints write their answers as built (recovery/api/answering.py): in production without validating
them against their schema per request; under RECOVERY_CHECK_ANSWERS (this suite's settings) each answer is also
validated and compared, so every API test checks that what production writes is what the schema says.
"""

from __future__ import annotations

import json

import pytest
from django.test import RequestFactory, override_settings
from pydantic import ValidationError

from recovery.api.answering import AnswerDrift, written
from recovery.api.answers import OutcomeOut
from recovery.api.call_admission import CallAdmittedOut
from recovery.api.routes import api

CALL = {
    "call_id": 7,
    "created": True,
    "state": "READY",
    "preflight": {"passed": True, "field_errors": []},
    "failure": None,
    "required_next": None,
    "blocked_by": [],
    "blocked_by_steps": [],
    "poll": "/api/v1/calls/7",
    "admission": None,
    "not_admitted": None,
}


def _request():
    return RequestFactory().post("/api/v1/tasks/1/calls")


def test_an_answer_as_built_is_written_as_its_schema_would_write_it():
    response = written(api, _request(), 201, dict(CALL), CallAdmittedOut)
    assert response.status_code == 201 and json.loads(response.content) == CALL


def test_an_answer_that_drifts_from_its_schema_fails_when_checked():
    unsaid = {k: v for k, v in CALL.items() if k != "admission"}  # validation would write its default, null
    with pytest.raises(AnswerDrift):
        written(api, _request(), 201, unsaid, CallAdmittedOut)
    with pytest.raises(ValidationError):  # a key the schema does not have
        written(api, _request(), 201, {**CALL, "calls_made": 3}, CallAdmittedOut)
    with pytest.raises(ValidationError):  # a key the schema needs, missing
        written(api, _request(), 201, {k: v for k, v in CALL.items() if k != "poll"}, CallAdmittedOut)


@override_settings(RECOVERY_CHECK_ANSWERS=False)
def test_production_writes_the_answer_without_validating_it():
    unsaid = {k: v for k, v in CALL.items() if k != "admission"}
    assert "admission" not in json.loads(written(api, _request(), 201, unsaid, CallAdmittedOut).content)


def test_a_union_schema_is_checked_too():
    with pytest.raises(ValidationError):
        written(api, _request(), 200, {"call_id": "x"}, OutcomeOut)

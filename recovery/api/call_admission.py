"""POST /tasks/{id}/calls with `admit` (API 1.2): the call registered and its first attempt admitted in one round
trip (docs/api.md). Only a call this request created, or one still READY, is admitted; a re-registration of the same
key finds the same call, and the same attempt id answers the admission it stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import transaction
from pydantic import Field

from recovery.api.admission_answers import AdmittedOut
from recovery.api.answers import CallAddedOut, NotAdmittedDetail
from recovery.api.inputs import AdmitIn
from recovery.audit.chain import appends_at_commit
from recovery.engine.states import CallState
from recovery.models import Attempt
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.calls import CallAdded
from recovery.statemachine import hot_path


class CallAdmittedOut(CallAddedOut):
    """A registered call and, when the request asked for it, its first attempt's admission (API 1.2)."""

    admission: AdmittedOut | None = Field(
        None, description="The admitted attempt (null: none asked for, or not admitted: see not_admitted)."
    )
    not_admitted: NotAdmittedDetail | None = Field(
        None, description="The stored denial, when the attempt asked for was not admitted (null otherwise)."
    )


@contextmanager
def one_transaction(enabled: bool) -> Iterator[None]:
    """With `enabled`, the block's writes in one transaction, its audit events appended once, at its end
    (recovery.audit.chain.appends_at_commit: the heads locked for the appends and the commit only)."""
    if not enabled:
        yield
        return
    with transaction.atomic(), appends_at_commit():
        yield


def _admissible(added: CallAdded, attempt_id: str) -> bool:
    """A call this request created or still READY, with its arguments through preflight; or one that already
    admitted this attempt id (a resent request: its stored admission is answered again)."""
    if added.preflight:
        return False
    if added.created or added.call.state == CallState.READY:
        return True
    return Attempt.objects.filter(call_id=added.call.pk, attempt_id=attempt_id).exists()


def admit_added(request, added: CallAdded, admit: AdmitIn, actor) -> dict:
    """The answer's `admission` and `not_admitted` for the call just added: its first attempt admitted (or the
    gate's stored denial), nothing when the call is past admitting."""
    if not _admissible(added, admit.attempt_id):
        return {"admission": None, "not_admitted": None}
    # What the admission reads: read with the call's insert (call_add's `admitting`), or now.
    read = (added.read or hot_path.first_admission_read(added.call)) if added.created else None
    if read is not None:  # the call, its tool and task as this request inserted and read them
        call = added.call
    else:
        found = hot_path.call_for_attempt(added.call.pk, request.tenant_ids, attempt_id=admit.attempt_id)
        if found is None:  # the call just read is gone: nothing to admit (the runtime admits as before)
            return {"admission": None, "not_admitted": None}
        call, read = found
    candidate = AttemptRequest(attempt_id=admit.attempt_id, evidence=tuple(admit.evidence))
    admission = attempt_admit(call=call, read=read, request=candidate, actor=actor, fresh=added.created)
    if admission.status == 409:
        return {"admission": None, "not_admitted": admission.response}
    return {"admission": admission.response, "not_admitted": None}

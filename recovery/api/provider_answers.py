"""What the API answers providers (docs/reconciliation.md, "Callbacks"): not the runtime API's document, so beside
recovery/api/answers.py rather than in it; the same closed schemas, each checked against its answer."""

from __future__ import annotations

from recovery.api.answers import Answer, ObservationName, _


class CallbackOut(Answer):
    """A provider callback's receipt."""

    receipt_id: int = _("The receipt it made (or the one it repeats).")
    duplicate: bool = _("Whether this event was received before.")
    call_id: int = _("The call it is about.")
    observed: ObservationName = _("What it says happened.")
    applied: bool = _("Whether it moved the call.")
    call_state: str = _("The call's state after it.")


class CompensationCallbackOut(Answer):
    """A provider callback about a compensation's own request (202): not stored as a receipt; the entry's status
    check, brought forward, records what the provider's records say."""

    compensation_entry_id: int = _("The compensation entry whose key the callback carried.")
    call_id: int = _("The call the entry undoes.")
    entry_state: str = _("The entry's state now.")
    check_brought_forward: bool = _("Whether the entry waited for a status check and it is now due at once.")

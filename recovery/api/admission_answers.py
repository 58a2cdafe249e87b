"""The admission's answer (docs/api.md): the admitted attempt, how to send it (`wire`), when its report may wait
(`report`, API 1.2), and the verdicts of the task's deferred reports that disagreed with their early answer
(`earlier`, docs/api.md#reporting-off-the-clock).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from recovery.api.answers import Answer, CallStateName, DecisionOut, GateOut, _


class WireOut(Answer):
    """How to send the admitted attempt as the registry describes the tool (docs/providers.md)."""

    key_header: str = _("The request header that carries the call's idempotency key (empty: not a header).")
    key_field: str = _("The body field that carries it instead (empty: not a body field; both empty: no key).")
    key_markers: list[str] = _("Body paths that also carry the key, a marker a listing lookup matches (metadata.x).")
    request_id_header: str = _("The reply header with the provider's request id, to report as provider_request_id.")


class ReportTermsOut(Answer):
    """When the runtime may answer its caller before the report is in (API 1.2, docs/api.md#reporting-off-the-clock)."""

    may_defer: bool = _("Whether a 2xx reply passing these checks may be reported after the caller has its answer.")
    within_s: float = _("How soon a deferred report is sent at the latest, in seconds.")
    required_result_fields: list[str] = _("Result fields a deferrable reply must carry (dotted paths).")
    provider_ref_field: str = _("The result field holding the provider's reference, when no request id header does.")
    key_echo_header: str = _("A reply header that, when present, must echo the call's idempotency key.")


class EarlierVerdictOut(Answer):
    """A deferred report's verdict that disagreed with the runtime's early answer: the call is not COMMITTED."""

    call_id: int = _("The call whose report was deferred.")
    attempt_id: str = _("The attempt reported.")
    call_state: CallStateName = _("The call's state after that report (the console's verdict).")
    decision: DecisionOut | None = _("That report's decision card (null when it made none).")


class AdmittedOut(Answer):
    """An admitted attempt: send the provider request now, then report its outcome."""

    admitted: Literal[True] = _("Always true here: the attempt was admitted.")
    call_id: int = _("The call.")
    attempt_id: str = _("The admitted attempt's id.")
    attempt_number: int = _("Its number among the call's attempts (1 for the first).")
    call_state: CallStateName = _("The call's state: SENT.")
    gate: GateOut = _("The gate's answer that admitted it.")
    wire: WireOut | None = Field(
        None, description="Where the key goes and where the request id comes back (API 1.1; null: an older answer)."
    )
    report: ReportTermsOut | None = Field(None, description="When the report may wait (API 1.2; null: it may not).")
    earlier: list[EarlierVerdictOut] = Field(
        default_factory=list,
        description="The task's reports since its last admission that may have been deferred (a 2xx admitted with "
        "may_defer) and whose verdict is not COMMITTED, each with its decision card (API 1.2).",
    )

"""The duplicate probe's judgement (docs/replay.md), from facts alone: what the replay answered and what the provider's
own ledger then said about the key.

    probe: tool refund.create   key: refund-order-8848-v3
    first: COMMITTED   second: IDEMPOTENT_REPLAY   downstream_audit: one_effect
    expected_effects: 1   observed_effects: 1   decision: retry_path_safe

A second effect, a new business id, or a key the provider does not know marks the retry path unsafe. A ledger the
probe could not read (no `effects_field` in the tool's status query, or the query failed) proves nothing: the probe
is inconclusive and the retry path stays as it was — unless the replay itself came back with a new business id.
"""

from __future__ import annotations

from dataclasses import dataclass

SAFE, UNSAFE, INCONCLUSIVE = "retry_path_safe", "retry_path_unsafe", "inconclusive"


@dataclass(frozen=True, kw_only=True)
class ProbeFacts:
    http_status: int | None  # the replay's reply (None: no reply arrived)
    first_business_id: str  # the call's provider reference, from its commit
    second_business_id: str  # the reference the replay's reply carried ("" when none)
    ledger_read: bool  # the status query answered and the tool names an effects_field
    key_known: bool  # the provider's status query found the key
    observed_effects: int | None
    expected_effects: int = 1


@dataclass(frozen=True, kw_only=True)
class ProbeVerdict:
    second: str  # idempotent_replay, new_business_id, refused, no_reply
    downstream_audit: str  # one_effect, second_effect, key_missing, unreadable
    decision: str  # SAFE, UNSAFE, INCONCLUSIVE
    detail: str


def judge(facts: ProbeFacts) -> ProbeVerdict:
    replied = facts.http_status is not None and 200 <= facts.http_status < 300
    new_id = bool(replied and facts.second_business_id and facts.first_business_id)
    new_id = new_id and facts.second_business_id != facts.first_business_id
    if facts.http_status is None:
        second = "no_reply"
    elif not replied:
        second = "refused"
    else:
        second = "new_business_id" if new_id else "idempotent_replay"
    if not facts.ledger_read:
        audit = "unreadable"
    elif not facts.key_known:
        audit = "key_missing"
    elif facts.observed_effects is not None and facts.observed_effects > facts.expected_effects:
        audit = "second_effect"
    elif facts.observed_effects == facts.expected_effects:
        audit = "one_effect"
    else:
        audit = "unreadable"
    expected, seen = facts.expected_effects, facts.observed_effects
    if new_id:
        return ProbeVerdict(
            second=second,
            downstream_audit=audit,
            decision=UNSAFE,
            detail=f"the replay created a new business id ({facts.second_business_id}, first "
            f"{facts.first_business_id}): the provider does not deduplicate by key",
        )
    if audit == "second_effect":
        detail = f"the provider's ledger holds {seen} effects for the key, {expected} expected: it ignored the key"
        return ProbeVerdict(second=second, downstream_audit=audit, decision=UNSAFE, detail=detail)
    if audit == "key_missing":
        detail = "the provider's status query does not know the key after the replay: it keeps no idempotency record"
        return ProbeVerdict(second=second, downstream_audit=audit, decision=UNSAFE, detail=detail)
    if audit == "unreadable":
        detail = "the provider's ledger could not be read for the key (no effects_field, or the query failed)"
        return ProbeVerdict(second=second, downstream_audit=audit, decision=INCONCLUSIVE, detail=detail)
    if second != "idempotent_replay":
        what = "no reply arrived" if second == "no_reply" else f"the replay was answered HTTP {facts.http_status}"
        detail = f"{what}: nothing shows how the provider treats a replayed key"
        return ProbeVerdict(second=second, downstream_audit=audit, decision=INCONCLUSIVE, detail=detail)
    detail = f"an idempotent replay: the same business id, and {seen} effect for the key as expected"
    return ProbeVerdict(second=second, downstream_audit=audit, decision=SAFE, detail=detail)

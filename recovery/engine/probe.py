"""The duplicate probe's judgement (docs/replay.md), from facts alone: what the replay answered and what the provider's
own ledger then said about the key make the retry path safe, unsafe, or leave it as it was (inconclusive).
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


# What the ledger's answer alone decides, when the replay made no new business id.
_BY_AUDIT = {
    "second_effect": (
        UNSAFE,
        "the provider's ledger holds {seen} effects for the key, {expected} expected: it ignored the key",
    ),
    "key_missing": (
        UNSAFE,
        "the provider's status query does not know the key after the replay: it keeps no idempotency record",
    ),
    "unreadable": (
        INCONCLUSIVE,
        "the provider's ledger could not be read for the key (no effects_field, or the query failed)",
    ),
}


def judge(facts: ProbeFacts) -> ProbeVerdict:
    second, new_id = _second(facts)
    audit = _downstream_audit(facts)
    expected, seen = facts.expected_effects, facts.observed_effects
    if new_id:
        decision = UNSAFE
        detail = (
            f"the replay created a new business id ({facts.second_business_id}, first "
            f"{facts.first_business_id}): the provider does not deduplicate by key"
        )
    elif audit in _BY_AUDIT:
        decision, detail = _BY_AUDIT[audit]
        detail = detail.format(seen=seen, expected=expected)
    elif second != "idempotent_replay":
        what = "no reply arrived" if second == "no_reply" else f"the replay was answered HTTP {facts.http_status}"
        decision, detail = INCONCLUSIVE, f"{what}: nothing shows how the provider treats a replayed key"
    else:
        decision = SAFE
        detail = f"an idempotent replay: the same business id, and {seen} effect for the key as expected"
    return ProbeVerdict(second=second, downstream_audit=audit, decision=decision, detail=detail)


def _second(facts: ProbeFacts) -> tuple[str, bool]:
    """What the replay answered, and whether it carried a business id other than the first's."""
    replied = facts.http_status is not None and 200 <= facts.http_status < 300
    new_id = bool(replied and facts.second_business_id and facts.first_business_id)
    new_id = new_id and facts.second_business_id != facts.first_business_id
    if facts.http_status is None:
        return "no_reply", new_id
    if not replied:
        return "refused", new_id
    return ("new_business_id" if new_id else "idempotent_replay"), new_id


def _downstream_audit(facts: ProbeFacts) -> str:
    """What the provider's ledger said about the key after the replay."""
    if not facts.ledger_read:
        return "unreadable"
    if not facts.key_known:
        return "key_missing"
    if facts.observed_effects is not None and facts.observed_effects > facts.expected_effects:
        return "second_effect"
    if facts.observed_effects == facts.expected_effects:
        return "one_effect"
    return "unreadable"

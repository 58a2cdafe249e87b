"""What the call page shows (docs/console.md, "The call page"): one call with its intent, evidence and history.
Twelve statements (two for the live refresh) whatever the number of attempts, receipts, events or entries; the
timeline is merged in Python from those rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.exceptions import ObjectDoesNotExist

from recovery.audit.actions import REQUEST_EVENTS
from recovery.engine.budgets import tighter
from recovery.engine.types import BreakerView, Budgets
from recovery.models import (
    ActionRequest,
    Attempt,
    AuditEvent,
    Call,
    Diagnostic,
    DuplicateProbe,
    GateDecision,
    ProbeDecision,
    Receipt,
    ReceiptSource,
    StatusBreaker,
)
from recovery.models import Decision as DecisionRow
from recovery.registry.policy import TOOL_BUDGETS, status_breaker_policy
from recovery.selectors.approvals import call_action_requests
from recovery.selectors.breakers import breaker_view
from recovery.selectors.compensations import ChainEntry, EffectStory, call_compensations, effect_story
from recovery.selectors.context import task_budgets
from recovery.selectors.facts import status_breaker_state

# The API's own idempotency bookkeeping (whole answers, hashes) and the raw facts (their columns are shown): never
# read here.
_ATTEMPT_UNREAD = ("request_hash", "response", "outcome_request_hash", "outcome_response", "facts")


# How the pages name a receipt's source: the stored value, except where it would not tell a reader what happened.
RECEIPT_SOURCES = {ReceiptSource.IDEMPOTENT_REPLAY.value: "idempotent replay (replay reconciliation)"}
# How the timeline labels an entry's kind, where its slug (a CSS class too) is not the words.
KIND_LABELS = {"probe": "duplicate probe"}


def receipt_source(source: str) -> str:
    """A receipt's source in the words the pages use ("poll", "callback", ..., "idempotent replay (replay
    reconciliation)" for the one same-key replay of docs/replay.md)."""
    return RECEIPT_SOURCES.get(source, source)


@dataclass(frozen=True, kw_only=True)
class TimelineEntry:
    at: datetime
    kind: str  # attempt, gate, decision, receipt, probe, audit, action (an operator action's event), compensation
    title: str
    details: str
    rank: int = 0  # orders entries written at the same instant: gate, attempt, audit, decision, receipt
    order: int = 0  # then by id
    request_id: int | None = None  # the operator action request the entry came from, linked from it

    @property
    def kind_label(self) -> str:
        return KIND_LABELS.get(self.kind, self.kind)


@dataclass(frozen=True, kw_only=True)
class KeyRetention:
    """How long the provider still deduplicates the call's idempotency key (docs/design/idempotency.md): `retention_s`
    from when it was first sent (the first attempt's admission), or from the call's creation when no attempt was made
    yet."""

    retention_s: int
    since: datetime
    since_what: str
    expires_at: datetime
    expired: bool


@dataclass(frozen=True, kw_only=True)
class BudgetLine:
    name: str
    used: int | None
    limit: int | None
    text: str
    deadline: datetime | None = None
    left: timedelta | None = None  # until the deadline (negative: past it)


@dataclass(frozen=True, kw_only=True)
class CallStatus:
    """What the page's live refresh redraws: the call as it stands now, its key's retention, its tool's breaker."""

    call: Call
    key: KeyRetention
    breaker: BreakerView
    status_breaker: StatusBreaker | None
    status_breaker_state: str  # as every page states it (recovery.selectors.facts.status_breaker_state)
    claim_live: bool


@dataclass(frozen=True, kw_only=True)
class CallPage:
    status: CallStatus
    attempts: list[Attempt]
    decisions: list[DecisionRow]
    latest_decision: DecisionRow | None
    gates: list[GateDecision]
    receipts: list[Receipt]
    audit_events: list[AuditEvent]
    diagnostics: list[Diagnostic]  # full rows for people who may read them, else only ref/source/created_at
    diagnostics_readable: bool
    budget: list[BudgetLine]
    probes: list[DuplicateProbe] = field(default_factory=list)  # oldest first
    action_requests: list[ActionRequest] = field(default_factory=list)  # newest first
    compensations: list[ChainEntry] = field(default_factory=list)  # by number
    story: EffectStory | None = None  # what became of the effect, once a compensation was made
    timeline: list[TimelineEntry] = field(default_factory=list)

    @property
    def call(self) -> Call:
        return self.status.call


def _call(call_id: int) -> Call | None:
    related = (
        "task__tenant",
        "step",
        "tool__provider__status_breaker_row",
        "claimed_by",
        "assignment__assignee",
        "mcp_origin",
    )
    return Call.objects.select_related(*related).filter(pk=call_id).first()


def _status(call: Call, first_sent_at: datetime | None, now: datetime) -> CallStatus:
    tool = call.tool
    since, since_what = call.key_since(first_sent_at), "first sent" if first_sent_at else "call created"
    try:
        status_breaker = tool.provider.status_breaker_row
    except ObjectDoesNotExist:
        status_breaker = None  # no row: the status endpoint's breaker never counted anything, it reads closed
    status_breaker_now = "closed"
    if status_breaker is not None:
        cooldown_s = status_breaker_policy(tool.provider).cooldown_s
        status_breaker_now = status_breaker_state(status_breaker.state, status_breaker.opened_at, cooldown_s, now)
    return CallStatus(
        call=call,
        key=KeyRetention(
            retention_s=tool.key_retention_s,
            since=since,
            since_what=since_what,
            expires_at=call.key_expires_at(first_sent_at),
            expired=call.key_expired(first_sent_at, now),
        ),
        breaker=breaker_view(tool, now=now),
        status_breaker=status_breaker,
        status_breaker_state=status_breaker_now,
        claim_live=call.claim_held(now),
    )


def call_status(call_id: int, *, now: datetime) -> CallStatus | None:
    """The call's live status (three statements), or None for an unknown id."""
    call = _call(call_id)
    if call is None:
        return None
    return _status(call, call.first_sent_at(), now)


def call_page(call_id: int, *, diagnostics_readable: bool, now: datetime) -> CallPage | None:
    """Everything the call page shows (twelve statements), or None for an unknown id."""
    call = _call(call_id)
    if call is None:
        return None
    attempts = list(
        Attempt.objects.filter(call_id=call.pk)
        .select_related("tool", "decision")
        .defer(*_ATTEMPT_UNREAD)
        .order_by("number")
    )
    first_sent_at = (attempts[0].admitted_at or attempts[0].created_at) if attempts else None
    decisions = [a.decision for a in attempts if _decision_of(a) is not None]
    gates = list(
        GateDecision.objects.filter(call_id=call.pk).select_related("actor_user", "actor_token").order_by("pk")
    )
    receipts = list(Receipt.objects.filter(call_id=call.pk).order_by("checked_at", "pk"))
    probes = list(DuplicateProbe.objects.filter(call_id=call.pk).order_by("created_at", "pk"))
    events = list(AuditEvent.objects.filter(call_id=call.pk).order_by("seq"))
    diagnostics = Diagnostic.objects.filter(call_id=call.pk).order_by("created_at", "pk")
    if not diagnostics_readable:
        diagnostics = diagnostics.only("id", "ref", "source", "created_at")  # that one exists, not what it says
    compensations = call_compensations(call.pk)
    story = effect_story(
        call_state=call.state,
        forward_tool=call.tool.name,
        target=call.provider_ref or call.idempotency_key,
        entries=[c.entry for c in compensations],
    )
    page = CallPage(
        status=_status(call, first_sent_at, now),
        attempts=attempts,
        decisions=decisions,
        latest_decision=decisions[-1] if decisions else None,
        gates=gates,
        receipts=receipts,
        audit_events=events,
        diagnostics=list(diagnostics),
        diagnostics_readable=diagnostics_readable,
        budget=budget_lines(call, now),
        probes=probes,
        action_requests=call_action_requests(call.pk),
        compensations=compensations,
        story=story,
    )
    page.timeline.extend(timeline(page))
    return page


def _decision_of(attempt: Attempt) -> DecisionRow | None:
    try:
        return attempt.decision
    except ObjectDoesNotExist:
        return None  # select_related cached "none": no query


# --- budget --------------------------------------------------------------------------------------------------------


def budget_lines(call: Call, now: datetime) -> list[BudgetLine]:
    """Budget left, the tighter of the tool's and the task's limits (docs/design/budgets.md), from rows already
    loaded."""
    task = call.task
    tool_budgets = call.tool.budgets if isinstance(call.tool.budgets, dict) else {}
    limits = tighter(
        Budgets(**{k: tool_budgets[k] for k in TOOL_BUDGETS if k in tool_budgets}),
        task_budgets(task),
        Budgets(max_attempts=call.max_attempts),
    )
    lines = [
        _line("call attempts", call.attempts_count, limits.max_attempts),
        _line("task rounds", task.rounds_used, limits.max_rounds),
        _line("tokens", task.tokens_used, limits.token_budget),
    ]
    if call.side_effect == "write":
        lines.append(_line("task write retries", task.write_retries_used, limits.write_retry))
    if limits.deadline is not None:
        left = limits.deadline - now
        lines.append(BudgetLine(name="deadline", used=None, limit=None, text="", deadline=limits.deadline, left=left))
    else:
        lines.append(BudgetLine(name="deadline", used=None, limit=None, text="no deadline"))
    return lines


def _line(name: str, used: int, limit: int | None) -> BudgetLine:
    if limit is None:
        return BudgetLine(name=name, used=used, limit=None, text=f"{used} used, no limit")
    return BudgetLine(name=name, used=used, limit=limit, text=f"{used}/{limit}: {max(limit - used, 0)} left")


# --- timeline ------------------------------------------------------------------------------------------------------

_RANK = {"gate": 0, "admitted": 1, "audit": 2, "reported": 3, "decision": 4, "receipt": 5, "probe": 5}
_CHAIN_ENDS = ("COMPENSATED", "PARTIAL_COMPENSATED", "COMPENSATION_FAILED")


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _attempt_entries(attempt: Attempt) -> list[TimelineEntry]:
    flags = [
        *(["a breaker probe"] if attempt.breaker_probe else []),
        *(["reported after the fact: the gate would have denied it"] if attempt.policy_bypassed else []),
    ]
    admitted_at = attempt.admitted_at or attempt.created_at
    entries = [
        TimelineEntry(
            at=admitted_at,
            kind="attempt",
            title=f"attempt {attempt.number} admitted" if attempt.admitted_at else f"attempt {attempt.number} recorded",
            details="; ".join([f"attempt id {attempt.attempt_id}", f"tool {attempt.tool.name}", *flags]),
            rank=_RANK["admitted"],
            order=attempt.pk,
        )
    ]
    if attempt.reported_at:
        what = attempt.error_kind or (f"HTTP {attempt.http_status}" if attempt.http_status else "no error")
        facts = [
            f"connection opened: {_yes_no(attempt.connection_opened)}",
            f"sent: {_yes_no(attempt.sent)}",
            *([f"HTTP {attempt.http_status}"] if attempt.http_status else []),
            *([f"error {attempt.error_kind}"] if attempt.error_kind else []),
            *([f"code {attempt.error_code}"] if attempt.error_code else []),
            *([f"provider request id {attempt.provider_request_id}"] if attempt.provider_request_id else []),
            *([f"class {attempt.failure_class}"] if attempt.failure_class else []),
        ]
        entries.append(
            TimelineEntry(
                at=attempt.reported_at,
                kind="attempt",
                title=f"attempt {attempt.number} reported: {what}",
                details="; ".join(facts),
                rank=_RANK["reported"],
                order=attempt.pk,
            )
        )
    return entries


def _decision_entry(decision: DecisionRow, number: int) -> TimelineEntry:
    action = (decision.required_next or {}).get("action", "")
    parts = [
        f"delay {decision.delay_ms} ms",
        *([f"next: {', '.join(decision.next_actions)}"] if decision.next_actions else []),
        *([f"forbidden: {', '.join(decision.forbidden)}"] if decision.forbidden else []),
        *([f"required next: {action}"] if action else []),
    ]
    return TimelineEntry(
        at=decision.created_at,
        kind="decision",
        title=f"decision for attempt {number}: {decision.route}",
        details="; ".join(parts),
        rank=_RANK["decision"],
        order=decision.pk,
    )


def _gate_entry(gate: GateDecision) -> TimelineEntry:
    verdict = "allowed" if gate.allowed else "denied"
    who = gate.actor_user.get_username() if gate.actor_user else (gate.actor_token.name if gate.actor_token else "")
    parts = [
        *([f"candidate attempt {gate.candidate_attempt_id}"] if gate.candidate_attempt_id else []),
        *([f"evidence used: {gate.evidence_used}"] if gate.evidence_used else []),
        *([f"required next: {gate.required_next.get('action')}"] if gate.required_next else []),
        *([f"asked by {who}"] if who else []),
    ]
    return TimelineEntry(
        at=gate.created_at,
        kind="gate",
        title=f"gate {verdict}: {gate.reason}" + (" (dry run: nothing admitted)" if gate.dry_run else ""),
        details="; ".join(parts),
        rank=_RANK["gate"],
        order=gate.pk,
    )


def _receipt_entry(receipt: Receipt) -> TimelineEntry:
    moved = (
        f"{receipt.local_state_before} → {receipt.local_state_after}"
        if receipt.applied
        else f"call stayed {receipt.local_state_before}"
    )
    parts = [
        *([f"provider status {receipt.provider_status}"] if receipt.provider_status else []),
        *([f"provider ref {receipt.provider_ref}"] if receipt.provider_ref else []),
        *([f"effects observed {receipt.effects_observed}"] if receipt.effects_observed is not None else []),
        moved,
    ]
    return TimelineEntry(
        at=receipt.checked_at,
        kind="receipt",
        title=f"{receipt_source(receipt.source)} receipt: {receipt.observed}",
        details="; ".join(parts),
        rank=_RANK["receipt"],
        order=receipt.pk,
    )


def _probe_entry(probe: DuplicateProbe) -> TimelineEntry:
    """A duplicate probe (docs/replay.md): the second request's answer → the provider's ledger → the decision, with what
    it covered (the key's age, the provider's base URL). A receipt of its own: it moved no call."""
    seen = "unknown" if probe.observed_effects is None else probe.observed_effects
    parts = [
        f"first {probe.first}",
        f"effects observed {seen} of {probe.expected_effects} expected",
        *([f"HTTP {probe.http_status}"] if probe.http_status is not None else ["no reply"]),
        *([f"business id {probe.first_business_id}"] if probe.first_business_id else []),
        *(
            [f"second business id {probe.second_business_id}"]
            if probe.second_business_id and probe.second_business_id != probe.first_business_id
            else []
        ),
        f"key {probe.idempotency_key}, {probe.key_age_s} s old",
        f"provider {probe.provider_base_url}",
        *([probe.detail] if probe.detail else []),
        *(["the retry path was left as it was"] if probe.decision == ProbeDecision.INCONCLUSIVE else []),
    ]
    return TimelineEntry(
        at=probe.created_at,
        kind="probe",
        title=f"duplicate probe #{probe.pk}: {probe.second} → {probe.downstream_audit} → {probe.decision}",
        details="; ".join(parts),
        rank=_RANK["probe"],
        order=probe.pk,
        request_id=probe.action_id,
    )


def _audit_entry(event: AuditEvent) -> TimelineEntry:
    moved = f" {event.from_state} → {event.to_state}" if event.from_state and event.to_state else ""
    if event.from_state and event.from_state == event.to_state:
        moved = f" (stays {event.to_state})"  # a check or a replay that moved nothing
    if not event.from_state and event.to_state:
        moved = f" → {event.to_state}"
    operator_action = event.action in REQUEST_EVENTS
    parts = [
        *(_action_facts(event.evidence) if operator_action else []),
        f"by {event.actor_label}",
        *([event.reason] if event.reason else []),
        f"audit #{event.seq}",
    ]
    return TimelineEntry(
        at=event.created_at,
        kind="action" if operator_action else "audit",
        title=f"{event.action}{moved}",
        details="; ".join(parts),
        rank=_RANK["audit"],
        order=event.seq,
    )


def _action_facts(evidence) -> list[str]:
    """What an operator action's audit event says about its request: which one, which action, what came of it."""
    if not isinstance(evidence, dict):
        return []
    facts = []
    if evidence.get("request") is not None:
        facts.append(f"request #{evidence['request']}")
    if evidence.get("action"):
        facts.append(str(evidence["action"]))
    result = evidence.get("result") if isinstance(evidence.get("result"), dict) else {}
    if result.get("attempt_id"):
        facts.append(f"attempt id {result['attempt_id']}")
    if result.get("call_state"):
        facts.append(f"call {result['call_state']}")
    return facts


def _compensation_entries(chain: ChainEntry) -> list[TimelineEntry]:
    """One compensation's steps: made (its own key, target, expected effect), each attempt sent and answered, each
    receipt. Its state changes and the call's are audit events of the call, merged beside these."""
    entry = chain.entry
    name = f"compensation {entry.number}"
    made = TimelineEntry(
        at=entry.created_at,
        kind="compensation",
        title=f"{name} made: {entry.tool.name}, its own key {entry.idempotency_key}",
        details=f"target {entry.target} (call version {entry.target_version}); expected effect {entry.expected_effect}",
        rank=_RANK["admitted"],
        order=entry.pk,
    )
    entries = [made]
    for attempt in chain.attempts:
        request = attempt.request if isinstance(attempt.request, dict) else {}
        entries.append(
            TimelineEntry(
                at=attempt.sent_at,
                kind="compensation",
                title=f"{name} attempt {attempt.number} sent",
                details=f"{request.get('method', '')} {request.get('url', '')}".strip(),
                rank=_RANK["admitted"],
                order=attempt.pk,
            )
        )
        if attempt.finished_at:
            entries.append(_compensation_reply(name, attempt))
    for receipt in chain.receipts:
        moved = (
            f"{receipt.state_before} → {receipt.state_after}" if receipt.applied else f"stayed {receipt.state_before}"
        )
        parts = [
            *([f"provider status {receipt.provider_status}"] if receipt.provider_status else []),
            *([f"provider ref {receipt.provider_ref}"] if receipt.provider_ref else []),
            *([f"effects observed {receipt.effects_observed}"] if receipt.effects_observed is not None else []),
            f"entry {moved}",
        ]
        entries.append(
            TimelineEntry(
                at=receipt.checked_at,
                kind="compensation",
                title=f"{name} {receipt_source(receipt.source)} receipt: {receipt.observed}",
                details="; ".join(parts),
                rank=_RANK["receipt"],
                order=receipt.pk,
            )
        )
    return entries


def _compensation_reply(name: str, attempt) -> TimelineEntry:
    what = attempt.error_code or attempt.error_kind or (f"HTTP {attempt.http_status}" if attempt.http_status else "")
    facts = [
        *([f"HTTP {attempt.http_status}"] if attempt.http_status else []),
        *([f"error {attempt.error_kind}"] if attempt.error_kind else []),
        *([f"code {attempt.error_code}"] if attempt.error_code else []),
        *([f"row {attempt.row}"] if attempt.row else []),
        *([attempt.label] if attempt.label else []),
        *([f"provider ref {attempt.provider_ref}"] if attempt.provider_ref else []),
    ]
    return TimelineEntry(
        at=attempt.finished_at,
        kind="compensation",
        title=f"{name} attempt {attempt.number} answered: {what or 'no error'} → {attempt.state_after}",
        details="; ".join(facts),
        rank=_RANK["reported"],
        order=attempt.pk,
    )


def timeline(page: CallPage) -> list[TimelineEntry]:
    """Attempts, decisions, gate answers, receipts, duplicate probes, compensations and audit events of the call in
    time order, oldest first."""
    entries: list[TimelineEntry] = []
    for attempt in page.attempts:
        entries.extend(_attempt_entries(attempt))
        decision = _decision_of(attempt)
        if decision is not None:
            entries.append(_decision_entry(decision, attempt.number))
    entries.extend(_gate_entry(g) for g in page.gates)
    entries.extend(_receipt_entry(r) for r in page.receipts)
    entries.extend(_probe_entry(p) for p in page.probes)
    entries.extend(_audit_entry(e) for e in page.audit_events)
    for chain in page.compensations:
        entries.extend(_compensation_entries(chain))
    call = page.call
    if page.story and call.state in _CHAIN_ENDS:
        # The chain's end: the call's resulting state, in the words the record keeps ("created, then cancelled"),
        # after the audit event of the move into it.
        moved = [e.created_at for e in page.audit_events if e.to_state == call.state]
        entries.append(
            TimelineEntry(
                at=max([call.state_changed_at, *moved]),
                kind="compensation",
                title=f"result: {call.state}, {page.story.headline}",
                details=page.story.detail,
                rank=_RANK["receipt"] + 1,
                order=call.pk,
            )
        )
    entries.sort(key=lambda e: (e.at, e.rank, e.order))
    return entries

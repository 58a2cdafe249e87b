"""The dry run of an operator action (docs/actions.md): its plan, built from the call as it stands now, sending
nothing — the exact provider request(s) with credentials masked, each policy check with why, the forbidden actions
and the expected effects. `plan_hash` covers only what decides the execution, so an approval binds to it. Also the
call's facts the catalogue (recovery/engine/actions.py) needs, and the audit event of a request's step."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.actions import ACTIONS, REVIEW_PERMISSION, Action, ActionOption, actions_for
from recovery.engine.budgets import tighter
from recovery.engine.canonical import canonical_digest
from recovery.engine.gate import admit
from recovery.engine.states import UNSETTLED, CallState
from recovery.engine.types import APPROVAL_GRANTED, Budgets, Candidate, GateDecision, ToolPolicy
from recovery.models import ActionRequest, BreakerState, Call, McpCall, RetryPath, StatusBreaker
from recovery.providers.listing import shown_lookup
from recovery.providers.mcp import KEY_META, forwarded_arguments, upstream_request
from recovery.providers.requests import TemplateError, tool_request
from recovery.registry import tool_policy, with_alternates
from recovery.registry.mcp import needs_approval
from recovery.registry.policy import status_breaker_policy
from recovery.selectors.breakers import breaker_view
from recovery.selectors.context import gate_context, task_budgets, task_view
from recovery.selectors.facts import shown_facts
from recovery.services.compensation_plans import next_entry_plan
from recovery.services.errors import Refusal

S = CallState
ACTION_BY_NAME: dict[str, Action] = {action.name: action for action in ACTIONS}
# The attempt a replay makes itself, and the one a granted approval lets the runtime make later.
MAKES_ATTEMPT = frozenset({"replay_same_key", "execute_held"})
# The entry of the compensation ledger these make (docs/compensation.md): a new side effect, not an attempt of the call.
COMPENSATES = frozenset({"start_compensation", "approve_new_compensation"})
LETS_ATTEMPT = frozenset({"grant_approval"})
SETTLES = frozenset({"mark_committed", "mark_not_committed", "mark_compensation_committed", "mark_compensation_failed"})
PREVIEW_ATTEMPT = "preview"
CHECKS = ("admission", "breaker", "call_budget", "task_budget", "side_effect_budget", "key_retention")
SECOND_PERSON = "a second person with the approver role"
ONE_CONFIRMATION = "one confirmation: the requester's (read-only)"


class PlanError(Exception):
    """The plan cannot be built (e.g. the tool's request template needs an argument the call lacks)."""


# --- the call's facts ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CallFacts:
    """What `actions_for` needs besides the state and the person, from the call's rows now."""

    side_effect: str
    has_status_api: bool
    retry_path_safe: bool
    duplicate_effect: bool
    held_by: str  # another person's live claim on the call ("" when none, or when it is the asker's own)
    key_retention_s: int
    key_since: datetime  # the first attempt's admission, or the call's creation when none was made
    key_expires_at: datetime
    key_expired: bool
    has_compensation: bool = False  # its tool declares a compensation in the registry
    compensation_in_review: bool = False  # its open compensation entry waits for a person
    sandbox_tenant: bool = False  # its tenant is a test tenant (duplicate probes allowed)
    retry_path: str = RetryPath.UNPROBED  # its tool's
    held: bool = False  # its tool's first attempt waits for an approved hold (docs/mcp-gateway.md)


def call_for_action(call_id: int) -> Call | None:
    """The call with everything a plan and the catalogue read (one query), or None."""
    related = ("task__tenant", "step", "tool__provider", "claimed_by")
    return Call.objects.select_related(*related).filter(pk=call_id).first()


def call_facts(call: Call, *, user=None, now: datetime, key_since: datetime | None = None) -> CallFacts:
    """The call's facts for the catalogue. `key_since`: when its key was first sent, where the caller read it already
    (the call page does); otherwise one query reads the first attempt."""
    tool = call.tool
    since = key_since or call.key_since(call.first_sent_at())
    held_by = ""
    if call.claim_held(now) and (user is None or call.claimed_by_id != user.pk):
        held_by = call.claimed_by.get_username()
    return CallFacts(
        side_effect=call.side_effect,
        has_status_api=bool(tool.status_query or tool.mcp.get("status_tool")),
        # An MCP tool's same-key replay is a blind re-send (MCP has no idempotency key): only a proof makes it safe.
        retry_path_safe=tool.retry_path == RetryPath.SAFE if tool.mcp else tool.retry_path != RetryPath.UNSAFE,
        duplicate_effect=call.duplicate_effect,
        held_by=held_by,
        key_retention_s=tool.key_retention_s,
        key_since=since,
        key_expires_at=call.key_expires_at(since),
        key_expired=call.key_expired(since, now),
        has_compensation=isinstance(tool.compensation, dict) and bool(tool.compensation.get("tool")),
        compensation_in_review=call.state == S.COMPENSATING and call.compensations.filter(state="review").exists(),
        sandbox_tenant=call.task.tenant.sandbox,
        retry_path=tool.retry_path,
        held=bool(tool.mcp) and needs_approval(tool),
    )


def options_for(call: Call, facts: CallFacts, *, perms, held_by: str | None = None) -> list[ActionOption]:
    """`actions_for` on this call's state and facts; `held_by` overrides the facts' (None: keep it)."""
    return actions_for(
        call.state,
        perms=perms,
        side_effect=facts.side_effect,
        has_status_api=facts.has_status_api,
        key_expired=facts.key_expired,
        retry_path_safe=facts.retry_path_safe,
        duplicate_effect=facts.duplicate_effect,
        has_compensation=facts.has_compensation,
        compensation_in_review=facts.compensation_in_review,
        sandbox_tenant=facts.sandbox_tenant,
        retry_path=facts.retry_path,
        held_by=facts.held_by if held_by is None else held_by,
        held=facts.held,
    )


def action_options(call: Call, *, user, now: datetime) -> list[ActionOption]:
    """Every action on `call` as `user` may take it now: what the call page offers and the services accept."""
    return options_for(call, call_facts(call, user=user, now=now), perms=user.get_all_permissions())


def require_allowed(call: Call, facts: CallFacts, action: str, *, perms, held_by: str | None = None) -> None:
    """The catalogue's answer for this action on this call now; Refusal("forbidden", its reason) if not."""
    option = next(o for o in options_for(call, facts, perms=perms, held_by=held_by) if o.name == action)
    if not option.allowed:
        raise Refusal("forbidden", option.reason)  # the catalogue's words, as the call page shows them


def action_event(
    event: AuditAction, request: ActionRequest, call: Call, actor: Actor, *, reason: str = "", **evidence
) -> None:
    """One step of the request's story, on the call's task chain, in the caller's transaction."""
    append_event(
        action=event,
        actor=actor,
        task_id=call.task_id,
        call_id=call.pk,
        reason=reason,
        evidence={
            "request": request.pk,
            "action": request.action,
            "plan_hash": request.plan_hash,
            "call_version": request.call_version,
            **evidence,
        },
    )


# --- the plan ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Plan:
    data: dict  # ActionRequest.plan
    hash: str
    gate: GateDecision | None = None  # the dry-run gate answer (replay), to store as a dry-run GateDecision
    candidate: Candidate | None = None

    @property
    def failed_checks(self) -> list[dict]:
        return [check for check in self.data["checks"] if not check["passed"]]


# Everything that decides what executing the plan would do; check details and forbidden reasons are wording.
_HASHED = (
    "action", "call_id", "call_version", "state", "target_state", "write", "approval", "idempotency_key",
    "sends", "requests", "evidence",
)  # fmt: skip


def plan_hash(data: dict) -> str:
    """sha256 of the plan's canonical JSON without its volatile wording: only what decides the execution."""
    stable = {key: data.get(key) for key in _HASHED}
    stable["checks"] = [[check["check"], check["passed"]] for check in data.get("checks", [])]
    stable["forbidden"] = sorted(item["action"] for item in data.get("forbidden", []))
    return canonical_digest(stable)


def _forbidden(call: Call, facts: CallFacts) -> list[dict]:
    """The actions a reviewer could not take on the call now, with why (what every plan lists)."""
    return [
        {"action": option.name, "reason": option.reason}
        for option in options_for(call, facts, perms={REVIEW_PERMISSION}, held_by="")
        if not option.allowed
    ]


def approval_needed(action: Action) -> str:
    if action.write or not settings.RECOVERY_READ_ACTIONS_ONE_CONFIRMATION:
        return SECOND_PERSON
    return ONE_CONFIRMATION


def build_plan(call: Call, action_name: str, *, facts: CallFacts, evidence: dict, now: datetime) -> Plan:
    """The dry run of `action_name` on `call` (read with call_for_action): nothing is sent, nothing stored."""
    action = ACTION_BY_NAME[action_name]
    with_alternates(call.tool)
    policy = tool_policy(call.tool)
    if action.name in COMPENSATES:
        return _compensation_plan(call, action, facts=facts, evidence=evidence, now=now)
    requests_, sends = _requests(call, action)
    gate, candidate = _dry_gate(call, policy, action, now)
    checks = [
        _admission(action, gate),
        _breaker(call, policy, action, gate, now),
        _call_budget(call, policy, action),
        _task_budget(call, policy, action, now),
        _side_effect_budget(call, policy, action),
        _key_retention(call, facts, action, now),
    ]
    forbidden = _forbidden(call, facts)
    data = {
        "action": action.name,
        "label": action.label,
        "does": action.does,
        "call_id": call.pk,
        "call_version": call.version,
        "state": call.state,
        "target_state": str(action.target) if action.target else None,
        "write": action.write,
        "approval": approval_needed(action),
        "tool": call.tool.name,
        "provider": call.tool.provider.name,
        "idempotency_key": call.idempotency_key,
        "sends": sends,
        "requests": requests_,
        "checks": checks,
        "forbidden": forbidden,
        "expected_effects": _expected_effects(call, policy, action),
        "evidence": dict(evidence),
    }
    if call.tool.mcp:
        data["mcp_request"] = mcp_request(call)
    stored_gate = gate if action.name in MAKES_ATTEMPT else None
    return Plan(data=data, hash=plan_hash(data), gate=stored_gate, candidate=candidate if stored_gate else None)


def mcp_request(call: Call) -> dict:
    """The exact `tools/call` of a call through the MCP gateway (server, tool, arguments as sent, the key in _meta):
    as the gateway stored it, or as it would send it for an MCP call made otherwise."""
    stored = McpCall.objects.filter(call_id=call.pk).values_list("request", flat=True).first()
    return stored or upstream_request(call.tool, call.arguments, call.idempotency_key)


def _requests(call: Call, action: Action) -> tuple[list[dict], bool]:
    """The provider requests executing `action` would send, as a plan shows them (credentials masked)."""
    if action.name == "execute_held":
        return [held_request(call)], True
    if action.name in MAKES_ATTEMPT:
        try:
            return [tool_request(call.tool, call).shown()], True
        except TemplateError as exc:
            raise PlanError(str(exc)) from None
    if action.name == "probe_duplicate":
        try:
            replay = tool_request(call.tool, call).shown()
        except TemplateError as exc:
            raise PlanError(str(exc)) from None
        ledger = shown_lookup(call.tool, call)  # the ledger by key, or the listing that counts the key's effects
        return [replay, ledger] if ledger else [replay], True
    if action.name == "reconcile_now":
        lookup = shown_lookup(call.tool, call)
        return ([lookup], True) if lookup else ([], False)
    return [], False


def held_request(call: Call) -> dict:
    """The exact `tools/call` a held call's execution sends (docs/mcp-gateway.md, "Approval holds"), as a plan shows a
    request: the server, its tool, the arguments with the intent key's marker, and the key in `_meta`."""
    tool, key = call.tool, call.idempotency_key
    body = {
        "name": tool.mcp.get("tool", tool.name),
        "arguments": forwarded_arguments(tool, call.arguments, key),
        "_meta": {KEY_META: key},
    }
    return {"method": "tools/call", "url": f"mcp://{tool.provider.name}", "headers": {}, "body": body}


def _dry_gate(call: Call, policy: ToolPolicy, action: Action, now: datetime):
    """What the real gate would answer the attempt this action makes (or lets the runtime make), approval granted.

    The gate reads the stored facts (attempts, receipts, budgets, the breaker) and stores nothing here. A granted
    approval's attempt is asked as the call will be then: RETRYABLE.
    """
    if action.name not in MAKES_ATTEMPT | LETS_ATTEMPT:
        return None, None
    context, view = gate_context(
        call, tool=policy, candidate_tool=None, executing_tool=call.tool, task=call.task, now=now, approval=True
    )
    if action.name in LETS_ATTEMPT:
        view = replace(view, state=S.RETRYABLE)
    candidate = Candidate(
        attempt_id=PREVIEW_ATTEMPT, tool=policy.name, arguments=call.arguments, evidence=(APPROVAL_GRANTED,)
    )
    return admit(view, candidate, context), candidate


def _check(name: str, passed: bool, detail: str) -> dict:
    return {"check": name, "passed": passed, "detail": detail}


def _admission(action: Action, gate: GateDecision | None) -> dict:
    if gate is None:
        if action.name == "reconcile_now":
            return _check("admission", True, "a status check is a receipt, not an attempt: the gate does not govern it")
        return _check("admission", True, "no attempt is made: the gate is not asked")
    who = "the replay" if action.name in MAKES_ATTEMPT else "the runtime's next attempt"
    if gate.allowed:
        return _check("admission", True, f"the gate would admit {who} on approval_granted ({gate.reason})")
    failing = next((check.detail for check in gate.checks if not check.passed), "")
    return _check("admission", False, f"the gate would deny {who}: {gate.reason} ({failing})")


def _breaker(call: Call, policy: ToolPolicy, action: Action, gate: GateDecision | None, now: datetime) -> dict:
    if action.name == "reconcile_now":
        return _status_breaker(call, now)
    if action.name == "probe_duplicate":
        view = breaker_view(call.tool, now=now)
        said = f"{policy.name}'s breaker is {view.state}"
        return _check(
            "breaker", True, f"{said}: a probe is a receipt, not an attempt; it is neither counted nor refused"
        )
    if gate is None:
        return _check("breaker", True, "no request to the provider: the tool's breaker is not involved")
    view = breaker_view(call.tool, now=now)
    if view.state == BreakerState.CLOSED:
        return _check("breaker", True, f"{policy.name}'s breaker is closed")
    if view.state == BreakerState.HALF_OPEN and view.probe_available:
        return _check("breaker", True, f"{policy.name}'s breaker is half open: this attempt would be its probe")
    wait = f"; the cooldown ends in {view.retry_in_ms // 1000} s" if view.retry_in_ms else ""
    return _check("breaker", False, f"{policy.name}'s breaker is {view.state}: the attempt would be refused{wait}")


def _status_breaker(call: Call, now: datetime) -> dict:
    """The provider's status-endpoint breaker, read without reserving its probe."""
    provider = call.tool.provider
    row = StatusBreaker.objects.filter(provider=provider).values_list("state", "opened_at", "probe_until").first()
    if row is None or row[0] == BreakerState.CLOSED:
        return _check("breaker", True, f"{provider.name}'s status endpoint breaker is closed")
    state, opened_at, probe_until = row
    cooldown = status_breaker_policy(provider).cooldown_s
    if state == BreakerState.OPEN and opened_at is not None and now < opened_at + timedelta(seconds=cooldown):
        left = int((opened_at + timedelta(seconds=cooldown) - now).total_seconds())
        return _check("breaker", False, f"the status endpoint breaker is open: the check would be skipped ({left} s)")
    if state == BreakerState.HALF_OPEN and probe_until is not None and now < probe_until:
        return _check("breaker", False, "the status endpoint breaker is half open with its probe out: skipped")
    return _check("breaker", True, "the status endpoint breaker's cooldown is over: this check would be its probe")


def _limits(call: Call, policy: ToolPolicy) -> Budgets:
    return tighter(policy.budgets, task_budgets(call.task), Budgets(max_attempts=call.max_attempts))


def _attempting(action: Action) -> bool:
    return action.name in MAKES_ATTEMPT | LETS_ATTEMPT


def _call_budget(call: Call, policy: ToolPolicy, action: Action) -> dict:
    if not _attempting(action):
        return _check("call_budget", True, f"no attempt: {call.attempts_count} made, none added")
    limit = _limits(call, policy).max_attempts
    if limit is None:
        return _check("call_budget", True, f"attempt {call.attempts_count + 1}: no attempt limit")
    if call.attempts_count >= limit:
        return _check("call_budget", False, f"all {limit} attempts of the call are used")
    return _check("call_budget", True, f"attempt {call.attempts_count + 1} of {limit}")


def _task_budget(call: Call, policy: ToolPolicy, action: Action, now: datetime) -> dict:
    if not _attempting(action):
        return _check("task_budget", True, "no attempt: the task's rounds and tokens are not used")
    task, limits = call.task, _limits(call, policy)
    if limits.max_rounds is not None and task.rounds_used >= limits.max_rounds:
        return _check("task_budget", False, f"the task used all {limits.max_rounds} rounds")
    if limits.token_budget is not None and task.tokens_used >= limits.token_budget:
        return _check("task_budget", False, f"the task used its token budget ({limits.token_budget})")
    if limits.deadline is not None and now >= limits.deadline:
        return _check("task_budget", False, f"the task's deadline {limits.deadline.isoformat()} has passed")
    rounds = f"round {task.rounds_used + 1}" + (f" of {limits.max_rounds}" if limits.max_rounds is not None else "")
    deadline = f", deadline {limits.deadline.isoformat()}" if limits.deadline is not None else ", no deadline"
    return _check("task_budget", True, rounds + deadline)


def _side_effect_budget(call: Call, policy: ToolPolicy, action: Action) -> dict:
    """docs/design/budgets.md: effects observed against max_business_effects, the task's write retries, its unsettled
    unknowns."""
    if call.side_effect != "write":
        return _check("side_effect_budget", True, "a read has no business effect")
    limits = _limits(call, policy)
    shown = shown_facts(call)  # the effects as every page states them
    most, seen = limits.max_business_effects, shown.effects_at_least
    effects = f"{shown.effects_text} for the key" + (f", at most {most}" if most is not None else "")
    if action.name == "mark_not_committed" and seen:
        return _check("side_effect_budget", False, f"{effects}: the provider reports the effect, it was committed")
    if action.name == "probe_duplicate":
        return _check(
            "side_effect_budget",
            True,
            f"{effects}; the probe adds none if the provider deduplicates, one on this test tenant if it does not "
            "(that effect is the evidence)",
        )
    if not _attempting(action):
        return _check("side_effect_budget", True, f"{effects}; this action adds none")
    if most is not None and seen > most:
        return _check("side_effect_budget", False, f"{effects}: a duplicate effect, never retried")
    task = call.task
    if call.attempts_count >= 1 and limits.write_retry is not None and task.write_retries_used >= limits.write_retry:
        return _check("side_effect_budget", False, f"{effects}; the task used all {limits.write_retry} write retries")
    blocked = _unknowns_over_budget(call, policy)
    if blocked:
        return _check("side_effect_budget", False, f"{effects}; {blocked}")
    retries = "the first write"
    if call.attempts_count >= 1:
        of = f" of {limits.write_retry}" if limits.write_retry is not None else ""
        retries = f"write retry {task.write_retries_used + 1}{of}"
    return _check("side_effect_budget", True, f"{effects}; {retries}; unsettled unknowns within the task's budget")


def _unknowns_over_budget(call: Call, policy: ToolPolicy) -> str:
    """Why the task's unsettled UNKNOWN outcomes hold its writes back (docs/design/budgets.md unknown_budget), or ""."""
    view = task_view(call.task)
    own = 1 if call.state in UNSETTLED else 0
    task_limit = view.budgets.unknown_budget
    if task_limit is not None and view.unsettled_unknowns - own > task_limit:
        return f"{view.unsettled_unknowns - own} unsettled unknown(s) in the task, it tolerates {task_limit}"
    limit = view.unknown_budget_by_tool.get(policy.name, policy.budgets.unknown_budget)
    unsettled = view.unsettled_by_tool.get(policy.name, 0) - own
    if limit is not None and unsettled > limit:
        return f"{unsettled} unsettled unknown(s) of {policy.name}, it tolerates {limit}"
    return ""


def _key_retention(call: Call, facts: CallFacts, action: Action, now: datetime) -> dict:
    kept = f"the provider keeps the key {facts.key_retention_s} s from {facts.key_since.isoformat()}"
    if call.side_effect != "write":
        return _check("key_retention", True, "a read is not deduplicated by key")
    if action.name == "reconcile_now":
        if facts.key_expired:
            return _check("key_retention", True, f"{kept}: expired, a 'not found' would prove nothing by itself")
        return _check("key_retention", True, f"{kept}: the status query finds it by key")
    if not _attempting(action) and action.name != "probe_duplicate":
        return _check("key_retention", True, "no key is replayed")
    if facts.key_expired:
        return _check("key_retention", False, f"{kept}: expired, a replay would be a new operation")
    left = int((facts.key_expires_at - now).total_seconds())
    return _check("key_retention", True, f"{kept}: {left} s left, a replay is deduplicated")


def _noun(call: Call) -> str:
    return call.tool.name.split(".")[0].replace("_", " ")


# What executing an action does, in the plan's words, for the actions whose effects do not depend on the call.
_EFFECTS = {
    "reconcile_now": "no business effect: one status query and a receipt; the provider's answer may settle the call",
    "escalate": "no request to the provider: the call moves to HUMAN_REVIEW, where a person settles it with evidence",
    "mark_committed": "no request to the provider: an operator receipt with the evidence; the call becomes COMMITTED",
    "mark_not_committed": (
        "no request to the provider: an operator receipt with the evidence; the call becomes NOT_COMMITTED, then "
        "RETRYABLE (a same-key retry is admitted on state_verified) or FAILED_PERMANENT when no attempt is left"
    ),
    "mark_compensation_committed": (
        "no request to the provider: an operator receipt with the evidence on the entry in review; the entry "
        "becomes committed and the call COMPENSATED"
    ),
    "mark_compensation_failed": (
        "no request to the provider: an operator receipt with the evidence on the entry in review; the entry "
        "becomes failed and the call COMPENSATION_FAILED (a new compensation may then be approved)"
    ),
    "abandon": "no request to the provider: the call ends FAILED_PERMANENT (abandoned) and is never attempted again",
}


def _expected_effects(call: Call, policy: ToolPolicy, action: Action) -> str:
    name, key = action.name, call.idempotency_key
    if name == "replay_same_key":
        return _replay_effects(call, policy)
    if name == "execute_held":
        return (
            f"one {_noun(call)} at most: the held tools/call is sent once, with the intent key {key}; its result is "
            "kept and answered to the client's re-issue of the same call, never executed again. An outcome not known "
            "(a timeout, the server dying) makes the call UNKNOWN, settled by the status tool, never re-sent"
        )
    if name == "probe_duplicate":
        return (
            f"one {_noun(call)} in all if the provider deduplicates by key {key} (the probe then proves the retry "
            "path safe); two if it ignores keys — the second effect is the evidence, on a test tenant, and the retry "
            "path becomes unsafe. The call does not move."
        )
    if name == "restore_retry_path":
        return (
            f"no request to the provider: {call.tool.name}'s retry path becomes safe again (covering keys as old as "
            "this call's), and same-key replays of the tool are admitted"
        )
    if name == "grant_approval":
        return (
            "no request now: the call becomes RETRYABLE and the runtime's next attempt with approval_granted is "
            f"admitted once, with the same key {key}"
        )
    return _EFFECTS.get(name, _EFFECTS["abandon"])


def _replay_effects(call: Call, policy: ToolPolicy) -> str:
    if call.side_effect != "write":
        return "a read: no business effect, one more answer"
    most = _limits(call, policy).max_business_effects or 1
    what = f"one {_noun(call)}" if most == 1 else f"{most} {_noun(call)} effects"
    return (
        f"{what} at most: the provider deduplicates by key {call.idempotency_key} (if the first request took "
        "effect, it answers with that result and makes no second one); the reply is classified like any attempt"
    )


# --- a compensation's plan ------------------------------------------------------------------------------------------


def _compensation_plan(call: Call, action: Action, *, facts: CallFacts, evidence: dict, now: datetime) -> Plan:
    """The dry run of the call's next compensation entry: the exact request it would send (its own derived key,
    the compensation tool's template filled from the call, credentials masked), the checks, the expected effect."""
    try:
        entry = next_entry_plan(call)
        outgoing = entry.request()
    except Refusal as exc:
        fields = "; ".join(f"{e.field}: {e.suggestion}" for e in exc.field_errors)
        raise PlanError(f"{exc.message}" + (f" ({fields})" if fields else "")) from None
    except TemplateError as exc:
        raise PlanError(str(exc)) from None
    tool = entry.tool
    view = breaker_view(tool, now=now)
    limit = f"up to {entry.max_attempts} attempts" if entry.max_attempts is not None else "no attempt limit"
    earlier = entry.number - 1
    checks = [
        _check(
            "admission",
            True,
            f"a compensation is its own side effect, not an attempt of this call: entry {entry.number} of the ledger"
            + (f", after {earlier} final entr{'y' if earlier == 1 else 'ies'}" if earlier else ""),
        ),
        _check("breaker", True, f"{tool.name}'s breaker is {view.state}: an undo is not held back by it"),
        _check("call_budget", True, f"entry {entry.number}: {limit} of {tool.name}, its own budget"),
        _check("task_budget", True, "not counted: an undo stays possible whatever the task's deadline, rounds, tokens"),
        _check(
            "side_effect_budget",
            True,
            f"the forward effect stands ({shown_facts(call).effects_text}); {entry.expected_effect}",
        ),
        _check("key_retention", True, f"its own key {entry.idempotency_key}, new to the provider"),
    ]
    forbidden = _forbidden(call, facts)
    data = {
        "action": action.name,
        "label": action.label,
        "does": action.does,
        "call_id": call.pk,
        "call_version": call.version,
        "state": call.state,
        "target_state": str(action.target),
        "write": action.write,
        "approval": approval_needed(action),
        "tool": tool.name,
        "provider": tool.provider.name,
        "idempotency_key": entry.idempotency_key,
        "sends": True,
        "requests": [outgoing.shown()],
        "checks": checks,
        "forbidden": forbidden,
        "expected_effects": (
            f"{entry.expected_effect}: entry {entry.number} of the compensation ledger, target {entry.target}; the "
            "call stays COMPENSATING until the entry settles (its reply, or a receipt by its own key), then ends "
            "COMPENSATED, PARTIAL_COMPENSATED or COMPENSATION_FAILED; the task's other writes wait meanwhile"
        ),
        "evidence": dict(evidence),
        "compensation": {"number": entry.number, "tool": tool.name, "arguments": entry.arguments},
    }
    return Plan(data=data, hash=plan_hash(data))

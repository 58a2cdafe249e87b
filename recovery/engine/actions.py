"""The operator actions' catalogue (docs/actions.md): `actions_for()` answers, from a call's state, a person's
permissions and a few facts about the call, every action as "allowed now" or the exact reason it is forbidden. The
call page shows that answer and the services ask the same function first, so the page never offers what they refuse.
Where the sources are narrower than the state table, docs/design/state-machine.md says why (evidence, blind replays).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from recovery.engine.states import EDGES, RECONCILABLE, CallState

S = CallState

REVIEW_PERMISSION = "recovery.review_call"
ALLOWED = "allowed now"


@dataclass(frozen=True, kw_only=True)
class Action:
    """One kind of operator action: what it does, from which states, and what it takes to run it."""

    name: str
    label: str
    target: CallState | None  # the state it moves the call to; None: it moves nothing by itself
    sources: frozenset[CallState]
    write: bool  # changes the call or the world: a second person approves it (reads need one confirmation)
    permission: str
    does: str  # what it would do, as the page says it


@dataclass(frozen=True, kw_only=True)
class ActionOption:
    """An action as offered on one call to one person now: allowed, or the reason it is not."""

    name: str
    label: str
    allowed: bool
    reason: str  # "allowed now: ..." or why it is forbidden
    write: bool
    permission: str
    approval: str  # who has to agree before it runs


_UNSETTLED = frozenset({S.UNKNOWN, S.STILL_UNKNOWN})

RECONCILE_NOW = Action(
    name="reconcile_now",
    label="Reconcile now",
    target=None,  # a receipt: the provider's answer may move the call, the action itself does not
    sources=frozenset(RECONCILABLE),
    write=False,
    permission=REVIEW_PERMISSION,
    does="asks the provider's status API about this idempotency key now and records a receipt",
)
ESCALATE = Action(
    name="escalate",
    label="Escalate to human review",
    target=S.HUMAN_REVIEW,
    sources=_UNSETTLED,
    write=True,
    permission=REVIEW_PERMISSION,
    does="moves the call to HUMAN_REVIEW, where a person settles it with evidence",
)
REPLAY_SAME_KEY = Action(
    name="replay_same_key",
    label="Replay with the same idempotency key",
    target=S.SENT,
    sources=frozenset({S.HUMAN_REVIEW}),
    write=True,
    permission=REVIEW_PERMISSION,
    does="sends the call again with its own idempotency key, so the provider can deduplicate it",
)
MARK_COMMITTED = Action(
    name="mark_committed",
    label="Mark committed",
    target=S.COMMITTED,
    sources=frozenset({S.HUMAN_REVIEW}),
    write=True,
    permission=REVIEW_PERMISSION,
    does="records, with evidence, that the effect exists (COMMITTED)",
)
MARK_NOT_COMMITTED = Action(
    name="mark_not_committed",
    label="Mark not committed",
    target=S.NOT_COMMITTED,
    sources=frozenset({S.HUMAN_REVIEW}),
    write=True,
    permission=REVIEW_PERMISSION,
    does="records, with evidence, that the provider never executed it (NOT_COMMITTED)",
)
GRANT_APPROVAL = Action(
    name="grant_approval",
    label="Grant approval",
    target=S.RETRYABLE,
    sources=frozenset({S.HUMAN_REVIEW}),
    write=True,
    permission=REVIEW_PERMISSION,
    does="lets the runtime try again (RETRYABLE), admitted on approval_granted",
)
ABANDON = Action(
    name="abandon",
    label="Abandon",
    target=S.FAILED_PERMANENT,
    # Not SENT (an attempt is in flight: its outcome decides) nor ACCEPTED (the provider is still working on it).
    sources=frozenset({S.READY, S.RETRYABLE, S.NOT_COMMITTED, S.HUMAN_REVIEW}),
    write=True,
    permission=REVIEW_PERMISSION,
    does="gives the call up (FAILED_PERMANENT): it will not be attempted again",
)
START_COMPENSATION = Action(
    name="start_compensation",
    label="Start compensation",
    target=S.COMPENSATING,
    sources=frozenset({S.COMMITTED}),
    write=True,
    permission=REVIEW_PERMISSION,
    does=(
        "undoes the committed effect with the tool's registered compensation, as its own side effect with its own "
        "key (COMPENSATING until its entry settles)"
    ),
)
APPROVE_NEW_COMPENSATION = Action(
    name="approve_new_compensation",
    label="Approve new compensation",
    target=S.COMPENSATING,
    sources=frozenset({S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED}),
    write=True,
    permission=REVIEW_PERMISSION,
    does="makes the next compensation entry, with the next key of the ledger, after one that undid less or nothing",
)
MARK_COMPENSATION_COMMITTED = Action(
    name="mark_compensation_committed",
    label="Mark compensation committed",
    target=None,  # moves the entry (review → committed); the call then ends COMPENSATED
    sources=frozenset({S.COMPENSATING}),
    write=True,
    permission=REVIEW_PERMISSION,
    does="records, with evidence, that the compensation in review took effect (the call ends COMPENSATED)",
)
MARK_COMPENSATION_FAILED = Action(
    name="mark_compensation_failed",
    label="Mark compensation not executed",
    target=None,  # moves the entry (review → failed); the call then ends COMPENSATION_FAILED
    sources=frozenset({S.COMPENSATING}),
    write=True,
    permission=REVIEW_PERMISSION,
    does="records, with evidence, that the compensation in review never executed (the call ends COMPENSATION_FAILED)",
)
PROBE_DUPLICATE = Action(
    name="probe_duplicate",
    label="Run a duplicate probe",
    target=None,  # a probe is a receipt of its own: it moves no call, it sets the tool's retry path
    sources=frozenset({S.COMMITTED}),
    write=True,
    permission=REVIEW_PERMISSION,
    does=(
        "replays this committed call once with its original key on a test tenant and reads the provider's ledger "
        "for the key: one effect proves the tool's retry path safe, a second effect or a new business id unsafe"
    ),
)
RESTORE_RETRY_PATH = Action(
    name="restore_retry_path",
    label="Turn the retry path back on",
    target=None,  # moves no call: the tool's retry path goes from unsafe back to safe
    sources=frozenset({S.COMMITTED}),
    write=True,
    permission=REVIEW_PERMISSION,
    does=(
        "sets this tool's retry path back to safe with your reason (after the provider was fixed), without a "
        "new probe: same-key replays of the tool are admitted again"
    ),
)
EXECUTE_HELD = Action(
    name="execute_held",
    label="Execute the held MCP call",
    target=S.SENT,
    sources=frozenset({S.READY}),
    write=True,
    permission=REVIEW_PERMISSION,
    does=(
        "sends the held tools/call once, exactly as previewed, admitted on approval_granted; its result is kept for "
        "the client's re-issue, and the task's other holds of the tool are refused"
    ),
)
_COMPENSATIONS = (START_COMPENSATION, APPROVE_NEW_COMPENSATION)
_ENTRY_SETTLES = (MARK_COMPENSATION_COMMITTED, MARK_COMPENSATION_FAILED)

ACTIONS: tuple[Action, ...] = (
    RECONCILE_NOW,
    ESCALATE,
    REPLAY_SAME_KEY,
    MARK_COMMITTED,
    MARK_NOT_COMMITTED,
    GRANT_APPROVAL,
    ABANDON,
    START_COMPENSATION,
    APPROVE_NEW_COMPENSATION,
    MARK_COMPENSATION_COMMITTED,
    MARK_COMPENSATION_FAILED,
    PROBE_DUPLICATE,
    RESTORE_RETRY_PATH,
    EXECUTE_HELD,
)


def _check_edges() -> None:
    """Each action's source states are edges of the state table: checked at import, so an edge removed from the table
    makes this module fail loudly instead of offering an action the database would refuse."""
    for action in ACTIONS:
        if action.target is None:
            continue
        missing = sorted(str(src) for src in action.sources if action.target not in EDGES[src])
        if missing:
            raise RuntimeError(f"action {action.name}: the state table has no edge {missing} -> {action.target}")


_check_edges()


_ANY = None  # a rule about every action, or every state
_BUT_RECONCILE = frozenset(ACTIONS) - {RECONCILE_NOW}
# Why the state table (and docs/design/state-machine.md) keeps an action from a state it is not allowed from: the first
# rule naming both the action and the state gives the reason ({state}: the call's state).
_STATE_RULES: tuple[tuple[Collection[Action] | None, Collection[CallState] | None, str], ...] = (
    (
        _ANY,
        {S.COMPENSATING},
        "a compensation is under way: its entry settles it (sent, reconciled by its own key, or reviewed)",
    ),
    (_ENTRY_SETTLES, _ANY, "only a compensation in review is settled by hand; this call is {state}"),
    (_COMPENSATIONS, {S.COMPENSATED}, "the effect was already undone (COMPENSATED): created, then compensated"),
    (
        {START_COMPENSATION},
        {S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED},
        "the call is {state}: an earlier compensation ended; approve a new compensation instead",
    ),
    ({APPROVE_NEW_COMPENSATION}, {S.COMMITTED}, "no compensation has been tried yet: start one"),
    (_COMPENSATIONS, _ANY, "only a committed effect is compensated; this call is {state}"),
    ({PROBE_DUPLICATE}, _ANY, "only a COMMITTED call (the effect a probe replays) is probed; this one is {state}"),
    (
        {RESTORE_RETRY_PATH},
        _ANY,
        "the retry path is turned back on from a COMMITTED call of the tool (a probed one); this one is {state}",
    ),
    (
        _BUT_RECONCILE,
        {S.COMMITTED},
        "the call is COMMITTED: the effect exists and the call is never admitted or settled again",
    ),
    ({REPLAY_SAME_KEY}, _UNSETTLED, "a blind replay is forbidden while the outcome is unknown: reconcile by key first"),
    (
        {MARK_COMMITTED, MARK_NOT_COMMITTED},
        _UNSETTLED,
        "an UNKNOWN call settles only on provider evidence (a receipt, a signed callback or an idempotency record): "
        "escalate it to human review first",
    ),
    (
        {GRANT_APPROVAL},
        _UNSETTLED,
        "the outcome is unknown: a retry now would be a blind replay; reconcile by key or escalate first",
    ),
    (
        {ABANDON},
        _UNSETTLED,
        "the effect may exist: abandoning would hide it; it keeps being reconciled (escalate it first)",
    ),
    (_ANY, {S.SENT}, "an attempt is in flight: its outcome (or the sweeper, after the tool's outcome timeout) decides"),
    (_BUT_RECONCILE, {S.ACCEPTED}, "the provider accepted it and is still working on it: reconciliation settles it"),
    ({EXECUTE_HELD}, _ANY, "only a READY call held for an approval is executed this way; this one is {state}"),
    ({RECONCILE_NOW}, _ANY, "only UNKNOWN, STILL_UNKNOWN and ACCEPTED calls are reconciled; this one is {state}"),
    ({ESCALATE}, {S.HUMAN_REVIEW}, "the call is already in human review"),
    ({ESCALATE}, _ANY, "only an UNKNOWN or STILL_UNKNOWN call is escalated; this one is {state}"),
    ({ABANDON}, {S.FAILED_PERMANENT, S.COMPENSATED}, "the call is already final ({state})"),
    (
        {REPLAY_SAME_KEY, GRANT_APPROVAL},
        {S.READY, S.RETRYABLE, S.NOT_COMMITTED},
        "the call is {state}: the runtime makes its next attempt itself, admitted by the gate",
    ),
)


def _state_reason(action: Action, state: CallState) -> str:
    """Why the state table keeps `action` from `state` (the first of _STATE_RULES that applies); "" when it does
    not."""
    if state in action.sources:
        return ""
    for actions, states, reason in _STATE_RULES:
        if (actions is _ANY or action in actions) and (states is _ANY or state in states):
            return reason.format(state=state)
    allowed_from = ", ".join(sorted(str(s) for s in action.sources))
    return f"not possible from {state}: only from {allowed_from}"


@dataclass(frozen=True, kw_only=True)
class _Facts:
    """What _policy_reason reads of a call besides its state."""

    side_effect: str  # read / write
    has_status_api: bool  # its tool can be asked
    key_expired: bool  # the provider's key retention has passed
    retry_path_safe: bool  # no duplicate probe saw a second effect
    duplicate_effect: bool  # a receipt saw more effects than allowed
    has_compensation: bool  # its tool declares one
    compensation_in_review: bool  # its open compensation entry waits for a person
    sandbox_tenant: bool  # its tenant is a test tenant: duplicate probes allowed
    retry_path: str  # its tool's: unprobed, safe, unsafe
    held: bool = False  # its tool's registry entry holds its first attempt for an approval (docs/mcp-gateway.md)

    @property
    def write(self) -> bool:
        return self.side_effect == "write"


# Why a call's own facts forbid an action its state allows: the first rule naming the action whose condition holds
# gives the reason ({retry_path}: the tool's retry path).
_POLICY_RULES: tuple[tuple[Collection[Action], Callable[[_Facts], bool], str], ...] = (
    (
        {PROBE_DUPLICATE, RESTORE_RETRY_PATH},
        lambda f: not f.write,
        "a read has no effect a provider could duplicate: its retry path needs no proof",
    ),
    (
        {PROBE_DUPLICATE},
        lambda f: not f.sandbox_tenant,
        "duplicate probes run on sandbox (test) tenants only: a probe makes a real second request",
    ),
    (
        {PROBE_DUPLICATE},
        lambda f: not f.has_status_api,
        "the tool has no status API: the provider's ledger cannot be read, so a probe would prove nothing",
    ),
    (
        {PROBE_DUPLICATE},
        lambda f: f.key_expired,
        "the provider no longer keeps this idempotency key: a replay would be a new operation",
    ),
    (
        {RESTORE_RETRY_PATH},
        lambda f: f.retry_path != "unsafe",
        "the tool's retry path is {retry_path}, not unsafe: there is nothing to turn back on",
    ),
    (
        _COMPENSATIONS,
        lambda f: not f.has_compensation,
        "the tool declares no compensation in the registry: settle the effect by hand",
    ),
    (
        _ENTRY_SETTLES,
        lambda f: not f.compensation_in_review,
        "its compensation entry is not in review: it is being sent or reconciled by its own key",
    ),
    (
        {EXECUTE_HELD},
        lambda f: not f.held,
        "its tool is not held for an approval in the registry: the runtime makes its first attempt itself",
    ),
    (
        {RECONCILE_NOW},
        lambda f: not f.has_status_api,
        "the tool has no status API to ask: escalate it, a person settles it",
    ),
    (
        {REPLAY_SAME_KEY},
        lambda f: f.write and f.duplicate_effect,
        "the provider already reports more effects than allowed for this key: never replay it",
    ),
    (
        {REPLAY_SAME_KEY},
        lambda f: f.write and not f.retry_path_safe,
        "replay is switched off for this tool: a duplicate probe saw a second effect for one key (a new passing probe "
        "or an approved action turns it back on)",
    ),
    (
        {REPLAY_SAME_KEY},
        lambda f: f.write and f.key_expired,
        "the provider no longer keeps this idempotency key: a replay would not be deduplicated",
    ),
)


def _policy_reason(action: Action, facts: _Facts) -> str:
    """Why the call's own facts forbid an action its state allows (the first of _POLICY_RULES that applies); "" when
    nothing does."""
    for actions, applies, reason in _POLICY_RULES:
        if action in actions and applies(facts):
            return reason.format(retry_path=facts.retry_path)
    return ""


def actions_for(
    state: str,
    *,
    perms: Collection[str],
    side_effect: str,
    has_status_api: bool = True,
    key_expired: bool = False,
    retry_path_safe: bool = True,
    duplicate_effect: bool = False,
    has_compensation: bool = True,
    compensation_in_review: bool = False,
    sandbox_tenant: bool = False,
    retry_path: str = "unprobed",
    held_by: str = "",
    held: bool = False,
) -> list[ActionOption]:
    """Every action for a call in `state`, as `perms` (the person's permissions) may take it now, given the call's
    facts (as _Facts names them) and `held_by` (another person's live claim on it). The first reason that applies is
    given: the state table, then the call's facts, then the claim, then the role."""
    current = CallState(state)
    facts = _Facts(
        side_effect=side_effect,
        has_status_api=has_status_api,
        key_expired=key_expired,
        retry_path_safe=retry_path_safe,
        duplicate_effect=duplicate_effect,
        has_compensation=has_compensation,
        compensation_in_review=compensation_in_review,
        sandbox_tenant=sandbox_tenant,
        retry_path=retry_path,
        held=held,
    )
    options = []
    for action in ACTIONS:
        reason = _state_reason(action, current) or _policy_reason(action, facts)
        if not reason and held_by:
            reason = f"{held_by} holds the claim on this call: they work it until the claim ends"
        if not reason and action.permission not in perms:
            reason = f"needs the reviewer role ({action.permission})"
        options.append(
            ActionOption(
                name=action.name,
                label=action.label,
                allowed=not reason,
                reason=reason or f"{ALLOWED}: {action.does}",
                write=action.write,
                permission=action.permission,
                approval="a second person with the approver role" if action.write else "one confirmation",
            )
        )
    return options


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    name: str  # an action allowed now
    why: str
    retry_path: str = ""  # a same-key replay's: the tool's retry path it rests on (safe, or unprobed but declared)


def recommended(
    options: Collection[ActionOption],
    *,
    state: str,
    outcome: str,
    asked: str = "",
    retry_path: str = "",
    replay_safe: bool = False,
) -> Recommendation | None:
    """The action the call page leads with, among those `options` allows now: what the engine asked for (its
    latest card's required_next: an approval), else what settles an unknown outcome soonest — a status check while
    checks can still answer; once they are used up, a same-key replay when the provider is proven to deduplicate by
    the key (the retry path is safe), else an escalation to a person. None when nothing allowed fits."""
    allowed = {o.name for o in options if o.allowed}
    if asked == "request_approval" and "grant_approval" in allowed:
        return Recommendation(name="grant_approval", why="the provider refused it pending an approval")
    exhausted = outcome == "poll_budget_exhausted" or state == S.STILL_UNKNOWN
    if state == S.UNKNOWN and not exhausted and "reconcile_now" in allowed:
        return Recommendation(name="reconcile_now", why="a status check by its key settles it without a resend")
    if exhausted or state == S.HUMAN_REVIEW:
        if "replay_same_key" in allowed and (retry_path == "safe" or replay_safe):
            if retry_path == "safe":
                proof = "retry path safe: proved by a duplicate probe"
            else:
                proof = "retry path unprobed: its registry entry declares it, no duplicate probe has proved it yet"
            return Recommendation(
                name="replay_same_key",
                why=f"the provider deduplicates by this key ({proof}): a same-key replay settles it with no second "
                "effect",
                retry_path="safe" if retry_path == "safe" else "unprobed",
            )
        if state != S.HUMAN_REVIEW and "escalate" in allowed:
            return Recommendation(name="escalate", why="its status checks are used up: a person decides")
    return None

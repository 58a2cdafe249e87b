"""The catalogue of operator actions (docs/actions.md) and which are allowed now: every state for a reviewer and a
viewer.

Pure: no database. The expectations are written out from docs/design/state-machine.md and docs/actions.md rather than
computed from the module, so a change to either side shows here.
"""

from __future__ import annotations

import pytest

from recovery.engine.actions import ACTIONS, ALLOWED, REVIEW_PERMISSION, actions_for
from recovery.engine.states import EDGES, CallState
from recovery.models.roles import REVIEWER, ROLE_PERMISSIONS, VIEWER

S = CallState
REVIEWER_PERMS = frozenset(ROLE_PERMISSIONS[REVIEWER])
VIEWER_PERMS = frozenset(ROLE_PERMISSIONS[VIEWER])
NAMES = [
    "reconcile_now",
    "escalate",
    "replay_same_key",
    "mark_committed",
    "mark_not_committed",
    "grant_approval",
    "abandon",
    "start_compensation",
    "approve_new_compensation",
    "mark_compensation_committed",
    "mark_compensation_failed",
    "probe_duplicate",
    "restore_retry_path",
    "execute_held",
]

# What a reviewer may do on a write call, state by state (docs/design/state-machine.md's edges, narrowed by
# docs/actions.md).
ALLOWED_FOR_REVIEWER: dict[CallState, set[str]] = {
    S.READY: {"abandon"},
    S.SENT: set(),
    S.RETRYABLE: {"abandon"},
    S.ACCEPTED: {"reconcile_now"},
    S.UNKNOWN: {"reconcile_now", "escalate"},
    S.STILL_UNKNOWN: {"reconcile_now", "escalate"},
    S.NOT_COMMITTED: {"abandon"},
    S.COMMITTED: {"start_compensation"},
    S.FAILED_PERMANENT: set(),
    S.HUMAN_REVIEW: {"replay_same_key", "mark_committed", "mark_not_committed", "grant_approval", "abandon"},
    S.COMPENSATING: set(),
    S.COMPENSATED: set(),
    S.PARTIAL_COMPENSATED: {"approve_new_compensation"},
    S.COMPENSATION_FAILED: {"approve_new_compensation"},
}


def _by_name(options) -> dict:
    return {o.name: o for o in options}


def test_the_expectations_cover_every_state():
    assert set(ALLOWED_FOR_REVIEWER) == set(CallState)


@pytest.mark.parametrize("state", list(CallState))
def test_a_reviewer_gets_exactly_the_actions_the_state_allows(state):
    options = actions_for(state, perms=REVIEWER_PERMS, side_effect="write")
    assert [o.name for o in options] == NAMES  # every action, always, in one order
    allowed = {o.name for o in options if o.allowed}
    assert allowed == ALLOWED_FOR_REVIEWER[state]
    for option in options:
        assert option.reason, option
        assert option.reason.startswith(ALLOWED) == option.allowed, option
        if not option.allowed:
            assert "needs the reviewer role" not in option.reason  # a reviewer is refused for the call's sake


@pytest.mark.parametrize("state", list(CallState))
def test_a_held_mcp_call_is_executed_from_ready_only(state):
    """docs/mcp-gateway.md, "Approval holds": execute_held is allowed on a READY call whose tool the registry holds,
    and nowhere else; a call not held is told why."""
    held = _by_name(actions_for(state, perms=REVIEWER_PERMS, side_effect="write", held=True))
    assert held["execute_held"].allowed == (state == S.READY)
    plain = _by_name(actions_for(state, perms=REVIEWER_PERMS, side_effect="write"))["execute_held"]
    assert not plain.allowed
    if state == S.READY:
        assert "not held for an approval" in plain.reason


@pytest.mark.parametrize("state", list(CallState))
def test_a_viewer_may_take_no_action_and_is_told_why(state):
    options = actions_for(state, perms=VIEWER_PERMS, side_effect="write")
    assert not any(o.allowed for o in options)
    reviewer = _by_name(actions_for(state, perms=REVIEWER_PERMS, side_effect="write"))
    for option in options:
        if reviewer[option.name].allowed:
            assert option.reason == f"needs the reviewer role ({REVIEW_PERMISSION})"
        else:
            assert option.reason == reviewer[option.name].reason  # the state's reason comes first, for everyone


@pytest.mark.parametrize("role", ["approver", "admin"])
def test_approvers_and_admins_do_not_request_actions(role):
    options = _by_name(actions_for(S.UNKNOWN, perms=frozenset(ROLE_PERMISSIONS[role]), side_effect="write"))
    assert not options["reconcile_now"].allowed
    assert options["reconcile_now"].reason == "needs the reviewer role (recovery.review_call)"


def test_every_action_follows_an_edge_of_the_state_table():
    for action in ACTIONS:
        if action.target is not None:
            for source in action.sources:
                assert action.target in EDGES[source], (action.name, source)
        assert action.sources, action.name


def test_unknown_forbids_a_blind_replay_and_settling_by_hand():
    options = _by_name(actions_for(S.UNKNOWN, perms=REVIEWER_PERMS, side_effect="write"))
    replay = options["replay_same_key"]
    assert not replay.allowed
    assert replay.reason == "a blind replay is forbidden while the outcome is unknown: reconcile by key first"
    for name in ("mark_committed", "mark_not_committed"):
        assert "settles only on provider evidence" in options[name].reason
        assert "escalate it to human review first" in options[name].reason
    assert "the effect may exist" in options["abandon"].reason


def test_reads_and_writes_need_different_confirmations():
    options = _by_name(actions_for(S.HUMAN_REVIEW, perms=REVIEWER_PERMS, side_effect="write"))
    assert options["reconcile_now"].write is False
    assert all(options[n].write for n in NAMES if n != "reconcile_now")
    assert options["mark_committed"].approval == "a second person with the approver role"
    unknown = _by_name(actions_for(S.UNKNOWN, perms=REVIEWER_PERMS, side_effect="write"))
    assert unknown["reconcile_now"].approval == "one confirmation"


def test_a_replay_needs_the_key_still_kept_by_the_provider():
    options = _by_name(actions_for(S.HUMAN_REVIEW, perms=REVIEWER_PERMS, side_effect="write", key_expired=True))
    assert not options["replay_same_key"].allowed
    assert "no longer keeps this idempotency key" in options["replay_same_key"].reason
    assert options["mark_committed"].allowed  # only the replay depends on the key


def test_a_replay_is_refused_when_the_retry_path_is_unsafe_or_a_duplicate_was_seen():
    unsafe = _by_name(actions_for(S.HUMAN_REVIEW, perms=REVIEWER_PERMS, side_effect="write", retry_path_safe=False))
    assert "duplicate probe saw a second effect" in unsafe["replay_same_key"].reason
    duplicate = _by_name(actions_for(S.HUMAN_REVIEW, perms=REVIEWER_PERMS, side_effect="write", duplicate_effect=True))
    assert "more effects than allowed" in duplicate["replay_same_key"].reason
    read = _by_name(actions_for(S.HUMAN_REVIEW, perms=REVIEWER_PERMS, side_effect="read", key_expired=True))
    assert read["replay_same_key"].allowed  # a read has no effect to duplicate


def test_reconcile_now_needs_a_status_api():
    options = _by_name(actions_for(S.UNKNOWN, perms=REVIEWER_PERMS, side_effect="write", has_status_api=False))
    assert "no status API" in options["reconcile_now"].reason
    assert options["escalate"].allowed


def test_escalating_a_call_already_in_review_is_refused_as_such():
    options = _by_name(actions_for(S.HUMAN_REVIEW, perms=REVIEWER_PERMS, side_effect="write"))
    assert options["escalate"].reason == "the call is already in human review"


def test_a_colleagues_claim_holds_every_action_back():
    options = actions_for(S.HUMAN_REVIEW, perms=REVIEWER_PERMS, side_effect="write", held_by="bob")
    assert not any(o.allowed for o in options)
    held = {o.reason for o in options if o.name in ALLOWED_FOR_REVIEWER[S.HUMAN_REVIEW]}
    assert held == {"bob holds the claim on this call: they work it until the claim ends"}
    state_first = _by_name(actions_for(S.UNKNOWN, perms=REVIEWER_PERMS, side_effect="write", held_by="bob"))
    assert state_first["replay_same_key"].reason.startswith("a blind replay is forbidden")


def test_an_unknown_state_name_is_an_error():
    with pytest.raises(ValueError):
        actions_for("NOT_A_STATE", perms=REVIEWER_PERMS, side_effect="write")


def test_a_duplicate_probe_is_offered_on_a_committed_write_of_a_test_tenant_only():
    def probe(**facts):
        return _by_name(actions_for(S.COMMITTED, perms=REVIEWER_PERMS, side_effect="write", **facts))["probe_duplicate"]

    assert probe(sandbox_tenant=True).allowed
    assert "sandbox (test) tenants only" in probe(sandbox_tenant=False).reason
    assert "no status API" in probe(sandbox_tenant=True, has_status_api=False).reason
    assert "no longer keeps this idempotency key" in probe(sandbox_tenant=True, key_expired=True).reason
    read = _by_name(actions_for(S.COMMITTED, perms=REVIEWER_PERMS, side_effect="read", sandbox_tenant=True))
    assert "a read has no effect" in read["probe_duplicate"].reason
    unknown = _by_name(actions_for(S.UNKNOWN, perms=REVIEWER_PERMS, side_effect="write", sandbox_tenant=True))
    assert "only a COMMITTED call" in unknown["probe_duplicate"].reason
    assert probe(sandbox_tenant=True).write  # a second person approves it: it makes a real request


def test_the_retry_path_is_turned_back_on_only_where_a_probe_turned_it_off():
    def restore(path):
        options = actions_for(S.COMMITTED, perms=REVIEWER_PERMS, side_effect="write", retry_path=path)
        return _by_name(options)["restore_retry_path"]

    assert restore("unsafe").allowed and restore("unsafe").write
    assert "is safe, not unsafe" in restore("safe").reason
    assert "is unprobed, not unsafe" in restore("unprobed").reason

"""Random walks through the state table of docs/design/state-machine.md, driven by hypothesis.

Each example registers a fresh task and call, then tries random target states through `transition_call` — some from
the current copy of the call, some from a stale copy read at an earlier version. A model of the state table
(transcribed from the spec in tests/test_states.py, not taken from recovery/engine/states.py) predicts every answer.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from recovery.audit.chain import Actor, verify_chain
from recovery.engine.states import CallState
from recovery.models import AuditChainHead, AuditEvent, Call, Step, Task, Tenant, Tool
from recovery.statemachine.transitions import IllegalTransition, TransitionConflict, transition_call
from tests.test_states import SPEC_EDGES

_counter = itertools.count(1)
ACTOR = Actor.system("state-machine-test")
STATES = sorted(CallState)


def _snapshot(call_id: int, task_id: int) -> tuple:
    """Everything a failed transition must leave untouched."""
    row = Call.objects.values_list("state", "version", "state_changed_at", "updated_at").get(pk=call_id)
    head = AuditChainHead.objects.filter(key=f"task:{task_id}").values_list("length", "head_hash").first()
    return (*row, AuditEvent.objects.filter(call_id=call_id).count(), head)


class CallLifecycle(RuleBasedStateMachine):
    """Subclassed inside the test with `tenant` and `tool` set, so each run uses the test's own registry rows."""

    tenant: Tenant
    tool: Tool

    def __init__(self) -> None:
        super().__init__()
        tool = self.tool
        n = next(_counter)
        self.task = Task.objects.create(tenant=self.tenant, external_id=f"sm-{n}", agent="hypothesis", goal="walk")
        step = Step.objects.create(task=self.task, index=1)
        self.call = Call.objects.create(
            tenant=self.task.tenant,
            task=self.task,
            step=step,
            tool=tool,
            idempotency_key=f"sm-key-{n}",
            arguments={"n": n},
            fingerprint=f"{n:064d}",
            side_effect=tool.side_effect,
            risk=tool.risk,
        )
        self.model_state = CallState.READY  # what the table says the call must be in now
        self.path = [CallState.READY]  # every state the model went through, in order
        self.stale_copies: list[Call] = []  # copies of the call read before a later successful transition

    def _read_copy(self) -> Call:
        return Call.objects.get(pk=self.call.pk)

    @rule(to_state=st.sampled_from(STATES))
    def attempt_transition(self, to_state: CallState) -> None:
        before_copy = self._read_copy()
        before = _snapshot(self.call.pk, self.task.pk)
        if to_state in SPEC_EDGES[str(self.model_state)]:
            returned = transition_call(self.call, to_state, actor=ACTOR, reason=f"walk to {to_state}")
            assert returned is self.call
            assert (self.call.state, self.call.version) == (to_state, len(self.path))
            self.stale_copies.append(before_copy)
            self.model_state = to_state
            self.path.append(to_state)
        else:
            with pytest.raises(IllegalTransition):
                transition_call(self.call, to_state, actor=ACTOR, reason=f"walk to {to_state}")
            assert _snapshot(self.call.pk, self.task.pk) == before
            assert (self.call.state, self.call.version) == (self.model_state, len(self.path) - 1)

    @precondition(lambda self: SPEC_EDGES[str(self.model_state)])
    @rule(data=st.data())
    def take_a_legal_edge(self, data) -> None:
        """Random targets are mostly illegal; this keeps walks long enough to revisit states at new versions."""
        self.attempt_transition(data.draw(st.sampled_from(sorted(SPEC_EDGES[str(self.model_state)])), label="edge"))

    @rule(data=st.data())
    def attempt_an_illegal_edge(self, data) -> None:
        illegal = [state for state in STATES if state not in SPEC_EDGES[str(self.model_state)]]
        self.attempt_transition(data.draw(st.sampled_from(illegal), label="illegal target"))

    @precondition(lambda self: self.stale_copies)
    @rule(data=st.data())
    def attempt_with_a_stale_copy(self, data) -> None:
        stale = data.draw(st.sampled_from(self.stale_copies), label="stale copy")
        # A stale copy's state had an edge that was taken, so it always has a legal target to try.
        target = data.draw(st.sampled_from(sorted(SPEC_EDGES[stale.state])), label="target")
        stale_state, stale_version = stale.state, stale.version
        before = _snapshot(self.call.pk, self.task.pk)
        with pytest.raises(TransitionConflict):
            transition_call(stale, target, actor=ACTOR, reason="acting on an old read")
        assert _snapshot(self.call.pk, self.task.pk) == before
        assert (stale.state, stale.version) == (stale_state, stale_version)  # the caller's copy is left as read

    @invariant()
    def state_matches_the_model(self) -> None:
        db = self._read_copy()
        assert db.state == self.model_state
        assert db.version == len(self.path) - 1  # one bump per successful transition, none for failures

    @invariant()
    def audit_trail_is_a_walk_through_the_table(self) -> None:
        events = list(
            AuditEvent.objects.filter(call_id=self.call.pk).order_by("seq").values_list("from_state", "to_state")
        )
        assert len(events) == Call.objects.get(pk=self.call.pk).version
        walked = [CallState.READY] + [to for _, to in events]
        assert walked == self.path
        for (src, dst), expected_src in zip(events, walked, strict=False):
            assert src == expected_src
            assert dst in SPEC_EDGES[src]

    @invariant()
    def task_chain_verifies(self) -> None:
        report = verify_chain(f"task:{self.task.pk}")
        assert report.ok, report.problem
        assert report.events == len(self.path) - 1


def test_it_follows_the_state_table_on_random_walks(registry):
    class Machine(CallLifecycle):
        tool = registry["refund"]
        tenant = registry["tenant"]

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )

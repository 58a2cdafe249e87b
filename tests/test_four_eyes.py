"""Four eyes, the same rules for every kind of request a second person decides (docs/actions.md#four-eyes): an action
request, a bulk action, a breaker reset. Two approvers deciding at once — each on a thread with its own database
connection, released together — leave exactly one decision, and the other is told the request moved; the requester
never decides their own, refused by the service and, should the service's check be skipped, by the database's
constraint. The approvals queue and the navigation's count see every kind.

The requests are made by the real services (a refund left UNKNOWN by a runtime, a tool's breaker forced open); the
jobs an approval enqueues are held (tests/test_action_services.py's held_jobs) so a decision is all that happens."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import ActionRequest, AuditEvent, BreakerOperation, BulkAction, Provider, Tool
from recovery.models.roles import APPROVER, REVIEWER
from recovery.selectors.approvals import KINDS, approvals_waiting, pending_approvals_count
from recovery.selectors.queues import QUEUES
from recovery.services import actions, approvals, breaker_operations, bulk
from recovery.services.errors import Refusal
from recovery.services.users import user_save_with_roles
from tests.console import PASSWORD
from tests.test_action_services import held_jobs  # noqa: F401  (a fixture: the jobs an approval enqueues wait)
from tests.test_breaker_operations import POLICY
from tests.test_concurrency import run_workers
from tests.test_console_call_page import load_refund_registry, unknown_refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("held_jobs")]

ROUNDS = 4  # races per test: a broken conditional UPDATE lets two deciders through in at least one
_n = itertools.count(1)


def _as(user) -> dict:
    return {"user": user, "actor": Actor.for_user(user)}


def _action(people) -> ActionRequest:
    call = unknown_refund()
    made = actions.action_preview(call_id=call.pk, action="escalate", **_as(people["both"]))
    return actions.action_request(
        request_id=made.pk, reason="nobody can confirm it", plan_hash=made.plan_hash, **_as(people["both"])
    )


def _bulk(people) -> BulkAction:
    calls = [unknown_refund() for _ in range(2)]
    made = bulk.bulk_preview(
        action="escalate", queue=QUEUES["unknown"], call_ids=[c.pk for c in calls], **_as(people["both"])
    )
    return bulk.bulk_request(
        bulk_id=made.pk, reason="the status API is down", selection_hash=made.selection_hash, **_as(people["both"])
    )


def _reset(people) -> BreakerOperation:
    provider = Provider.objects.get(name="payments")
    tool = Tool.objects.create(name=f"order.search.{next(_n)}", provider=provider, side_effect="read", breaker=POLICY)
    breaker_operations.breaker_force_open(tool_id=tool.pk, reason="provider incident", **_as(people[REVIEWER]))
    seen = breaker_operations.breaker_preview(tool_id=tool.pk, operation="reset").version
    return breaker_operations.breaker_request_reset(
        tool_id=tool.pk, reason="the provider says it is fixed", seen=seen, **_as(people["both"])
    )


@dataclass(frozen=True)
class Kind:
    name: str
    spec: approvals.FourEyes  # the service's
    make: Callable  # make(people): a REQUESTED request of this kind, by "both"
    id_name: str
    approve: Callable
    reject: Callable
    approved: str  # the status an approval leaves
    events: dict[str, str]  # decision → its audit action
    names: str  # the evidence key naming the request in its events
    constraint: str


KIND_CASES = [
    Kind(
        "action", actions.KIND, _action, "request_id", actions.action_approve, actions.action_reject, "approved",
        {"approve": "action.approved", "reject": "action.rejected"}, "request", "action_four_eyes",
    ),
    Kind(
        "bulk", bulk.KIND, _bulk, "bulk_id", bulk.bulk_approve, bulk.bulk_reject, "approved",
        {"approve": "bulk.approved", "reject": "bulk.rejected"}, "bulk", "bulk_four_eyes",
    ),
    Kind(
        "breaker_reset", breaker_operations.RESET, _reset, "operation_id", breaker_operations.breaker_approve_reset,
        breaker_operations.breaker_reject_reset, "applied",
        {"approve": "breaker.reset", "reject": "breaker.reset_rejected"}, "breaker_operation",
        "breaker_operation_four_eyes",
    ),
]  # fmt: skip


@pytest.fixture
def people(console_people) -> dict:
    """The console's people, a second approver, and "both": a reviewer who is an approver too, the requester."""
    made = dict(console_people)
    for name, roles in (("approver2", [APPROVER]), ("both", [REVIEWER, APPROVER])):
        made[name], _ = user_save_with_roles(username=name, roles=roles, password=PASSWORD, actor=Actor.system("t"))
    load_refund_registry()
    return made


def _decide(kind: Kind, verb: str, row, user, reason: str = "checked"):
    service = kind.approve if verb == "approve" else kind.reject
    return service(**{kind.id_name: row.pk}, reason=reason, **_as(user))


def _decisions(kind: Kind, row) -> list[str]:
    """The audit events of a decision on `row`."""
    found = AuditEvent.objects.filter(action__in=kind.events.values(), **{f"evidence__{kind.names}": row.pk})
    return list(found.values_list("action", flat=True))


# --- two approvers at once -------------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("second", ["approve", "reject"])
@pytest.mark.parametrize("kind", KIND_CASES, ids=lambda kind: kind.name)
def test_of_two_approvers_deciding_at_once_exactly_one_decides(people, kind, second):
    for _ in range(ROUNDS):
        row = kind.make(people)
        verbs, deciders = ("approve", second), (people[APPROVER], people["approver2"])
        outcomes: list = [None, None]

        def work(index: int, barrier: threading.Barrier, row=row, verbs=verbs, deciders=deciders, outcomes=outcomes):
            barrier.wait()
            try:
                outcomes[index] = _decide(kind, verbs[index], row, deciders[index]).status
            except Refusal as refused:
                outcomes[index] = refused

        assert run_workers(work, workers=2) == []
        won = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, str)]
        lost = [outcome for outcome in outcomes if isinstance(outcome, Refusal)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        [winner] = won
        status = kind.approved if verbs[winner] == "approve" else "rejected"
        stored = kind.spec.model.objects.get(pk=row.pk)
        assert (stored.status, stored.decided_by_id) == (status, deciders[winner].pk)
        assert lost[0].code == "not_pending"
        assert lost[0].message.endswith(f"is {status} now: nothing more can be done with it.")
        assert _decisions(kind, row) == [kind.events[verbs[winner]]]  # one decision in the audit trail


# --- never the requester -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KIND_CASES, ids=lambda kind: kind.name)
def test_the_requester_never_decides_their_own_request(people, kind):
    requester = people["both"]
    row = kind.make(people)
    assert (row.status, row.requested_by_id) == ("requested", requester.pk)

    for verb in ("approve", "reject"):  # the service refuses, though they hold the approver role
        with pytest.raises(Refusal) as refused:
            _decide(kind, verb, row, requester, reason="mine, and fine")
        assert refused.value.code == "four_eyes", verb
        assert kind.constraint not in refused.value.message  # the service's own check, before any UPDATE

    # Should the service's check be skipped, the database refuses the decision, and the service says so.
    skipped = approvals.Asked(
        kind=kind.spec, row=row, reason="mine", what="Deciding", now=timezone.now(), **_as(requester)
    )
    with pytest.raises(Refusal) as refused:
        approvals.decide(skipped, to="rejected")
    assert (
        refused.value.code == "four_eyes" and f"The database refused it ({kind.constraint})." in refused.value.message
    )
    assert kind.spec.model.four_eyes_constraint() == kind.constraint
    with pytest.raises(IntegrityError) as raised, transaction.atomic():
        kind.spec.model.objects.filter(pk=row.pk).update(decided_by=requester, decided_at=timezone.now())
    assert kind.constraint in str(raised.value)

    stored = kind.spec.model.objects.get(pk=row.pk)
    assert (stored.status, stored.decided_by_id) == ("requested", None)
    assert _decisions(kind, row) == []
    assert _decide(kind, "approve", row, people[APPROVER]).status == kind.approved  # a second person can


# --- one registry for every kind -----------------------------------------------------------------------------------


def test_the_queue_and_the_navigation_count_every_kind(people):
    made = {kind.name: kind.make(people) for kind in KIND_CASES}
    now = timezone.now()

    assert {kind.key for kind in KINDS} == set(made)
    assert pending_approvals_count(now=now) == 3
    assert {key: [row.pk for row in rows] for key, rows in approvals_waiting(now=now).items()} == {
        name: [row.pk] for name, row in made.items()
    }
    _decide(KIND_CASES[1], "reject", made["bulk"], people[APPROVER])
    assert pending_approvals_count(now=now) == 2

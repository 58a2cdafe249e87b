"""One story on every page (docs/console.md, issue "the operator's hour"): whatever path of the call state machine
(docs/design/state-machine.md) a call takes, the call page, its live refresh, the task page, its row in a queue and an
action's preview state the same facts about it — its state, its outcome, its last receipt, its effects — and the call
page, the overview and the breakers page the same state of its tool's and its provider's status-endpoint breakers.

Each page marks what it states with `data-fact` and `data-value` (recovery.selectors.facts), inside an element
carrying `data-call` (or `data-tool`, `data-provider` on a breaker). After every step of every path this reads all
of them off every page and compares them: one value per fact, and that value the database's.

The histories are made by the real services: a runtime through the JSON API (recovery_client over Django's test
client), the receipts' own service (what the reconciliation job applies), operator actions previewed, requested,
approved and executed, the saga's runtime-executed compensation, and the status endpoint's breaker counter.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from html.parser import HTMLParser

import pytest
from django.utils import timezone
from recovery_client import RecoveryClient

from recovery.audit.chain import Actor
from recovery.models import ActionRequest, ActionStatus, Call, Provider
from recovery.models.roles import APPROVER, REVIEWER, VIEWER
from recovery.providers.status import StatusAnswer
from recovery.registry import load_registry
from recovery.services.action_execution import action_execute
from recovery.services.actions import action_approve, action_preview, action_request
from recovery.services.reconcile import apply_answer
from recovery.services.sagas import saga_advance
from recovery.services.status_breakers import status_breaker_record
from recovery.services.tokens import token_create
from tests.console import signed_in
from tests.test_console_task_page import InProcessSession

ARGS = {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}
NEVER_OPENS = {"min_calls": 1_000_000}
# One failure opens it; COOLDOWN_S later it reads half open. Long enough for one round of pages to be read while it
# is open on a loaded machine (a round read across the moment it turns would differ, rightly).
COOLDOWN_S = 4
QUICK = {"min_calls": 1, "failure_rate": 0.5, "cooldown_s": COOLDOWN_S}
REGISTRY = {
    "tenants": [{"name": "acme", "tools": "*"}],
    "providers": [{"name": "shop", "base_url": "http://127.0.0.1:9", "status_breaker": QUICK}],
    "tools": [
        {
            "name": "refund.create",
            "provider": "shop",
            "side_effect": "write",
            "risk": "high",
            "request": {"method": "POST", "path": "/refunds"},
            "args_schema": ARGS,
            "provider_ref_field": "refund_id",
            "required_result_fields": ["refund_id"],
            "approvable_codes": ["needs_approval"],
            "status_query": {"method": "GET", "path": "/status/{idempotency_key}", "status_map": {"ok": "committed"}},
            "budgets": {"max_attempts": 3},
            "backoff": {"base_ms": 1, "cap_ms": 2},
            "breaker": NEVER_OPENS,
            "compensation": {"tool": "refund.reverse", "args": {"order": "{order}"}},
        },
        {
            "name": "refund.reverse",
            "provider": "shop",
            "side_effect": "write",
            "request": {"method": "POST", "path": "/reversals"},
            "args_schema": ARGS,
            "provider_ref_field": "reversal_id",
            "required_result_fields": ["reversal_id"],
            "status_query": {
                "method": "GET",
                "path": "/reversals/{idempotency_key}",
                "status_map": {"ok": "committed"},
            },
            "breaker": NEVER_OPENS,
        },
        {
            "name": "order.lookup",
            "provider": "shop",
            "side_effect": "read",
            "request": {"method": "GET", "path": "/orders"},
            "args_schema": ARGS,
            "required_result_fields": ["status"],
            "breaker": QUICK,
        },
    ],
}
SENT = {"connection_opened": True, "sent": True}
REFUNDED = SENT | {"http_status": 200, "provider_request_id": "p-1", "result": {"refund_id": "re_1"}}
LOST = SENT | {"error": {"kind": "read_timeout"}}
BUSY = SENT | {"http_status": 503}
NEEDS_APPROVAL = SENT | {"http_status": 403, "error": {"code": "needs_approval"}}
ACCEPTED = SENT | {"http_status": 202, "provider_request_id": "p-9"}
REVERSED = SENT | {"http_status": 200, "result": {"reversal_id": "rv_1"}}

_n = itertools.count(1)


# --- reading the facts off a page ----------------------------------------------------------------------------------

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Facts(HTMLParser):
    """Every `data-fact` on a page: {(subject, fact): value}, the subject being the nearest `data-call` around it (or
    on it), or the breaker's `data-tool` / `data-provider`."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str | None]] = []
        self.found: dict[tuple[str, str], set[str]] = defaultdict(set)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        scope = f"call:{attrs['data-call']}" if attrs.get("data-call") else None
        if tag not in _VOID:
            self.stack.append((tag, scope))
        if "data-fact" in attrs:
            if attrs.get("data-tool"):
                subject = f"tool:{attrs['data-tool']}"
            elif attrs.get("data-provider"):
                subject = f"provider:{attrs['data-provider']}"
            else:
                subject = scope or next((s for _, s in reversed(self.stack) if s), None)
            assert subject, f"a data-fact outside any data-call: {tag} {attrs}"
            assert "data-value" in attrs, f"a data-fact without its data-value: {tag} {attrs}"
            self.found[(subject, attrs["data-fact"])].add(attrs["data-value"])

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break


def facts_of(html: str) -> dict[tuple[str, str], set[str]]:
    parser = _Facts()
    parser.feed(html)
    return parser.found


# --- the world -----------------------------------------------------------------------------------------------------


class World:
    def __init__(self, people):
        self.people = people
        load_registry(REGISTRY, actor=Actor.system("tests"))
        _, token = token_create(name="runtime", tenants=["acme"], actor=Actor.system("tests"))
        self.runtime = RecoveryClient("http://testserver", token)
        self.runtime.session = InProcessSession(token)
        self.viewer = signed_in(people, VIEWER)
        self.previews: dict[int, list[int]] = defaultdict(list)  # call -> its action requests

    def call(self, tool: str = "refund.create") -> tuple[int, int]:
        n = next(_n)
        task = self.runtime.create_task("acme", f"order-{n}", agent="support-bot", goal="refund the order")
        key = f"k-{n}"
        ref = self.runtime.add_call(task.id, step=1, tool=tool, arguments={"order": key}, idempotency_key=key)
        return ref.call_id, task.id

    def attempt(self, call_id: int, outcome: dict, *, evidence: tuple[str, ...] = ()) -> str:
        attempt = f"a-{next(_n)}"
        self.runtime.admit(call_id, attempt, evidence=evidence)
        return self.runtime.report(call_id, attempt, outcome).call_state

    def receipt(self, call_id: int, observed: str, **answer) -> None:
        apply_answer(call_id, StatusAnswer(observed=observed, **answer), worker="reconcile-w1")

    def act(self, call_id: int, action: str, evidence: dict | None = None) -> ActionRequest:
        """An operator action as the console makes it: previewed and requested by a reviewer, approved by an approver
        when it is a write, executed once by a worker."""
        reviewer, approver = self.people[REVIEWER], self.people[APPROVER]
        made = action_preview(
            call_id=call_id, action=action, user=reviewer, actor=Actor.for_user(reviewer), evidence=evidence
        )
        self.previews[call_id].append(made.pk)
        made = action_request(
            request_id=made.pk, user=reviewer, actor=Actor.for_user(reviewer), reason="the evidence says so",
            plan_hash=made.plan_hash,
        )  # fmt: skip
        if made.status == ActionStatus.REQUESTED:
            action_approve(request_id=made.pk, user=approver, actor=Actor.for_user(approver), reason="agreed")
        return action_execute(made.pk, worker="actions-w1")

    def preview(self, call_id: int, action: str) -> None:
        """A dry run only: its page states the call as it is now, whatever happens to the call next."""
        reviewer = self.people[REVIEWER]
        made = action_preview(call_id=call_id, action=action, user=reviewer, actor=Actor.for_user(reviewer))
        self.previews[call_id].append(made.pk)

    def pages(self, call_id: int, task_id: int) -> dict[str, str]:
        urls = {
            "call page": f"/calls/{call_id}/",
            "task page": f"/tasks/{task_id}/",
            "All calls": "/queues/calls/",
            "Unknown queue": "/queues/unknown/",
            "Human review queue": "/queues/human-review/",
            "overview": "/overview/",
            "breakers page": "/operations/breakers/",
            **{f"action {pk}": f"/actions/{pk}/" for pk in self.previews[call_id]},
        }
        pages = {}
        for name, url in urls.items():
            response = self.viewer.get(url)
            assert response.status_code == 200, (name, response.status_code)
            pages[name] = response.content.decode()
        live = self.viewer.get(f"/calls/{call_id}/", headers={"HX-Request": "true"})
        pages["call page's live refresh"] = live.content.decode()
        return pages

    def check(self, call_id: int, task_id: int, step: str) -> dict[tuple[str, str], str]:
        """Every fact every page states agrees with every other page's, and the call's with the database."""
        seen: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(dict)
        for page, html in self.pages(call_id, task_id).items():
            for key, values in facts_of(html).items():
                seen[key][page] = values
        told = {}
        for key, by_page in seen.items():
            values = set().union(*by_page.values())
            assert len(values) == 1, f"after {step}: {key} differs between pages: {by_page}"
            told[key] = values.pop()
        subject = f"call:{call_id}"
        call = Call.objects.get(pk=call_id)
        assert told[(subject, "state")] == call.state, step
        on_call_page = {fact for (who, fact), pages in seen.items() if who == subject and "call page" in pages}
        assert {"state", "last-receipt", "effects"} <= on_call_page, (step, on_call_page)
        stating_state = set(seen[(subject, "state")])
        assert {"call page", "task page", "All calls", "call page's live refresh"} <= stating_state, step
        for pk in self.previews[call_id]:
            assert f"action {pk}" in stating_state, step
        if call.state in ("UNKNOWN", "STILL_UNKNOWN"):
            assert "Unknown queue" in stating_state, step
        if call.state == "HUMAN_REVIEW":
            assert "Human review queue" in stating_state, step
        return {fact: value for (who, fact), value in told.items() if who == subject}


@pytest.fixture
def world(people) -> World:
    return World(people)


def walk(world: World, steps) -> list[tuple[str, dict]]:
    """Run each step on a new call, checking every page after it; what the pages told after each step."""
    call_id, task_id = world.call(steps[0][2] if len(steps[0]) > 2 else "refund.create")
    told = [("READY", world.check(call_id, task_id, "registration"))]
    for name, step, *_ in steps:
        step(call_id, task_id)
        told.append((name, world.check(call_id, task_id, name)))
    return told


# --- the paths of docs/design/state-machine.md ------------------------------------------------------------------------


def test_committed_by_the_runtimes_reply(world):
    told = walk(world, [("the runtime's 2xx", lambda c, t: world.attempt(c, REFUNDED))])
    _, facts = told[-1]
    assert facts["state"] == "COMMITTED" and facts["last-receipt"].startswith("committed@")  # the runtime's receipt
    assert facts["effects"] == ">=1"  # committed, though no provider counted the effects

    # A preview's side-effect check says the same, never "0 effects" for an effect that exists.
    call_id = Call.objects.latest("pk").pk
    world.preview(call_id, "start_compensation")
    [budget] = [c for c in ActionRequest.objects.get(pk=world.previews[call_id][-1]).plan["checks"]
                if c["check"] == "side_effect_budget"]  # fmt: skip
    assert "at least 1 effect (COMMITTED; the provider reported no count)" in budget["detail"], budget


def test_unknown_still_unknown_then_committed_by_a_receipt(world):
    told = walk(
        world,
        [
            ("a lost reply", lambda c, t: world.attempt(c, LOST)),
            ("a pending check", lambda c, t: world.receipt(c, "pending", provider_status="pending")),
            ("a failed check", lambda c, t: world.receipt(c, "failed", provider_status="unreachable")),
            ("a committed check", lambda c, t: world.receipt(c, "committed", provider_ref="re_1", effects=1)),
        ],
    )
    assert [facts["state"] for _, facts in told] == ["READY", "UNKNOWN", "UNKNOWN", "STILL_UNKNOWN", "COMMITTED"]
    assert told[-1][1]["effects"] == "1" and told[-1][1]["last-receipt"].startswith("committed@")


def test_not_committed_then_retried_with_the_same_key_and_committed(world):
    told = walk(
        world,
        [
            ("a lost reply", lambda c, t: world.attempt(c, LOST)),
            ("a preview", lambda c, t: world.preview(c, "reconcile_now")),
            ("a not-committed check", lambda c, t: world.receipt(c, "not_committed", effects=0)),
            ("the retry", lambda c, t: world.attempt(c, REFUNDED, evidence=("state_verified",))),
        ],
    )
    assert [facts["state"] for _, facts in told] == ["READY", "UNKNOWN", "UNKNOWN", "RETRYABLE", "COMMITTED"]


def test_accepted_then_committed(world):
    told = walk(
        world,
        [
            ("a 202", lambda c, t: world.attempt(c, ACCEPTED)),
            ("a committed check", lambda c, t: world.receipt(c, "committed", provider_ref="re_2", effects=1)),
        ],
    )
    assert [facts["state"] for _, facts in told] == ["READY", "ACCEPTED", "COMMITTED"]


def test_retries_used_up_end_failed_permanent(world):
    told = walk(
        world,
        [
            ("a 503", lambda c, t: world.attempt(c, BUSY)),
            ("a second 503", lambda c, t: world.attempt(c, BUSY, evidence=("time_elapsed",))),
            ("a third 503", lambda c, t: world.attempt(c, BUSY, evidence=("time_elapsed",))),
        ],
    )
    assert told[-1][1]["state"] == "FAILED_PERMANENT"
    assert told[-1][1]["outcome"] == "retry_exhausted"


def test_human_review_settled_by_a_person_with_an_operator_receipt(world):
    evidence = {"provider_ref": "re_77", "receipt_id": "", "link": ""}
    told = walk(
        world,
        [
            ("a lost reply", lambda c, t: world.attempt(c, LOST)),
            ("escalated", lambda c, t: world.act(c, "escalate")),
            ("marked committed", lambda c, t: world.act(c, "mark_committed", evidence)),
        ],
    )
    assert [facts["state"] for _, facts in told] == ["READY", "UNKNOWN", "HUMAN_REVIEW", "COMMITTED"]
    # The outcome that sent it to a person is history now, on every page alike.
    assert told[-1][1]["outcome"] == "earlier:human_review_required"
    assert told[-1][1]["last-receipt"].startswith("committed@") and told[-1][1]["effects"] == ">=1"


def test_human_review_marked_not_committed_then_retryable(world):
    evidence = {"provider_ref": "", "receipt_id": "rc-9", "link": ""}
    told = walk(
        world,
        [
            ("needs an approval", lambda c, t: world.attempt(c, NEEDS_APPROVAL)),
            ("marked not committed", lambda c, t: world.act(c, "mark_not_committed", evidence)),
        ],
    )
    assert [facts["state"] for _, facts in told] == ["READY", "HUMAN_REVIEW", "RETRYABLE"]
    assert told[-1][1]["last-receipt"].startswith("not_committed@")


def test_abandoned_before_any_attempt(world):
    told = walk(world, [("abandoned", lambda c, t: world.runtime.abandon_task(t, "not needed"))])
    assert told[-1][1]["state"] == "FAILED_PERMANENT"


def test_committed_then_compensated_by_the_runtime(world):
    def compensate(call_id, task_id):
        world.runtime.compensate_task(task_id, executor="runtime", reason="the order was cancelled")
        saga_advance(task_id)

    def undo(call_id, task_id):
        compensation_id = f"comp-{call_id}-1"
        world.runtime.admit_compensation(compensation_id, "u1")
        world.runtime.report_compensation(compensation_id, "u1", REVERSED)

    told = walk(
        world, [("the 2xx", lambda c, t: world.attempt(c, REFUNDED)), ("aborted", compensate), ("undone", undo)]
    )
    assert [facts["state"] for _, facts in told] == ["READY", "COMMITTED", "COMPENSATING", "COMPENSATED"]
    assert told[-1][1]["effects"] == ">=1"  # the refund was made, then undone


def test_a_status_endpoint_breaker_past_its_cooldown_reads_half_open_on_every_page(world):
    call_id, task_id = world.call()
    world.attempt(call_id, LOST)
    status_breaker_record(Provider.objects.get(name="shop"), failed=True, now=timezone.now())
    world.check(call_id, task_id, "the status endpoint failed")
    told = world.pages(call_id, task_id)
    assert ("provider:shop", "status-breaker") in facts_of(told["overview"])
    assert facts_of(told["breakers page"])[("provider:shop", "status-breaker")] == {"open"}
    assert facts_of(told["call page"])[("provider:shop", "status-breaker")] == {"open"}
    time.sleep(COOLDOWN_S + 0.1)  # its cooldown is over: stored open, it reads half open everywhere
    world.check(call_id, task_id, "the cooldown ended")
    assert facts_of(world.pages(call_id, task_id)["call page"])[("provider:shop", "status-breaker")] == {"half_open"}


def test_a_tool_breaker_reads_the_same_on_the_call_page_the_overview_and_the_breakers_page(world):
    call_id, task_id = world.call("order.lookup")
    assert world.attempt(call_id, BUSY) == "RETRYABLE"  # one failure opens order.lookup's breaker
    world.check(call_id, task_id, "the breaker opened")
    told = facts_of(world.pages(call_id, task_id)["overview"])
    assert told[("tool:order.lookup", "tool-breaker")] == {"open"}
    idle = facts_of(world.pages(call_id, task_id)["breakers page"])  # every tool, the idle ones too
    assert idle[("tool:order.lookup", "tool-breaker")] == {"open"} and idle[("tool:refund.create", "tool-breaker")]
    time.sleep(COOLDOWN_S + 0.1)
    world.check(call_id, task_id, "the cooldown ended")
    assert facts_of(world.pages(call_id, task_id)["overview"])[("tool:order.lookup", "tool-breaker")] == {"half_open"}

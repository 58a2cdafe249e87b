"""One story on every page (docs/console.md, issue "the operator's hour"): whatever path of the call state machine
(docs/design/state-machine.md) a call takes, the call page, its live refresh, the task page, its row in a queue and an
action's preview state the same facts about it — its state, its outcome, its last receipt, its effects — and the call
page, the overview and the breakers page the same state of its tool's and its provider's status-endpoint breakers.

Each page marks what it states with `data-fact` and `data-value` (recovery.selectors.facts), inside an element
carrying `data-call` (or `data-tool`, `data-provider` on a breaker, `data-subject` on anything else: a task, a queue,
the approvals, the breakers). After every step of every path this reads all of them off every page and compares them:
one value per fact, and that value the database's. Beyond a call's state, outcome, last receipt and effects: its
tool's retry path (safe, unsafe or unprobed: the call page, its recommendation, the breakers and the tool page),
whether it waits (its queue rows: never a settled call), its task's next action (accounting for the saga) and the
story of its undo, each queue's open items (overview, navigation, metrics), the approvals pending of every kind
(overview, navigation, Approvals page), the breakers that are not closed (overview, breakers page), a tool's window
(breakers page, a reset's dry run) and an executed bulk item's new version (an expected move, not an error).

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
from recovery.engine.states import CallState as S
from recovery.models import (
    ActionRequest,
    ActionStatus,
    BreakerBucket,
    BreakerOperation,
    BulkAction,
    BulkItemStatus,
    Call,
    CompensationEntry,
    Provider,
    StatusBreaker,
    Task,
    Tool,
)
from recovery.models.approvals import REQUESTED
from recovery.models.roles import APPROVER, REVIEWER, VIEWER
from recovery.providers.status import StatusAnswer
from recovery.registry import load_registry
from recovery.selectors.facts import retry_path_of
from recovery.selectors.queues import QUEUES
from recovery.services.action_execution import action_execute
from recovery.services.actions import action_approve, action_preview, action_request
from recovery.services.breaker_operations import breaker_preview, breaker_request_reset
from recovery.services.bulk import bulk_approve, bulk_execute, bulk_preview, bulk_request
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
            "refusal_codes": ["not_cancellable"],
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
NOT_REVERSIBLE = SENT | {"http_status": 409, "error": {"code": "not_cancellable"}}
NAV_QUEUES = ("unknown", "human-review", "compensation-problems")
# States in which a call waits for someone: the queues' "why it waits" is for these only.
WAITING = {S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW, S.COMPENSATING, S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED}
# A task whose calls are in one of these is not done with: its next action is never "none".
UNFINISHED = WAITING | {S.ACCEPTED, S.SENT}

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
            if attrs.get("data-subject"):
                subject = attrs["data-subject"]
            elif attrs.get("data-tool"):
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
        self.approver = signed_in(people, APPROVER)
        self.reviewer = signed_in(people, REVIEWER)
        self.previews: dict[int, list[int]] = defaultdict(list)  # call -> its action requests
        self.extra: dict[str, str] = {}  # more pages a reviewer reads after every step: name -> URL (a reset, a bulk)

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
        tool_id = Call.objects.values_list("tool_id", flat=True).get(pk=call_id)
        urls = {
            "call page": f"/calls/{call_id}/",
            "task page": f"/tasks/{task_id}/",
            "All calls": "/queues/calls/",
            "Unknown queue": "/queues/unknown/",
            "Human review queue": "/queues/human-review/",
            "Compensation problems queue": "/queues/compensation-problems/",
            "overview": "/overview/",
            "metrics page": "/overview/metrics/",
            "breakers page": "/operations/breakers/",
            "tool page": f"/operations/tools/{tool_id}/",
            **{f"action {pk}": f"/actions/{pk}/" for pk in self.previews[call_id]},
        }
        pages = {}
        for who, name, url in [(self.viewer, *page) for page in urls.items()] + [
            (self.reviewer, *page) for page in self.extra.items()
        ]:
            response = who.get(url)
            assert response.status_code == 200, (name, response.status_code)
            pages[name] = response.content.decode()
        live = self.viewer.get(f"/calls/{call_id}/", headers={"HX-Request": "true"})
        pages["call page's live refresh"] = live.content.decode()
        # The approvals' count in the approver's navigation and on their Approvals page.
        pages["Approvals page"] = self.approver.get("/approvals/").content.decode()
        pages["navigation's live counts"] = self.approver.get("/queues/counts/").content.decode()
        return pages

    def check(self, call_id: int, task_id: int, step: str) -> dict[tuple[str, str], str]:
        """Every fact every page states agrees with every other page's, and the call's with the database."""
        seen: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(dict)
        pages = self.pages(call_id, task_id)
        for page, html in pages.items():
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
        if call.state in (S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED):
            assert "Compensation problems queue" in stating_state, step
        self.check_the_rest(call, told, seen, step)
        # The overview's open items: a card for every queue the navigation counts, not only the navigation's count.
        tiles = pages["overview"].split('id="open-items"', 1)[1].split("</section>", 1)[0]
        assert {who for who, fact in facts_of(tiles) if fact == "open"} == {f"queue:{slug}" for slug in NAV_QUEUES}
        return {fact: value for (who, fact), value in told.items() if who == subject}

    def check_the_rest(self, call: Call, told: dict, seen: dict, step: str) -> None:
        """What the pages state beyond the call's own columns, against the database."""
        subject = f"call:{call.pk}"
        # Why it waits: only a call that waits says why, on every queue that lists it.
        assert told[(subject, "waits")] == ("yes" if call.state in WAITING else "no"), (step, call.state)
        # Its tool's retry path, in one vocabulary on every page (the call page, its recommendation, breakers, tool).
        tool = Tool.objects.get(pk=call.tool_id)
        assert told[(f"tool:{tool.name}", "retry-path")] == retry_path_of(tool.side_effect, tool.retry_path), step
        assert {"call page", "breakers page", "tool page"} <= set(seen[(f"tool:{tool.name}", "retry-path")]), step
        # Its task's next action accounts for the saga and for every call still waiting.
        task = Task.objects.get(pk=call.task_id)
        action = told[(f"task:{task.pk}", "next-action")]
        if task.saga == "stopped":
            assert action == "wait_for_compensation_review", (step, action)
        unfinished = Call.objects.filter(task=task, state__in=UNFINISHED).exists()
        if action.startswith("none"):
            assert not unfinished and task.saga in ("", "done"), (step, action, task.saga)
        # The story of its undo follows the undo's outcome.
        story = told.get((subject, "effect-story"))
        if call.state == S.COMPENSATION_FAILED:
            assert story and "failed" in story and ", then " not in story, (step, story)
        if call.state == S.COMPENSATED:
            assert story and ", then " in story and "failed" not in story, (step, story)
        # Each queue's open items: the overview's, the navigation's and the metrics' figure, and the database's.
        counts = {
            slug: Call.objects.filter(state__in=QUEUES[slug].states).count() for slug in ("unknown", "human-review")
        }
        lasting = Call.objects.filter(state__in=(S.PARTIAL_COMPENSATED, S.COMPENSATION_FAILED)).count()
        in_review = Call.objects.filter(state=S.COMPENSATING, compensations__state="review").distinct().count()
        counts["compensation-problems"] = lasting + in_review
        assert set(counts) == set(NAV_QUEUES)
        for slug, n in counts.items():
            assert told[(f"queue:{slug}", "open")] == str(n), (step, slug)
            assert {"overview", "call page"} <= set(seen[(f"queue:{slug}", "open")]), (step, slug)
        assert "metrics page" in seen[("queue:unknown", "open")], step
        # Approvals of every kind: the overview, the approver's navigation and Approvals page say one number.
        now = timezone.now()
        pending = sum(
            model.objects.filter(status=REQUESTED, expires_at__gt=now).count()
            for model in (ActionRequest, BulkAction, BreakerOperation)
        )
        assert told[("approvals", "pending")] == str(pending), step
        assert {"overview", "Approvals page", "navigation's live counts"} <= set(seen[("approvals", "pending")])
        # The breakers not closed: the overview's list and the breakers page's, and the status endpoint's row.
        endpoint = StatusBreaker.objects.filter(provider__name="shop").values_list("state", flat=True).first()
        assert ("status:shop" in told[("breakers", "not-closed")]) == (endpoint not in (None, "closed")), step
        assert {"overview", "breakers page"} <= set(seen[("breakers", "not-closed")]), step
        # A tool's window: no bucket without a call in it.
        for (who, fact), value in told.items():
            if fact == "window-calls" and value == "0":
                assert told[(who, "window-buckets")] == "0", (step, who)


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


# --- the facts beyond one call's columns ----------------------------------------------------------------------------


def test_a_saga_whose_undo_fails_waits_for_a_person_on_every_page(world):
    def compensate(call_id, task_id):
        world.runtime.compensate_task(task_id, executor="runtime", reason="the payment was declined")
        saga_advance(task_id)

    def refused(call_id, task_id):
        compensation_id = f"comp-{call_id}-1"
        world.runtime.admit_compensation(compensation_id, "u1")
        world.runtime.report_compensation(compensation_id, "u1", NOT_REVERSIBLE)
        saga_advance(task_id)

    told = walk(
        world,
        [("the 2xx", lambda c, t: world.attempt(c, REFUNDED)), ("aborted", compensate), ("undo refused", refused)],
    )
    assert [facts["state"] for _, facts in told] == ["READY", "COMMITTED", "COMPENSATING", "COMPENSATION_FAILED"]
    call = Call.objects.latest("pk")
    task = Task.objects.get(pk=call.task_id)
    assert task.saga == "stopped" and CompensationEntry.objects.get(call=call).state != "committed"
    page = world.viewer.get(f"/tasks/{task.pk}/").content.decode()
    facts = facts_of(page)
    assert facts[(f"task:{task.pk}", "next-action")] == {"wait_for_compensation_review"}
    assert facts[(f"call:{call.pk}", "effect-story")] == {"created, not reversed: the undo failed"}, facts
    assert "then cancelled" not in page and "Nothing: the task is closed" not in page
    # Counted on the overview as in the navigation, and listed in its queue, saying why it waits.
    assert facts_of(world.viewer.get("/overview/").content.decode())[("queue:compensation-problems", "open")] == {"1"}


def test_a_pending_breaker_reset_counts_as_an_approval_everywhere(world):
    call_id, task_id = world.call("order.lookup")
    assert world.attempt(call_id, BUSY) == "RETRYABLE"  # one failure opens order.lookup's breaker
    tool = Tool.objects.get(name="order.lookup")
    # A bucket from before the window, which the breaker prunes only when the next bucket starts: no page counts it.
    BreakerBucket.objects.create(tool=tool, bucket_start=int(time.time()) - 3600, successes=5, failures=0)
    world.extra["reset's dry run"] = f"/operations/breakers/{tool.pk}/reset/"
    world.check(call_id, task_id, "the breaker opened")
    reviewer = world.people[REVIEWER]
    shown = breaker_preview(tool_id=tool.pk, operation="reset")
    op = breaker_request_reset(
        tool_id=tool.pk, user=reviewer, actor=Actor.for_user(reviewer), reason="it is back", seen=shown.version
    )
    world.extra["the reset"] = f"/operations/breaker-operations/{op.pk}/"
    world.check(call_id, task_id, "a reset requested")  # one approval pending: overview, navigation, Approvals page
    approvals = world.approver.get("/approvals/").content.decode()
    assert facts_of(approvals)[("approvals", "pending")] == {"1"}
    assert "Nothing waits for an approval" not in approvals and f'id="reset-{op.pk}"' in approvals
    # Its window reads the same on the breakers page and the reset's dry run: one call, one bucket.
    told = facts_of(world.reviewer.get(f"/operations/breakers/{tool.pk}/reset/").content.decode())
    assert told[("tool:order.lookup", "window-calls")] == {"1"}
    assert told[("tool:order.lookup", "window-buckets")] == {"1"}


def test_a_declared_but_unprobed_retry_path_reads_unprobed_wherever_a_replay_is_recommended(world):
    load_registry(
        {**REGISTRY, "tools": [{**REGISTRY["tools"][0], "replay_safe": True}, *REGISTRY["tools"][1:]]},
        actor=Actor.system("tests"),
    )
    told = walk(
        world,
        [("a lost reply", lambda c, t: world.attempt(c, LOST)), ("escalated", lambda c, t: world.act(c, "escalate"))],
    )
    assert told[-1][1]["state"] == "HUMAN_REVIEW"
    call = Call.objects.latest("pk")
    page = world.reviewer.get(f"/calls/{call.pk}/").content.decode()  # what a reviewer may do: the recommendation
    recommendation = page.split('id="recommended"', 1)[1].split("</p>", 1)[0]
    assert 'data-value="unprobed"' in recommendation and "retry path unprobed" in recommendation, recommendation
    breakers = facts_of(world.viewer.get("/operations/breakers/").content.decode())
    assert breakers[("tool:refund.create", "retry-path")] == {"unprobed"}
    assert "not safe" not in world.viewer.get("/operations/breakers/").content.decode()


def test_an_executed_bulk_items_new_version_is_not_an_error(world):
    calls = [world.call() for _ in range(2)]
    for call_id, _ in calls:
        world.attempt(call_id, LOST)
    reviewer, approver = world.people[REVIEWER], world.people[APPROVER]
    bulk = bulk_preview(
        action="escalate", queue=QUEUES["unknown"], user=reviewer, actor=Actor.for_user(reviewer),
        call_ids=[c for c, _ in calls],
    )  # fmt: skip
    hashed = bulk.selection_hash
    bulk = bulk_request(
        bulk_id=bulk.pk, user=reviewer, actor=Actor.for_user(reviewer), reason="stuck", selection_hash=hashed
    )
    world.extra["bulk page"] = f"/bulk/{bulk.pk}/"
    call_id, task_id = calls[0]
    world.check(call_id, task_id, "a bulk requested")  # a bulk waits: one approval pending everywhere
    bulk_approve(bulk_id=bulk.pk, user=approver, actor=Actor.for_user(approver), reason="read every item")
    bulk_execute(bulk.pk, worker="bulk-w1")
    assert set(bulk.items.values_list("status", flat=True)) == {BulkItemStatus.EXECUTED}
    world.check(call_id, task_id, "the bulk executed")  # the bulk page states the call's state as every page does
    page = world.viewer.get(f"/bulk/{bulk.pk}/").content.decode()
    moved = {who: v for (who, fact), v in facts_of(page).items() if fact == "version-change"}
    assert moved == {f"call:{c}": {"by-this-bulk"} for c, _ in calls}, moved
    assert 'class="bad"' not in page.split('id="items"', 1)[1].split("</table>", 1)[0]

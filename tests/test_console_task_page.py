"""The task page (docs/design/tasks.md, docs/console.md "Task", docs/design/audit.md) through Django's test client: what
a reader learns from it — blocked steps and by what, facts grouped instead of one word over a mix, the outcome and the
no_submission flag, budget use, the audit trail with its chain verified (and broken when an event was edited) — who may
read it, and a fixed number of SQL statements whatever the task's size.

Histories are built the way a runtime builds them: recovery_client's RecoveryClient over the real JSON API (in this
process, through Django's test client), and the periodic job's own service for the no_submission flag.
"""

from __future__ import annotations

import itertools
import json
import time
from datetime import timedelta
from html.parser import HTMLParser
from urllib.parse import quote, urlsplit

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from recovery_client import NotAdmitted, RecoveryClient

from recovery.audit.chain import Actor, audit_maintenance, chain_key
from recovery.models import AuditEvent, Call, Step
from recovery.models.roles import ROLES, VIEWER
from recovery.registry import load_registry
from recovery.services.tasks import task_flag_no_submission
from recovery.services.tokens import token_create
from recovery.statemachine.transitions import transition_call
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT, NO_ROLE, SIGNED_OUT, signed_in

ARGS = {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}
NO_TRIP = {"min_calls": 10_000}  # the 60-step task fails many payments on purpose: the breaker must not open
REGISTRY = {
    "tenants": [{"name": "acme", "tools": "*"}],
    "providers": [{"name": "shop", "base_url": "http://127.0.0.1:9"}],
    "tools": [
        {
            "name": "payment.capture",
            "provider": "shop",
            "side_effect": "write",
            "args_schema": ARGS,
            "risk": "high",
            "request": {"method": "POST", "path": "/payments"},
            "provider_ref_field": "payment_id",
            "required_result_fields": ["payment_id"],
            "approvable_codes": ["needs_approval"],
            "status_query": {"method": "GET", "path": "/payments/{idempotency_key}", "status_map": {"ok": "committed"}},
            "budgets": {"max_attempts": 3},
            "backoff": {"base_ms": 10, "cap_ms": 20},
            "breaker": NO_TRIP,
        },
        {
            "name": "shipment.create",
            "provider": "shop",
            "side_effect": "write",
            "args_schema": ARGS,
            "request": {"method": "POST", "path": "/shipments"},
            "provider_ref_field": "shipment_id",
            "required_result_fields": ["shipment_id"],
            "status_query": {
                "method": "GET",
                "path": "/shipments/{idempotency_key}",
                "status_map": {"ok": "committed"},
            },
        },
        {
            "name": "order.lookup",
            "provider": "shop",
            "side_effect": "read",
            "args_schema": ARGS,
            "request": {"method": "GET", "path": "/orders"},
            "required_result_fields": ["status"],
        },
    ],
}

# Outcome facts as a runtime reports them (docs/design/classification.md), and the state each gives a write.
SENT = {"connection_opened": True, "sent": True}
OUTCOMES = {
    "COMMITTED": SENT | {"http_status": 200, "provider_request_id": "p-1", "result": {"payment_id": "pay-1"}},
    "UNKNOWN": SENT | {"error": {"kind": "read_timeout"}},
    "RETRYABLE": SENT | {"http_status": 503},
    "FAILED_PERMANENT": SENT | {"http_status": 418},
    "HUMAN_REVIEW": SENT | {"http_status": 403, "error": {"code": "needs_approval"}},
    "ACCEPTED": SENT | {"http_status": 202, "provider_request_id": "p-9"},
}
SHIPPED = SENT | {"http_status": 200, "provider_request_id": "s-1", "result": {"shipment_id": "ship-1"}}
LOOKED_UP = SENT | {"http_status": 200, "result": {"status": "paid"}}

_n = itertools.count(1)


class InProcessSession:
    """What RecoveryClient needs of requests.Session, answered by Django's test client: the real API (validation,
    token auth, services) in this process and this test's transaction, without a server thread."""

    def __init__(self, token: str):
        self.client = Client(headers={"Authorization": f"Bearer {token}"})

    def request(self, method: str, url: str, *, json=None, params=None, timeout=None):
        path = urlsplit(url).path
        if method == "GET":
            response = self.client.get(path, params or {})
        else:
            body = "" if json is None else _dumps(json)
            response = self.client.generic(method, path, body, content_type="application/json")
        response.text = response.content.decode()
        return response


def _dumps(value) -> str:
    return json.dumps(value)  # out here: inside request(), `json` is the argument's name, as in requests


@pytest.fixture
def runtime(db) -> RecoveryClient:
    return make_runtime()


def make_runtime() -> RecoveryClient:
    """The registry above, and an agent runtime's client for tenant "acme" (docs/api.md)."""
    load_registry(REGISTRY, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["acme"], actor=Actor.system("tests"))
    client = RecoveryClient("http://testserver", token)
    client.session = InProcessSession(token)
    return client


def open_task(runtime: RecoveryClient, **fields):
    fields = {"external_id": f"order-{next(_n)}", "agent": "support-bot", "goal": "refund and reship"} | fields
    return runtime.create_task("acme", fields.pop("external_id"), **fields)


def add(runtime, task_id: int, step: int, tool: str = "payment.capture", depends_on=(), key: str = ""):
    key = key or f"k-{next(_n)}"
    return runtime.add_call(
        task_id, step=step, tool=tool, arguments={"order": key}, idempotency_key=key, depends_on=list(depends_on)
    )


def settle(runtime, call_id: int, facts: dict, *, tokens: int = 0, evidence: tuple[str, ...] = ()) -> str:
    """Admit one attempt and report its outcome; the call's new state."""
    attempt = f"a-{next(_n)}"
    runtime.admit(call_id, attempt, evidence=evidence)
    return runtime.report(call_id, attempt, facts | ({"tokens_used": tokens} if tokens else {})).call_state


def refused(runtime, call_id: int) -> str:
    """Ask admission for a call whose dependency has not committed: refused, and the refusal is stored."""
    with pytest.raises(NotAdmitted) as denied:
        runtime.admit(call_id, f"a-{next(_n)}")
    return denied.value.gate["reason"]


# --- reading the page ------------------------------------------------------------------------------------------------

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Element(HTMLParser):
    """The text of the element with one id (entities decoded, whitespace collapsed), and every start tag seen."""

    def __init__(self, target: str):
        super().__init__(convert_charrefs=True)
        self.target, self.depth, self.found, self.parts, self.tags = target, 0, False, [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if self.depth:
            self.depth += tag not in _VOID
        elif dict(attrs).get("id") == self.target and not self.found:
            self.found, self.depth = True, int(tag not in _VOID)

    def handle_endtag(self, tag):
        if self.depth and tag not in _VOID:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.parts.append(data)


def text_of(html: str, element_id: str) -> str:
    parser = _Element(element_id)
    parser.feed(html)
    assert parser.found, f"no element #{element_id} on the page"
    return " ".join("".join(parser.parts).split())


def tags_of(html: str) -> list[tuple[str, dict]]:
    parser = _Element("")
    parser.feed(html)
    return parser.tags


@pytest.fixture
def viewer(people) -> Client:
    return signed_in(people, VIEWER)


def page_of(viewer: Client, task_id: int) -> str:
    response = viewer.get(reverse("console:task", args=[task_id]))
    assert response.status_code == 200
    return response.content.decode()


def call_link(call_id: int) -> str:
    return f'href="{reverse("console:call", args=[call_id])}"'


# --- what the page says ----------------------------------------------------------------------------------------------


def test_it_shows_a_payment_unknown_blocking_shipping(runtime, viewer):
    task = open_task(runtime)
    payment = add(runtime, task.id, 1)
    assert settle(runtime, payment.call_id, OUTCOMES["UNKNOWN"]) == "UNKNOWN"
    shipping = add(runtime, task.id, 2, tool="shipment.create", depends_on=[1], key="ship-order-1")
    assert refused(runtime, shipping.call_id) == "blocked_by_dependency"
    Step.objects.filter(task_id=task.id, index=1).update(name="payment")
    Step.objects.filter(task_id=task.id, index=2).update(name="shipping")

    html = page_of(viewer, task.id)
    shipping_row = text_of(html, "step-2")
    assert "Blocked by step 1 payment (UNKNOWN)" in shipping_row
    assert f"call {shipping.call_id} shipment.create READY key ship-order-1" in shipping_row
    assert "Blocked" not in text_of(html, "step-1")
    assert 'id="step-2" class="blocked"' in html and 'id="step-1" class="blocked"' not in html
    unknown = text_of(html, "fact-unknown")
    assert f"call {payment.call_id} payment.capture UNKNOWN" in unknown
    assert "none" in text_of(html, "fact-done")
    next_action = text_of(html, "next")
    assert "Wait for reconciliation: 1 call unknown or accepted is being checked with the provider" in next_action
    assert "Do not retry it. Step 2 stays blocked until then." in next_action
    assert "wait_for_reconcile" in next_action
    for call in (payment, shipping):  # every call links to its own page
        assert call_link(call.call_id) in html
    assert text_of(html, "headline") == "Open · 1 unknown · 1 pending"


def test_it_groups_committed_unknown_and_failed_calls_as_facts_not_as_failed(runtime, viewer):
    task = open_task(runtime, budget={"unknown_budget": 0})  # one unsettled unknown refuses the task's writes
    done = add(runtime, task.id, 1)
    lost = add(runtime, task.id, 2)
    broken = add(runtime, task.id, 3, tool="shipment.create")
    assert settle(runtime, done.call_id, OUTCOMES["COMMITTED"]) == "COMMITTED"
    assert settle(runtime, broken.call_id, OUTCOMES["FAILED_PERMANENT"]) == "FAILED_PERMANENT"
    assert settle(runtime, lost.call_id, OUTCOMES["UNKNOWN"]) == "UNKNOWN"

    html = page_of(viewer, task.id)
    assert text_of(html, "headline") == "Open · 1 confirmed · 1 unknown · 1 not executed"
    assert f"call {done.call_id} payment.capture COMMITTED" in text_of(html, "fact-done")
    assert f"call {lost.call_id} payment.capture UNKNOWN" in text_of(html, "fact-unknown")
    assert f"call {broken.call_id} shipment.create FAILED_PERMANENT" in text_of(html, "fact-not_executed")
    assert "failed" not in text_of(html, "headline").lower() and "failed" not in text_of(html, "outcome")
    assert "wait_for_reconcile" in text_of(html, "next")
    assert text_of(html, "bar-unknowns") == "Unknown budget 1 of 0 unsettled — over the limit"
    assert 'id="meter-unknowns"' not in html  # a limit of 0 has no range to draw: said in words only

    # Submitted with the unknown still open: the outcome says so, and the facts stay apart.
    runtime.complete_task(task.id, "refunded one order; one payment unknown; shipping failed")
    html = page_of(viewer, task.id)
    assert text_of(html, "outcome").startswith("completed_with_unknowns — submitted while some effects")
    assert text_of(html, "headline") == "Submitted · 1 confirmed · 1 unknown · 1 not executed"
    assert "The task is closed; 1 unknown call is still being reconciled" in text_of(html, "next")
    assert "(still unsettled: 1 call)" in text_of(html, "outcome")

    # Reconciliation settles it afterwards: the recorded outcome stays, and says the unknowns have settled since.
    transition_call(Call.objects.get(pk=lost.call_id), "COMMITTED", actor=Actor.job("reconcile"), reason="receipt")
    html = page_of(viewer, task.id)
    assert text_of(html, "outcome") == (
        "completed_with_unknowns — submitted while some effects were still unknown; every one has settled since"
    )
    assert "every call is settled" in text_of(html, "next")
    # The agent's words ("one payment unknown") stay as it wrote them, dated and marked as what was true then.
    submission = text_of(html, "submission")
    assert "Every call it left unsettled has settled since: the facts below are as they stand now." in submission
    assert submission.endswith("refunded one order; one payment unknown; shipping failed")


def test_it_shows_a_submitted_tasks_outcome_and_submission(runtime, viewer):
    task = open_task(runtime, budget={"max_rounds": 10, "token_budget": 1000, "write_retry": 2})
    payment = add(runtime, task.id, 1)
    assert settle(runtime, payment.call_id, OUTCOMES["RETRYABLE"], tokens=300) == "RETRYABLE"
    time.sleep(0.05)  # the tool's backoff (at most 20 ms): then the retry has new evidence, time elapsed
    assert (
        settle(runtime, payment.call_id, OUTCOMES["COMMITTED"], tokens=250, evidence=("time_elapsed",)) == "COMMITTED"
    )
    lookup = add(runtime, task.id, 2, tool="order.lookup", depends_on=[1])
    assert settle(runtime, lookup.call_id, LOOKED_UP) == "COMMITTED"
    runtime.complete_task(task.id, "refunded order 8848", deliverable={"refund": "pay-1", "amount_cents": 800})

    html = page_of(viewer, task.id)
    assert text_of(html, "outcome") == "completed — every call settled and the deliverable was submitted"
    assert text_of(html, "headline") == "Submitted · 2 confirmed"
    submission = text_of(html, "submission")
    said_when, said = submission.split("what the calls were then.")  # the agent's words, dated as theirs
    assert said_when.startswith("In the agent's words when it submitted, ") and "settled since" not in said
    assert said.startswith("refunded order 8848") and '"amount_cents": 800' in said
    assert text_of(html, "next").startswith("Nothing: the task is closed and every call is settled.")
    # Budget use, in words beside each meter: 3 rounds (2 attempts of the payment, 1 lookup), 550 tokens, 1 retry.
    assert text_of(html, "bar-rounds") == "Rounds 3 of 10 3 of 10 rounds used"
    assert text_of(html, "bar-tokens") == "Tokens 550 of 1000 550 of 1000 tokens used"
    assert text_of(html, "bar-write-retries") == "Write retries 1 of 2 1 of 2 retries used"
    assert text_of(html, "bar-deadline") == "Time to deadline no deadline"
    assert '<meter id="meter-rounds" min="0" max="10" low="7.0" high="9.0" optimum="0" value="3">' in html
    assert 'id="meter-deadline"' not in html  # no deadline: words only, no empty bar


def test_it_flags_a_task_past_its_deadline_with_no_submission(runtime, viewer):
    deadline = timezone.now() - timedelta(hours=2)
    task = open_task(runtime, budget={"deadline": deadline.isoformat(), "max_rounds": 4})
    assert task_flag_no_submission(now=timezone.now(), actor=Actor.job("flag_no_submission")) == 1

    html = page_of(viewer, task.id)
    assert text_of(html, "no-submission").startswith("No submission. The task passed its deadline")
    assert text_of(html, "headline") == "Open · no calls yet"
    assert text_of(html, "next").startswith("Past the deadline with no submission: the agent submits what was done")
    assert "submit_or_abandon" in text_of(html, "next")
    assert "2 h past the deadline (deadline" in text_of(html, "bar-deadline")
    assert 'class="bar over" id="bar-deadline"' in html
    trail = text_of(html, "audit")
    assert "task.no_submission" in trail and "job:flag_no_submission" in trail


def test_it_verifies_the_chain_and_says_when_an_event_was_edited(runtime, viewer):
    task = open_task(runtime)
    payment = add(runtime, task.id, 1)
    settle(runtime, payment.call_id, OUTCOMES["UNKNOWN"])
    events = list(AuditEvent.objects.filter(chain=chain_key(task.id)).order_by("chain_seq"))
    assert [e.action for e in events] == ["task.created", "call.added", "call.transition", "call.transition"]

    html = page_of(viewer, task.id)
    assert text_of(html, "chain-status") == "Chain verified: 4 events, intact."
    assert 'role="alert"' not in html
    outcome = events[-1]
    assert f"{outcome.from_state} → {outcome.to_state}" == "SENT → UNKNOWN"
    assert "SENT → UNKNOWN" in text_of(html, f"event-{outcome.seq}")

    # Someone with the documented maintenance switch rewrites what the outcome was.
    with transaction.atomic(), audit_maintenance(reason="test: tamper", actor=Actor.system("tests")):
        AuditEvent.objects.filter(pk=outcome.pk).update(to_state="NOT_COMMITTED")

    html = page_of(viewer, task.id)
    alert = text_of(html, "chain-alert")
    assert alert.startswith("Audit chain broken.")
    assert f"chain task:{task.id} event #4 (seq {outcome.seq}) does not match its hash: its content was edited" in alert
    assert 'role="alert" id="chain-alert"' in html
    assert text_of(html, "chain-status").startswith("Chain broken:")
    assert "SENT → NOT_COMMITTED" in text_of(html, f"event-{outcome.seq}")  # shown as stored, and flagged above


def test_hostile_text_is_shown_as_text(runtime, viewer):
    task = open_task(runtime, external_id=HOSTILE_SCRIPT, agent=HOSTILE_IMG, goal=f"{HOSTILE_SCRIPT} {HOSTILE_IMG}")
    call = add(runtime, task.id, 1, key=HOSTILE_SCRIPT)
    settle(runtime, call.call_id, OUTCOMES["UNKNOWN"])
    Step.objects.filter(task_id=task.id).update(name=HOSTILE_IMG)
    runtime.complete_task(task.id, HOSTILE_IMG, deliverable={"note": HOSTILE_SCRIPT})

    response = viewer.get(reverse("console:task", args=[task.id]))
    html = response.content.decode()
    for raw in (HOSTILE_SCRIPT, HOSTILE_IMG, "<script>window", "<img src=x"):
        assert raw not in html
    assert text_of(html, "headline").startswith("Submitted")
    assert f"Task {HOSTILE_SCRIPT}" in text_of(html, "main")
    assert HOSTILE_IMG in text_of(html, "step-1")  # the step's name, as text
    assert HOSTILE_SCRIPT in text_of(html, "step-1")  # the idempotency key
    assert HOSTILE_IMG in text_of(html, "submission") and HOSTILE_SCRIPT in text_of(html, "submission")
    # The audit trail's evidence (the external id and agent as the task was created), pretty JSON as text.
    created = AuditEvent.objects.get(chain=chain_key(task.id), action="task.created")
    evidence = text_of(html, f"event-{created.seq}")
    assert f'"external_id": "{HOSTILE_SCRIPT}"' in evidence and f'"agent": "{HOSTILE_IMG}"' in evidence
    # Only the layout's own scripts (files, with the nonce) and no image or inline handler at all.
    tags = tags_of(html)
    assert all(attrs.get("src") for tag, attrs in tags if tag == "script")
    assert not [tag for tag, _ in tags if tag in ("img", "svg", "iframe")]
    assert not [name for _, attrs in tags for name in attrs if name.startswith("on")]
    assert not [attrs for _, attrs in tags if "style" in attrs]  # the CSP forbids inline styles too


# --- who may read it, and what it costs ------------------------------------------------------------------------------


def test_an_unknown_task_is_not_found(viewer, db):
    assert viewer.get("/tasks/999999/").status_code == 404
    assert viewer.get("/tasks/99999999999999999999/").status_code == 404  # past any id column's range


@pytest.mark.parametrize(
    ("who", "answer"),
    [(SIGNED_OUT, "sign-in"), (NO_ROLE, 403), *((role, 200) for role in ROLES)],
)
def test_every_role_reads_a_task_and_nobody_else(runtime, people, who, answer):
    task = open_task(runtime)
    path = f"/tasks/{task.id}/"
    assert reverse("console:task", args=[task.id]) == path
    client = signed_in(people, who)
    response = client.get(path)
    if answer == "sign-in":
        assert (response.status_code, response["Location"]) == (302, f"/sign-in/?next={quote(path)}")
    else:
        assert response.status_code == answer
    if answer == 200:
        assert f"Task {task.raw['external_id']}" in response.content.decode()
    assert client.post(path).status_code == 405  # reading only: refused before anything else, whoever asks


def build_task(runtime, groups: int) -> int:
    """A task of 3 * `groups` steps: each group a payment, then a shipment depending on it, then a lookup depending
    on the shipment. The payment ends in a different state per group (committed, unknown, accepted, retryable,
    failed, under review), so the shipments and lookups are blocked by every kind of dependency, or run."""
    task = open_task(runtime, budget={"max_rounds": 1000, "token_budget": 100_000, "write_retry": 50})
    states = ["UNKNOWN", "COMMITTED", "ACCEPTED", "RETRYABLE", "FAILED_PERMANENT", "HUMAN_REVIEW"]
    for group in range(groups):
        first = 3 * group + 1
        payment = add(runtime, task.id, first)
        state = states[group % len(states)]
        assert settle(runtime, payment.call_id, OUTCOMES[state], tokens=10) == state
        shipment = add(runtime, task.id, first + 1, tool="shipment.create", depends_on=[first])
        lookup = add(runtime, task.id, first + 2, tool="order.lookup", depends_on=[first, first + 1])
        if state == "COMMITTED":
            assert settle(runtime, shipment.call_id, SHIPPED) == "COMMITTED"
            assert settle(runtime, lookup.call_id, OUTCOMES["UNKNOWN"]) == "RETRYABLE"  # a read is never unknown
            second = add(runtime, task.id, first + 2, tool="order.lookup", depends_on=[first, first + 1])
            assert settle(runtime, second.call_id, LOOKED_UP) == "COMMITTED"
        else:
            assert refused(runtime, shipment.call_id) == "blocked_by_dependency"
    return task.id


def test_the_page_runs_the_same_statements_for_3_steps_as_for_60(runtime, viewer):
    small, large = build_task(runtime, 1), build_task(runtime, 20)
    assert Step.objects.filter(task_id=large).count() == 60
    counts = {}
    for task_id in (small, large):
        page_of(viewer, task_id)  # warm: the content-type cache and the like, filled once per process
        with CaptureQueriesContext(connection) as queries:
            html = page_of(viewer, task_id)
        counts[task_id] = len(queries)
        steps = Step.objects.filter(task_id=task_id).count()
        assert html.count('<tr id="step-') == steps
        events = AuditEvent.objects.filter(chain=chain_key(task_id)).count()
        assert text_of(html, "chain-status") == f"Chain verified: {events} events, intact."
        assert html.count('<tr id="event-') == events
    assert counts[small] == counts[large], counts
    large_html = page_of(viewer, large)
    steps = text_of(large_html, "steps")
    # Every kind of blocking dependency shows, each with the state that blocks.
    for state in ["UNKNOWN", "ACCEPTED", "RETRYABLE", "FAILED_PERMANENT", "HUMAN_REVIEW"]:
        assert f"({state})" in steps, state
    assert "Blocked by step 1 (UNKNOWN), step 2 (READY)" in text_of(large_html, "step-3")
    for index in (4, 5, 6):  # the committed group ran through: nothing of it is blocked
        assert "Blocked" not in text_of(large_html, f"step-{index}") and "COMMITTED" in text_of(
            large_html, f"step-{index}"
        )

"""The metrics served (docs/metrics.md): GET /api/v1/metrics (JSON) and /metrics (Prometheus text), their access rules,
and the Grafana dashboard that reads the latter.

A small history is written by the real services (recovery.services.calls, .attempts, .outcomes, .reconcile,
.breakers, .tasks) for two tenants, with the clock those services read moved to place each step (as in
tests/test_console_overview.py), then folded by recovery.services.metrics.metrics_fold(). Every sample the scrape
carries is then compared with values worked out by hand from that story.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from recovery.audit.chain import Actor
from recovery.models import Attempt, AuditEvent, Call, Task, Tenant, Tool
from recovery.models.roles import ROLES, VIEWER
from recovery.providers.status import StatusAnswer
from recovery.registry import load_registry
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.breakers import breaker_record, breaker_reserve_probe
from recovery.services.calls import call_add
from recovery.services.metrics import metrics_fold
from recovery.services.outcomes import attempt_report, facts_of
from recovery.services.reconcile import apply_answer
from recovery.services.tasks import task_complete, task_create
from recovery.services.tokens import token_create
from tests.console import NO_ROLE, SIGNED_OUT, signed_in

RUNTIME = Actor.system("tests-runtime")
NEVER_OPENS = {"min_calls": 1_000_000}
STATUS = {"method": "GET", "path": "/by-key/{idempotency_key}", "status_map": {"succeeded": "committed"}}
REGISTRY = {
    "tenants": [{"name": "acme", "tools": "*"}, {"name": "globex", "tools": ["refund.create"]}],
    "providers": [{"name": "payments", "base_url": "http://127.0.0.1:9"}],
    "tools": [
        {
            "name": "refund.create",
            "provider": "payments",
            "side_effect": "write",
            "risk": "high",
            "request": {"method": "POST", "path": "/refunds"},
            "args_schema": {"type": "object"},
            "provider_ref_field": "refund_id",
            "required_result_fields": ["refund_id"],
            "status_query": STATUS,
            "budgets": {"max_attempts": 5},
            "breaker": NEVER_OPENS,
        },
        {
            "name": "order.lookup",
            "provider": "payments",
            "side_effect": "read",
            "request": {"method": "GET", "path": "/orders"},
            "args_schema": {"type": "object"},
            "required_result_fields": ["status"],
            "budgets": {"max_attempts": 5},
            "breaker": NEVER_OPENS,
        },
        {  # only its breaker is used here: opened by two failures, closed by a probe ten minutes later
            "name": "email.send",
            "provider": "payments",
            "side_effect": "write",
            "request": {"method": "POST", "path": "/emails"},
            "args_schema": {"type": "object"},
            "status_query": STATUS,
            "breaker": {"window_s": 60, "bucket_s": 10, "min_calls": 2, "failure_rate": 0.5, "cooldown_s": 600},
        },
    ],
}
COMMITTED = {"connection_opened": True, "sent": True, "http_status": 200, "result": {"refund_id": "re_1"}}
FOUND = {"connection_opened": True, "sent": True, "http_status": 200, "result": {"status": "shipped"}}
TIMEOUT = {"connection_opened": True, "sent": True, "error": {"kind": "read_timeout", "message": "no reply"}}
UNAVAILABLE = {"connection_opened": True, "sent": True, "http_status": 503}
NO_REFERENCE = {"connection_opened": True, "sent": True, "http_status": 200, "result": {}}  # a hard stop
_n = iter(range(1, 1_000_000))


@contextmanager
def clock(at: datetime) -> Iterator[None]:
    """Run the services at `at`: timezone.now() (which they read for state times and audit stamps) answers it."""
    with mock.patch("django.utils.timezone.now", lambda: at):
        yield


def new_task(tenant: str) -> Task:
    task, _ = task_create(
        tenant=Tenant.objects.get(name=tenant),
        external_id=f"ticket-{next(_n)}",
        agent="support-bot",
        goal="refunds",
        budget={"max_rounds": 500},
        actor=RUNTIME,
    )
    return task


def new_call(task: Task, tool: str) -> Call:
    n = next(_n)
    added = call_add(
        task=task,
        step_index=n,
        depends_on=[],
        tool_name=tool,
        arguments={"order_id": f"O-{n}"},
        idempotency_key=f"{tool}-{n}",
        actor=RUNTIME,
    )
    return added.call


def attempt(call: Call, facts: dict, *evidence: str) -> str:
    """Admit the call's next attempt and report `facts` as its outcome; the call's state afterwards."""
    call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
    number = call.attempts_count + 1
    admitted = attempt_admit(
        call=call, request=AttemptRequest(attempt_id=f"att-{call.pk}-{number}", evidence=evidence), actor=RUNTIME
    )
    assert admitted.status == 201, admitted.response
    call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
    row = Attempt.objects.select_related("tool").get(call=call, number=call.attempts_count)
    return attempt_report(call=call, attempt=row, facts=facts_of(facts), actor=RUNTIME)["call_state"]


def calls_of(task: Task, tool: str, *outcomes: dict) -> Call:
    call = new_call(task, tool)
    for facts in outcomes:
        attempt(call, facts)
    return call


def history(start: datetime) -> dict[str, Call]:
    """The story every count below is worked out from (acme may use every tool, globex refund.create only):

    acme, task 1:  c1 refund.create  committed at once
                   c2 refund.create  reply lost: UNKNOWN at start+1 min; a status check settles it COMMITTED 90 s later
                   c3 order.lookup   503 (RETRYABLE), then found: COMMITTED on its second attempt
                   c4 refund.create  reply lost: UNKNOWN, still open
                   c5 refund.create  200 without the refund id: HUMAN_REVIEW, still open
    acme, task 2:  c6 order.lookup   found at once; the task is completed
    globex:        g1 refund.create  reply lost: UNKNOWN, still open
                   g2 refund.create  committed at once
    email.send's breaker (shared by every tenant): opened by two failures at start+10 min, half-open after its
    600 s cooldown, closed by a successful probe at start+21 min: 660 s open.
    """
    at = start
    with clock(at):
        acme, globex = new_task("acme"), new_task("globex")
        made = {"c1": calls_of(acme, "refund.create", COMMITTED)}
    with clock(at + timedelta(minutes=1)):
        made["c2"] = calls_of(acme, "refund.create", TIMEOUT)
    with clock(at + timedelta(minutes=1, seconds=90)):
        apply_answer(
            made["c2"].pk, StatusAnswer(observed="committed", provider_status="succeeded", http_status=200), worker="t"
        )
    with clock(at + timedelta(minutes=2)):
        made["c3"] = calls_of(acme, "order.lookup", UNAVAILABLE)
    with clock(at + timedelta(minutes=3)):
        assert attempt(made["c3"], FOUND, "time_elapsed") == "COMMITTED"  # the backoff waited out
        made["c4"] = calls_of(acme, "refund.create", TIMEOUT)
        made["c5"] = calls_of(acme, "refund.create", NO_REFERENCE)
        done = new_task("acme")
        made["c6"] = calls_of(done, "order.lookup", FOUND)
        task_complete(task=done, summary="looked it up", deliverable=None, actor=RUNTIME)
        made["g1"] = calls_of(globex, "refund.create", TIMEOUT)
        made["g2"] = calls_of(globex, "refund.create", COMMITTED)
    email = Tool.objects.get(name="email.send")
    opened, closed = at + timedelta(minutes=10), at + timedelta(minutes=21)
    with clock(opened):
        for _ in range(2):
            breaker_record(email, counts_as_failure=True, probe=False, now=opened)
    with clock(closed):
        assert breaker_reserve_probe(email, now=closed)
        breaker_record(email, counts_as_failure=False, probe=True, now=closed)
    states = {name: Call.objects.get(pk=call.pk).state for name, call in made.items()}
    assert states == {
        "c1": "COMMITTED",
        "c2": "COMMITTED",
        "c3": "COMMITTED",
        "c4": "UNKNOWN",
        "c5": "HUMAN_REVIEW",
        "c6": "COMMITTED",
        "g1": "UNKNOWN",
        "g2": "COMMITTED",
    }
    return made


@pytest.fixture
def world(db):
    load_registry(REGISTRY, actor=Actor.system("tests"))
    tokens = {
        "acme": token_create(name="acme-runtime", tenants=["acme"], actor=RUNTIME)[1],
        "globex": token_create(name="globex-runtime", tenants=["globex"], actor=RUNTIME)[1],
        "scraper": token_create(name="acme-scraper", tenants=["acme"], scope="metrics", actor=RUNTIME)[1],
        "both": token_create(name="both", tenants=["acme", "globex"], scope="metrics", actor=RUNTIME)[1],
    }
    start = timezone.now().replace(microsecond=0) - timedelta(hours=2)
    calls = history(start)
    metrics_fold()
    return {"tokens": tokens, "calls": calls, "start": start}


def bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def scrape(client: Client | None = None, **headers) -> dict[tuple[str, tuple], float]:
    """GET /metrics, parsed: {(sample name, sorted labels): value}."""
    response = (client or Client()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    return samples(response.content.decode())


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


# --- what the history counts, worked out by hand ----------------------------------------------------------------

REFUND, LOOKUP, EMAIL = "refund.create", "order.lookup", "email.send"
QUEUES = ("compensation", "human_review", "unknown")
BOUNDS = ("1.0", "5.0", "15.0", "30.0", "60.0", "120.0", "300.0", "600.0", "1800.0", "3600.0", "7200.0", "14400.0",
          "28800.0", "86400.0", "259200.0", "604800.0", "+Inf")  # fmt: skip


def counter(name: str, value: float, **labels: str) -> tuple[tuple[str, tuple], float]:
    return (f"recovery_{name}", tuple(sorted(labels.items()))), value


def per_tool(name: str, values: dict[str, float]) -> list:
    return [counter(name, value, tool=tool) for tool, value in values.items()]


def resolution(waited: dict[str, list[float]], name: str = "time_to_resolution_seconds") -> list:
    """The histogram's samples for these waits (seconds) per queue; every queue appears, empty or not."""
    found = []
    for queue in QUEUES:
        times = waited.get(queue, [])
        for le in BOUNDS:
            found.append(counter(f"{name}_bucket", sum(t <= float(le) for t in times), le=le, queue=queue))
        found.append(counter(f"{name}_count", len(times), queue=queue))
        found.append(counter(f"{name}_sum", sum(times), queue=queue))
    return found


def no_holds() -> list:
    """The MCP gateway's hold metrics of a world without gateway calls: none held, none waiting, no wait."""
    found = [counter("mcp_holds_waiting", 0)]
    found += [counter("mcp_approval_wait_seconds_bucket", 0, le=le) for le in BOUNDS]
    return [*found, counter("mcp_approval_wait_seconds_count", 0), counter("mcp_approval_wait_seconds_sum", 0)]


def expected_acme(fold_seq: int) -> dict:
    """acme's scrape: c1..c6, and email.send's breaker (acme may use every tool)."""
    return dict(
        [
            counter("attempts_total", 1, tool=REFUND, outcome="committed"),  # c1
            counter("attempts_total", 2, tool=REFUND, outcome="unknown"),  # c2, c4
            counter("attempts_total", 1, tool=REFUND, outcome="human_review"),  # c5
            counter("attempts_total", 1, tool=LOOKUP, outcome="retryable"),  # c3's first
            counter("attempts_total", 2, tool=LOOKUP, outcome="committed"),  # c3's second, c6
            counter("failures_total", 2, tool=REFUND, **{"class": "outcome_unknown"}),
            counter("failures_total", 1, tool=REFUND, **{"class": "invalid_result"}),  # no refund id in the reply
            counter("failures_total", 1, tool=LOOKUP, **{"class": "transient"}),  # the 503
            counter("decisions_total", 2, tool=REFUND, route="reconcile"),
            counter("decisions_total", 1, tool=REFUND, route="escalate"),
            counter("decisions_total", 1, tool=LOOKUP, route="retry"),
            *per_tool("calls_total", {REFUND: 4, LOOKUP: 2}),
            *per_tool("write_calls_total", {REFUND: 4, LOOKUP: 0}),
            *per_tool("unknown_outcomes_total", {REFUND: 2, LOOKUP: 0}),  # c2, c4
            *per_tool("unknown_settled_total", {REFUND: 1, LOOKUP: 0}),  # c2, by a status check
            counter("reconcile_checks_total", 1, tool=REFUND, result="committed"),
            *per_tool("duplicate_side_effects_total", {REFUND: 0, LOOKUP: 0}),
            *per_tool("committed_calls_total", {REFUND: 2, LOOKUP: 2}),  # c1, c2; c3, c6
            *per_tool("committed_retries_total", {REFUND: 0, LOOKUP: 1}),  # c3 committed on its second attempt
            # c5 went to review on its attempt's outcome, with no explicit outcome: by its failure's class
            counter("human_takeovers_total", 1, tool=REFUND, reason="invalid_result"),
            counter("task_outcomes_total", 1, outcome="completed"),
            counter("queue_entries_total", 2, tool=REFUND, queue="unknown"),
            counter("queue_entries_total", 1, tool=REFUND, queue="human_review"),
            *per_tool("breaker_open_seconds_total", {EMAIL: 660, REFUND: 0, LOOKUP: 0}),
            *per_tool("breaker_openings_total", {EMAIL: 1, REFUND: 0, LOOKUP: 0}),
            *resolution({"unknown": [90]}),  # c2: 90 s in UNKNOWN
            *resolution({}, "time_to_first_claim_seconds"),  # nobody claimed anything
            *(
                counter("queue_items", n, queue=q)
                for q, n in {"unknown": 1, "human_review": 1, "compensation": 0}.items()
            ),
            *per_tool("breaker_state", {EMAIL: 0, REFUND: 0, LOOKUP: 0}),  # email.send closed again
            counter("metrics_fold_seq", fold_seq),
            counter("metrics_fold_age_seconds", 0),
            *no_holds(),
        ]
    )


def expected_globex(fold_seq: int) -> dict:
    """globex's scrape: g1 and g2 only, and no breaker of a tool it may not use."""
    return dict(
        [
            counter("attempts_total", 1, tool=REFUND, outcome="unknown"),
            counter("attempts_total", 1, tool=REFUND, outcome="committed"),
            counter("failures_total", 1, tool=REFUND, **{"class": "outcome_unknown"}),
            counter("decisions_total", 1, tool=REFUND, route="reconcile"),
            *per_tool("calls_total", {REFUND: 2}),
            *per_tool("write_calls_total", {REFUND: 2}),
            *per_tool("unknown_outcomes_total", {REFUND: 1}),
            *per_tool("unknown_settled_total", {REFUND: 0}),
            *per_tool("duplicate_side_effects_total", {REFUND: 0}),
            *per_tool("committed_calls_total", {REFUND: 1}),
            *per_tool("committed_retries_total", {REFUND: 0}),
            counter("queue_entries_total", 1, tool=REFUND, queue="unknown"),
            *per_tool("breaker_open_seconds_total", {REFUND: 0}),
            *per_tool("breaker_openings_total", {REFUND: 0}),
            *resolution({}),
            *resolution({}, "time_to_first_claim_seconds"),
            *(
                counter("queue_items", n, queue=q)
                for q, n in {"unknown": 1, "human_review": 0, "compensation": 0}.items()
            ),
            *per_tool("breaker_state", {REFUND: 0}),
            counter("metrics_fold_seq", fold_seq),
            counter("metrics_fold_age_seconds", 0),
            *no_holds(),
        ]
    )


def fold_seq() -> int:
    return AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first()


# --- /metrics: the numbers -------------------------------------------------------------------------------------


def test_it_exports_exactly_the_counts_of_the_tokens_tenant(world):
    assert scrape(**bearer(world["tokens"]["scraper"])) == expected_acme(fold_seq())
    assert scrape(**bearer(world["tokens"]["globex"])) == expected_globex(fold_seq())


def test_a_token_of_two_tenants_gets_their_sum_and_a_viewer_every_tenant(world, people):
    metrics_fold()  # the people's own audit events: nothing a metric counts, but events to fold
    acme, globex = expected_acme(fold_seq()), expected_globex(fold_seq())
    summed = {key: acme.get(key, 0) + globex.get(key, 0) for key in acme.keys() | globex.keys()}
    for gauge in ("recovery_metrics_fold_seq", "recovery_metrics_fold_age_seconds"):
        summed[(gauge, ())] = acme[(gauge, ())]
    for tool in (REFUND, LOOKUP, EMAIL):  # a breaker's state is the tool's, not added up
        summed[("recovery_breaker_state", (("tool", tool),))] = 0
    assert scrape(**bearer(world["tokens"]["both"])) == summed
    every = scrape(signed_in(people, VIEWER))  # every tenant: these two are all there are
    notifications = {key for key in every if key[0].startswith(("recovery_notification_", "recovery_overdue_"))}
    assert {key: every[key] for key in every.keys() - notifications} == summed
    assert {name for name, _ in notifications} == {  # only an unscoped scrape: they span tenants
        "recovery_notification_deliveries",
        "recovery_notification_tries_total",
        "recovery_overdue_items",
    }


def test_the_text_is_prometheus_text_with_help_and_no_ids(world):
    response = Client().get("/metrics", **bearer(world["tokens"]["scraper"]))
    assert response["Content-Type"].startswith("text/plain; version=")
    assert "no-cache" in response["Cache-Control"]
    families = list(text_string_to_metric_families(response.content.decode()))
    assert all(family.documentation for family in families)
    labels = {name for family in families for sample in family.samples for name in sample.labels}
    assert labels == {"tool", "outcome", "class", "route", "result", "reason", "queue", "le"}
    kinds = {family.name: family.type for family in families}
    assert kinds["recovery_time_to_resolution_seconds"] == "histogram"
    assert kinds["recovery_queue_items"] == kinds["recovery_breaker_state"] == "gauge"
    assert kinds["recovery_attempts"] == "counter"
    assert "0 closed, 1 half_open, 2 open, 3 forced_open" in response.content.decode()


def test_counters_hold_between_scrapes_and_only_grow_with_history(world):
    token = bearer(world["tokens"]["scraper"])
    before = scrape(**token)
    assert scrape(**token) == before
    with clock(world["start"] + timedelta(minutes=30)):
        task = new_task("acme")
        calls_of(task, REFUND, COMMITTED)
        calls_of(task, REFUND, TIMEOUT)
    metrics_fold()
    after = scrape(**token)
    counters = [key for key in before if not key[0].endswith(("_items", "_state", "_age_seconds"))]
    assert all(after[key] >= before[key] for key in counters)
    grown = {key[0] for key in counters if after[key] > before[key]}
    assert {"recovery_calls_total", "recovery_unknown_outcomes_total", "recovery_committed_calls_total"} <= grown
    assert after[("recovery_metrics_fold_seq", ())] > before[("recovery_metrics_fold_seq", ())]


def test_the_fold_age_says_how_long_the_oldest_uncounted_event_has_waited(world):
    token = bearer(world["tokens"]["scraper"])
    written = timezone.now().replace(microsecond=0)
    with clock(written):
        new_task("acme")  # an audit event the fold has not read yet
    with clock(written + timedelta(seconds=45)):
        stalled = scrape(**token)
    assert stalled[("recovery_metrics_fold_age_seconds", ())] == 45
    assert stalled[("recovery_metrics_fold_seq", ())] == fold_seq() - 1
    metrics_fold()
    assert scrape(**token)[("recovery_metrics_fold_age_seconds", ())] == 0


# --- /metrics: who may read it -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("who", "status"), [(SIGNED_OUT, 401), (NO_ROLE, 403), *((role, 200) for role in ROLES)])
def test_every_role_reads_metrics_and_nobody_else(world, people, who, status):
    response = signed_in(people, who).get("/metrics")
    assert response.status_code == status  # never a redirect to the sign-in page
    if status == 401:
        assert response["WWW-Authenticate"].startswith("Bearer ")


@pytest.mark.parametrize(
    "header",
    [
        "Bearer rc_" + "x" * 43,  # no such token
        "Bearer ",
        "Basic dXNlcjpwYXNz",  # another scheme
        "rc_only-the-token",
    ],
)
def test_a_bad_token_is_401_with_www_authenticate_even_with_a_session(world, people, header):
    for client in (Client(), signed_in(people, VIEWER)):  # the header decides, whatever session comes with it
        response = client.get("/metrics", HTTP_AUTHORIZATION=header)
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == 'Bearer realm="recovery-console", error="invalid_token"'


def test_a_revoked_token_is_refused(world):
    call_command("revoke_api_token", "acme-scraper", stdout=io.StringIO())
    assert Client().get("/metrics", **bearer(world["tokens"]["scraper"])).status_code == 401


def test_it_answers_get_only_and_needs_no_csrf_token(world):
    client = Client(enforce_csrf_checks=True)
    for method in ("post", "put", "delete"):
        assert getattr(client, method)("/metrics", **bearer(world["tokens"]["scraper"])).status_code == 405
    assert client.get("/metrics", **bearer(world["tokens"]["scraper"])).status_code == 200


# --- scopes ------------------------------------------------------------------------------------------------------


def test_a_metrics_token_reads_the_metrics_and_nothing_else(world):
    metrics_token, runtime_token = bearer(world["tokens"]["scraper"]), bearer(world["tokens"]["acme"])
    task = {"tenant": "acme", "external_id": "t-new", "agent": "a", "goal": "g"}
    refused = Client().post("/api/v1/tasks", task, content_type="application/json", **metrics_token)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "wrong_token_scope"
    assert refused.json()["error"]["detail"] == {"token_scope": "metrics", "accepted_scopes": ["runtime"]}
    assert not Task.objects.filter(external_id="t-new").exists()
    call = world["calls"]["c4"]
    for url in (f"/api/v1/calls/{call.pk}", "/api/v1/capabilities?tenant=acme", f"/api/v1/tasks/{call.task_id}"):
        assert Client().get(url, **metrics_token).status_code == 403, url
        assert Client().get(url, **runtime_token).status_code == 200, url
    for token in (metrics_token, runtime_token):
        assert Client().get("/api/v1/metrics", **token).status_code == 200
        assert Client().get("/metrics", **token).status_code == 200


def test_the_scope_check_adds_no_statement(world):
    client, token = Client(), bearer(world["tokens"]["scraper"])
    client.get("/api/v1/tasks/1", **token)  # last_used_at written: from here on a read
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/api/v1/tasks/1", **token).status_code == 403
    assert len(queries) == 1  # the token with its tenants, as for any request


# --- GET /api/v1/metrics -----------------------------------------------------------------------------------------


def figures(body: dict) -> dict[str, dict]:
    return {figure["key"]: figure for figure in body["figures"]}


def test_the_json_has_the_figures_of_the_tokens_tenants(world):
    response = Client().get("/api/v1/metrics", **bearer(world["tokens"]["scraper"]))
    assert response.status_code == 200
    body = response.json()
    assert (body["window"], body["step_s"], len(figures(body)["attempts"]["series"])) == ("24h", 3600, 24)
    assert body["queues"] == {"unknown": 1, "human_review": 1, "compensation": 0}
    assert body["folded_at"] is not None and body["lag_s"] >= 0
    found = figures(body)
    assert found["attempts"]["value"] == 7
    assert found["attempts"]["by_label"] == [
        {"label": "committed", "value": 3},
        {"label": "unknown", "value": 2},
        {"label": "human_review", "value": 1},
        {"label": "retryable", "value": 1},
    ]
    rates = {key: (found[key]["numerator"], found[key]["denominator"], found[key]["value"]) for key in found}
    assert rates["unknown_outcome_rate"] == (2, 4, 0.5)
    assert rates["reconcile_success_rate"] == (1, 2, 0.5)
    assert rates["duplicate_effect_rate"] == (0, 4, 0.0)
    assert rates["retries_per_success"] == (1, 4, 0.25)
    assert rates["task_success_rate"] == (1, 1, 1.0)
    ttr = found["time_to_resolution"]
    assert (ttr["count"], ttr["median"], ttr["value"], ttr["unit"]) == (1, 90.0, 117.0, "s")  # inside (60, 120]
    assert all(figure["doc"] and figure["title"] for figure in body["figures"])


def test_the_json_narrows_to_a_tool_and_to_one_of_the_tokens_tenants(world):
    both = bearer(world["tokens"]["both"])
    lookup = figures(Client().get("/api/v1/metrics?tool=order.lookup", **both).json())
    assert lookup["attempts"]["value"] == 3
    assert (lookup["unknown_outcome_rate"]["denominator"], lookup["unknown_outcome_rate"]["value"]) == (0, None)
    globex = Client().get("/api/v1/metrics?tenant=globex&window=7d", **both).json()
    assert (globex["window"], globex["step_s"], globex["queues"]["unknown"]) == ("7d", 6 * 3600, 1)
    assert figures(globex)["unknown_outcome_rate"]["value"] == 0.5  # g1 of g1, g2
    summed = figures(Client().get("/api/v1/metrics?window=30d", **both).json())
    assert summed["attempts"]["value"] == 7 + 2


@pytest.mark.parametrize(
    ("token", "query", "status", "field"),
    [
        ("scraper", "tenant=globex", 404, "tenant"),  # another tenant's
        ("scraper", "tenant=initech", 404, "tenant"),  # none at all: the same answer
        ("scraper", "tool=refund.nope", 404, "tool"),
        ("globex", "tool=email.send", 404, "tool"),  # registered, but not one globex may use
        ("scraper", "window=1y", 422, "window"),
        ("scraper", "window=", 422, "window"),
        ("scraper", "tool=a%00b", 422, "tool"),
    ],
)
def test_bad_parameters_get_field_errors(world, token, query, status, field):
    response = Client().get(f"/api/v1/metrics?{query}", **bearer(world["tokens"][token]))
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert [e["field"] for e in error["field_errors"]] == [field]


def test_the_json_needs_a_token(world, people):
    assert Client().get("/api/v1/metrics").status_code == 401
    assert signed_in(people, VIEWER).get("/api/v1/metrics").status_code == 401  # the API is for tokens


# --- statements: constant in the history ---------------------------------------------------------------------------


def _statements(client: Client, url: str, **headers) -> int:
    client.get(url, **headers)  # a token's last use is written at most once a minute: not what is measured
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url, **headers).status_code == 200
    return len(queries)


def test_statements_are_the_same_with_3_and_30_calls(db, people):
    load_registry(REGISTRY, actor=Actor.system("tests"))
    _, acme = token_create(name="small", tenants=["acme"], scope="metrics", actor=RUNTIME)
    _, globex = token_create(name="narrow", tenants=["globex"], actor=RUNTIME)
    task = new_task("acme")
    urls = [
        ("/metrics", bearer(acme)),
        ("/metrics", bearer(globex)),  # tools of its tenants looked up
        ("/api/v1/metrics", bearer(acme)),
        ("/api/v1/metrics?window=30d&tool=order.lookup&tenant=acme", bearer(acme)),
    ]
    counted = []
    for calls in (3, 27):
        for n in range(calls):
            calls_of(task, (REFUND, LOOKUP)[n % 2], (COMMITTED, FOUND)[n % 2] if n % 3 else TIMEOUT)
        metrics_fold()
        viewer = signed_in(people, VIEWER)
        counted.append(
            [_statements(Client(), url, **headers) for url, headers in urls] + [_statements(viewer, "/metrics")]
        )
    assert counted[0] == counted[1]
    assert Call.objects.count() == 30


# --- the Grafana dashboard -----------------------------------------------------------------------------------------

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless"}


def expressions(node) -> Iterator[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables' queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" or (key == "query" and isinstance(value, str) and "(" in value):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords, label names in a
    grouping, label matchers, durations or strings."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings (label values)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r"^label_values\(([a-zA-Z_:][\w:]*)\s*,\s*\w+\)$", r"\1", expr.strip())  # a variable's query
    names = re.findall(r"(?<![\w$.])([a-zA-Z_:][\w:]*)\b(?!\s*\()", expr)
    return {name for name in names if name not in PROMQL_WORDS}


def test_the_metric_names_parse_as_the_text_shows_them():
    assert metric_names('sum by (le, queue) (rate(recovery_x_bucket{tool=~"$tool"}[$window]))') == {"recovery_x_bucket"}
    assert metric_names("label_values(recovery_calls_total, tool)") == {"recovery_calls_total"}
    assert metric_names("a / on (tool) b unless c") == {"a", "b", "c"}


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_names(text: str) -> set[str]:
    """The sample names a scrape carries, and those of its families that have no sample yet (a counter nothing
    counted so far is there, by its HELP and TYPE)."""
    families = list(text_string_to_metric_families(text))
    return {family.name + suffix for family in families for suffix in SUFFIXES[family.type]} | {
        sample.name for family in families for sample in family.samples
    }


def test_every_metric_the_dashboard_uses_is_exported(world):
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names(Client().get("/metrics", **bearer(world["tokens"]["scraper"])).content.decode())
    used: set[str] = set()
    exprs = list(expressions(dashboard))
    for expr in exprs:
        assert expr.count("(") == expr.count(")") and expr.count("[") == expr.count("]"), expr
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        used |= names
    assert used <= exported, used - exported
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert all(panel["targets"] and panel["description"] for panel in panels)
    wanted = {  # the figures an operator looks for first
        "recovery_unknown_outcomes_total", "recovery_write_calls_total", "recovery_unknown_settled_total",
        "recovery_duplicate_side_effects_total", "recovery_committed_retries_total", "recovery_committed_calls_total",
        "recovery_human_takeovers_total", "recovery_time_to_resolution_seconds_bucket", "recovery_queue_items",
        "recovery_breaker_state", "recovery_metrics_fold_age_seconds",
    }  # fmt: skip
    assert wanted <= used
    assert any("histogram_quantile(0.95" in expr for expr in exprs)

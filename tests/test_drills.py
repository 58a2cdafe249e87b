"""The fault drills of docs/drills.md through the real stack: the live API, a sandbox process, and background jobs (an
RQ worker process on Redis with REDIS_URL, the in-process runner without). Each drill must pass, and each test then
checks the drill's key facts again on its own, from the database and the sandbox, rather than trusting the runner's
verdict; one test proves that a drill whose expectation is not met fails, and the command prints its table, stores
the run and exits non-zero on a mismatch.

The drills of operator actions act as drill users (a reviewer, two approvers): "two approvers" releases both
approvers of each round at once on PostgreSQL (one after the other on SQLite), "worker killed mid-replay" kill -9s a
real RQ worker process (skipped without Redis, a failure under REQUIRE_SERVICES=1), and the two compensation drills
undo an order the agent created with an approved start_compensation, its entry judged under its own key. The demo
path of `make run` — a refund reconciliation could not settle, replayed with its key by the demo reviewer and
approver — is played here on the drill stage with the console's own users.
"""

from __future__ import annotations

from collections import Counter
from contextlib import suppress
from dataclasses import replace
from io import StringIO
from itertools import pairwise

import pytest
from django.apps import apps as django_apps
from django.conf import settings
from django.core.management import CommandError, call_command, execute_from_command_line
from django.db import connection
from django.urls import reverse
from rq.exceptions import NoSuchJobError
from rq.job import Job

from recovery.audit.chain import Actor
from recovery.devtools.drills.evidence import at
from recovery.devtools.drills.framework import wait
from recovery.devtools.drills.judge import rejudge
from recovery.devtools.drills.report import result_table
from recovery.devtools.drills.results import DrillResult
from recovery.devtools.drills.runner import run_drill
from recovery.devtools.drills.stage import DRILL_APPROVERS, DRILL_REVIEWER, drill_stage
from recovery.devtools.drills.table import DRILLS, CompensationEnd, End
from recovery.devtools.management.commands import drill as drill_command
from recovery.devtools.scenarios import run_scenarios
from recovery.engine.compensation_states import EntryState as E
from recovery.engine.states import CallState as S
from recovery.jobs import queueing
from recovery.models import (
    ActionRequest,
    ActionStatus,
    Attempt,
    AuditEvent,
    Breaker,
    Call,
    CompensationEntry,
    CompensationReceipt,
    DrillRun,
    DuplicateProbe,
    GateDecision,
    Receipt,
)
from recovery.models.roles import sync_roles
from recovery.services.actions import action_approve, action_preview, action_request
from recovery.services.users import user_save_with_roles
from tests.conftest import missing_service

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 40  # the command makes 1,000; the suite keeps to a size that runs in seconds


@pytest.fixture
def stage(live_server):
    with drill_stage(api_url=live_server.url) as stage:
        yield stage


def passed(stage, slug: str, **options) -> DrillResult:
    lines: list[str] = []
    result = run_drill(stage, slug, log=lines.append, **options)
    assert result.passed, "\n".join(lines)
    assert result.keys and all(row.passed for row in result.keys)
    assert [check.name for check in result.checks] == list(DRILLS[slug].checks)
    return result


def transitions(call_id: int) -> list[str]:
    """The call's own states after READY (its compensation entries' transitions are on the call too: not these)."""
    events = AuditEvent.objects.filter(call_id=call_id, action="call.transition").exclude(from_state="")
    return list(events.order_by("seq").values_list("to_state", flat=True))


def entry_transitions(call_id: int) -> list[str]:
    events = AuditEvent.objects.filter(call_id=call_id, action="compensation.transition").order_by("seq")
    return list(events.values_list("to_state", flat=True))


def writes(stage, key: str) -> list[tuple[str, int | None, str]]:
    return [(r["method"], r["status"], r["outcome"]) for r in stage.sandbox.requests(key=key) if r["method"] == "POST"]


def test_refused_before_send_retries_the_same_key_and_the_provider_sees_one_request(stage):
    (row,) = passed(stage, "refused-before-send").keys

    call = Call.objects.get(pk=row.call_id)
    assert transitions(call.pk) == [S.SENT, S.RETRYABLE, S.SENT, S.COMMITTED]
    first, second = Attempt.objects.filter(call=call).order_by("number")
    assert (first.error_kind, first.connection_opened, first.http_status) == ("connection_refused", False, None)
    assert second.http_status == 200
    assert writes(stage, call.idempotency_key) == [("POST", 200, "answered")]  # the refused one never arrived
    assert stage.sandbox.ledger(call.idempotency_key)["effects"] == 1


def test_timeout_after_send_is_settled_by_a_receipt_without_a_second_request(stage):
    (row,) = passed(stage, "timeout-after-send").keys

    assert transitions(row.call_id) == [S.SENT, S.UNKNOWN, S.COMMITTED]
    (receipt,) = Receipt.objects.filter(call_id=row.call_id)
    assert (receipt.observed, receipt.applied, receipt.effects_observed) == ("committed", True, 1)
    assert writes(stage, row.key) == [("POST", None, "dropped_after_commit")]
    assert stage.sandbox.ledger(row.key)["effects"] == 1


def test_lost_before_commit_is_proven_not_committed_then_retried_once_with_the_same_key(stage):
    (row,) = passed(stage, "lost-before-commit").keys

    assert transitions(row.call_id) == [S.SENT, S.UNKNOWN, S.NOT_COMMITTED, S.RETRYABLE, S.SENT, S.COMMITTED]
    first, second = Attempt.objects.filter(call_id=row.call_id).order_by("number")
    assert first.error_kind == "read_timeout" and second.evidence == ["state_verified"]
    proof = Receipt.objects.get(call_id=row.call_id, observed="not_committed")
    assert proof.applied and proof.checked_at < second.admitted_at
    assert writes(stage, row.key) == [("POST", None, "dropped_before_commit"), ("POST", 200, "answered")]
    assert stage.sandbox.ledger(row.key)["effects"] == 1


def test_three_copies_of_one_callback_store_one_receipt_and_move_the_call_once(stage):
    (row,) = passed(stage, "duplicate-callbacks").keys

    deliveries = [c for c in stage.sandbox.callbacks() if c["idempotency_key"] == row.key]
    assert len(deliveries) == 3 and len({c["event_id"] for c in deliveries}) == 1
    assert Receipt.objects.filter(event_id=deliveries[0]["event_id"]).count() == 1
    assert Receipt.objects.filter(call_id=row.call_id, applied=True).count() == 1
    assert transitions(row.call_id) == [S.SENT, S.UNKNOWN, S.COMMITTED]
    assert stage.sandbox.ledger(row.key)["effects"] == 1


def test_a_rate_limited_lookup_never_comes_back_before_its_retry_after(stage):
    (row,) = passed(stage, "rate-limit").keys

    call = Call.objects.get(pk=row.call_id)
    assert transitions(call.pk) == [S.SENT, S.RETRYABLE, S.SENT, S.RETRYABLE, S.SENT, S.COMMITTED]
    seen = stage.sandbox.requests(path_prefix=f"/replica/orders/{call.arguments['order_id']}")
    assert [r["status"] for r in seen] == [429, 429, 200]
    times = [at(r) for r in seen]
    assert all((later - earlier).total_seconds() >= 2.0 for earlier, later in pairwise(times))
    assert stage.sandbox.ledger(row.key)["effects"] == 0


def test_a_failing_dependency_opens_the_breaker_and_after_the_cooldown_one_probe_goes(stage):
    result = passed(stage, "dependency-5xx")

    calls = {row.key: Call.objects.get(pk=row.call_id) for row in result.keys}
    ends = {call.state for call in calls.values()}
    assert ends <= {S.FAILED_PERMANENT, S.READY, S.RETRYABLE} and S.READY in ends
    for call in calls.values():
        if call.state == S.FAILED_PERMANENT:
            assert (call.attempts_count, call.outcome) == (3, "retry_exhausted")
        elif call.state == S.READY:  # refused at admission: nothing was sent
            denial = GateDecision.objects.filter(call=call).latest("id")
            assert (denial.allowed, denial.reason, denial.required_next["action"]) == (False, "breaker_open", "degrade")
    probes = [key for key in calls if "-probe-" in key]
    assert Attempt.objects.filter(call__idempotency_key__in=probes, breaker_probe=True).count() == 1
    tool = stage.tool("order.lookup")
    actions = list(
        AuditEvent.objects.filter(action__startswith="breaker.", evidence__tool=tool).values_list("action", flat=True)
    )
    assert actions == ["breaker.opened", "breaker.reopened", "breaker.closed"]  # the failed probe, then recovery
    assert Breaker.objects.get(tool__name=tool).state == "closed"
    assert all(stage.sandbox.ledger(key)["effects"] == 0 for key in calls)


def rows_by_step(result) -> dict[str, object]:
    """A drill of steps whose calls each have one row (no compensation entries): its row by step."""
    rows = {row.step: row for row in result.keys}
    assert len(rows) == len(result.keys)
    return rows


def test_a_status_api_that_is_down_sends_the_unknown_refund_to_a_person_at_the_poll_budget(stage):
    """refund.create (never probed): HUMAN_REVIEW at the poll budget. refund.replayed, probed safe first by an
    approved duplicate probe: COMMITTED by its one same-key replay, one effect, no person."""
    result = passed(stage, "status-api-down")
    rows = rows_by_step(result)
    assert list(rows) == ["probed", "unprobed", "replayed"]  # the probe's target first, to let its key age

    row = rows["unprobed"]
    call = Call.objects.get(pk=row.call_id)
    assert call.tool.name == stage.tool("refund.create") and call.tool.retry_path == "unprobed"
    assert transitions(call.pk) == [S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW]
    assert (call.checks_made, call.outcome) == (3, "poll_budget_exhausted")
    assert list(Receipt.objects.filter(call=call).values_list("observed", flat=True)) == ["failed"] * 3
    status = [r["status"] for r in stage.sandbox.requests(key=row.key) if r["method"] == "GET"]
    assert status == [503, 503, 503]
    assert writes(stage, row.key) == [("POST", None, "dropped_after_commit")]
    assert stage.sandbox.ledger(row.key)["effects"] == 1
    assert call.replay_reconciled_at is None

    # The probe: an approved probe_duplicate of the committed refund, answered from the provider's idempotency record.
    probed, replayed = (Call.objects.get(pk=rows[step].call_id) for step in ("probed", "replayed"))
    tool = probed.tool
    assert tool.name == stage.tool("refund.replayed") and replayed.tool_id == tool.pk
    (request,) = ActionRequest.objects.filter(call=probed)
    assert (request.action, request.status) == ("probe_duplicate", ActionStatus.EXECUTED)
    assert request.requested_by.username == DRILL_REVIEWER and request.decided_by.username == DRILL_APPROVERS[0]
    (probe,) = DuplicateProbe.objects.filter(call=probed)
    assert (probe.second, probe.downstream_audit, probe.decision) == (
        "idempotent_replay",
        "one_effect",
        "retry_path_safe",
    )
    assert (probe.observed_effects, probe.action_id, probe.provider_base_url) == (1, request.pk, stage.sandbox.url)
    first_sent = Attempt.objects.get(call=replayed, number=1).admitted_at  # where the gate counts a key's age from
    assert probe.key_age_s >= 8 and probe.created_at < first_sent
    assert (tool.retry_path, tool.retry_path_probe_id, tool.retry_path_key_age_s) == ("safe", probe.pk, probe.key_age_s)
    assert writes(stage, probed.idempotency_key) == [("POST", 200, "answered"), ("POST", 200, "replayed")]
    assert stage.sandbox.ledger(probed.idempotency_key)["effects"] == 1

    # The replayed refund: one failed check, then the one same-key replay; never a person.
    assert transitions(replayed.pk) == [S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.COMMITTED]
    assert replayed.replay_reconciled_at is not None
    receipts = Receipt.objects.filter(call=replayed).order_by("id")
    assert [(r.source, r.observed, r.applied) for r in receipts] == [
        ("poll", "failed", True),
        ("idempotent_replay", "committed", True),
    ]
    _, replay = Attempt.objects.filter(call=replayed).order_by("number")
    assert (replay.attempt_id, replay.evidence, replay.http_status) == ("reconcile-replay", ["replay_reconcile"], 200)
    admitted = GateDecision.objects.get(call=replayed, candidate_attempt_id="reconcile-replay")
    assert (admitted.allowed, admitted.evidence_used) == (True, "replay_reconcile")
    assert int((replay.admitted_at - first_sent).total_seconds()) < probe.key_age_s
    assert not ActionRequest.objects.filter(call=replayed).exists()
    assert not AuditEvent.objects.filter(call_id=replayed.pk, to_state=S.HUMAN_REVIEW).exists()
    assert writes(stage, replayed.idempotency_key) == [
        ("POST", None, "dropped_after_commit"),
        ("POST", 200, "replayed"),
    ]
    assert [r["status"] for r in stage.sandbox.requests(key=replayed.idempotency_key) if r["method"] == "GET"] == [503]
    ledger = stage.sandbox.ledger(replayed.idempotency_key)
    assert ledger["effects"] == 1 and ledger["entries"][0]["provider_ref"] == replayed.provider_ref

    # The same evidence against a table that says the replayed refund went to a person, or that the probe left two
    # effects, fails; only that row does.
    drill = DRILLS["status-api-down"]
    steps = {step.step: step for step in drill.steps}
    to_a_person = replace(steps["replayed"], end=End(path=(S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW)))
    judged = rejudge(stage, result, replace(drill, steps=(steps["unprobed"], steps["probed"], to_a_person)))
    assert not judged.passed and [row.passed for row in judged.keys] == [True, True, False]
    assert judged.keys[2].observed_end == "SENT → UNKNOWN → STILL_UNKNOWN → COMMITTED"
    doubled = replace(steps["probed"], effects=2)
    judged = rejudge(stage, result, replace(drill, steps=(steps["unprobed"], doubled, steps["replayed"])))
    assert not judged.passed and [row.passed for row in judged.keys] == [False, True, True]
    assert (judged.keys[0].expected_effects, judged.keys[0].observed_effects) == (2, 1)
    assert all(check.passed for check in judged.checks)  # only the table differs, and that is enough


def test_a_provider_that_ignores_keys_is_probed_unsafe_and_nothing_replays_the_tool_again(stage):
    """Broken mode for one key: the probe's replay makes a second refund (the evidence) and says retry_path_unsafe;
    then reconciliation does not replay a lost reply of the tool, an operator cannot, and the runtime's same-key
    retry after state_verified is denied retry_path_unsafe."""
    result = passed(stage, "provider-ignores-keys")
    rows = rows_by_step(result)
    assert list(rows) == ["probed", "reply lost", "lost before commit"]
    probed, lost, dropped = (Call.objects.get(pk=rows[step].call_id) for step in rows)
    tool = probed.tool
    assert tool.name == stage.tool("refund.ignores-keys") and {lost.tool_id, dropped.tool_id} == {tool.pk}
    assert stage.tool("refund.create") != tool.name  # the shipped tools are never probed by this drill

    # The probe: approved by a second person, its replay executed anew; two refunds, two ids, for one key.
    assert transitions(probed.pk) == [S.SENT, S.COMMITTED]
    (request,) = ActionRequest.objects.filter(call=probed)
    assert (request.action, request.status) == ("probe_duplicate", ActionStatus.EXECUTED)
    assert request.requested_by.username == DRILL_REVIEWER and request.decided_by.username == DRILL_APPROVERS[0]
    (probe,) = DuplicateProbe.objects.filter(call=probed)
    assert (probe.second, probe.downstream_audit, probe.decision) == (
        "new_business_id",
        "second_effect",
        "retry_path_unsafe",
    )
    assert (probe.observed_effects, probe.expected_effects, probe.action_id) == (2, 1, request.pk)
    assert probe.first_business_id == probed.provider_ref != probe.second_business_id
    assert (tool.retry_path, tool.retry_path_probe_id, tool.retry_path_key_age_s) == ("unsafe", probe.pk, None)
    changed = AuditEvent.objects.filter(action="tool.retry_path", evidence__tool=tool.name).latest("seq")
    assert (changed.from_state, changed.to_state, changed.evidence["probe"]) == ("unprobed", "unsafe", probe.pk)
    assert writes(stage, probed.idempotency_key) == [("POST", 200, "answered"), ("POST", 200, "answered")]
    ledger = stage.sandbox.ledger(probed.idempotency_key)
    assert ledger["effects"] == 2
    assert [entry["provider_ref"] for entry in ledger["entries"]] == [probe.first_business_id, probe.second_business_id]

    # Reconciliation: every check failed and counted; no replay, no replay mark, no idempotent_replay receipt.
    assert transitions(lost.pk) == [S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW]
    assert (lost.checks_made, lost.outcome, lost.replay_reconciled_at) == (3, "poll_budget_exhausted", None)
    assert list(Receipt.objects.filter(call=lost).values_list("source", "observed")) == [("poll", "failed")] * 3
    assert Attempt.objects.filter(call=lost).count() == 1
    assert not GateDecision.objects.filter(call=lost, candidate_attempt_id="reconcile-replay", allowed=True).exists()
    assert writes(stage, lost.idempotency_key) == [("POST", None, "dropped_after_commit")]
    assert stage.sandbox.ledger(lost.idempotency_key)["effects"] == 1
    assert not ActionRequest.objects.filter(call=lost).exists()  # the operator's replay was refused at its preview

    # The runtime: proven not committed, its same-key retry denied at the retry path, told to stop; nothing resent.
    assert transitions(dropped.pk) == [S.SENT, S.UNKNOWN, S.NOT_COMMITTED, S.RETRYABLE]
    (denial,) = GateDecision.objects.filter(call=dropped, allowed=False, dry_run=False)
    assert (denial.reason, denial.required_next["action"]) == ("retry_path_unsafe", "stop")
    assert "state_verified" in denial.candidate["evidence"]
    by_check = {c["name"]: c["passed"] for c in denial.checks}
    assert (by_check["evidence"], by_check["retry_path"]) == (True, False)
    assert Attempt.objects.filter(call=dropped).count() == 1
    assert writes(stage, dropped.idempotency_key) == [("POST", None, "dropped_before_commit")]
    assert stage.sandbox.ledger(dropped.idempotency_key)["effects"] == 0

    # The same evidence against a table that says the provider deduplicated (one effect for the probed key), or that
    # the runtime's retry was admitted and committed, fails; only that row does.
    drill = DRILLS["provider-ignores-keys"]
    steps = {step.step: step for step in drill.steps}
    one_effect = replace(steps["probed"], effects=1)
    judged = rejudge(
        stage, result, replace(drill, steps=(one_effect, steps["reply lost"], steps["lost before commit"]))
    )
    assert not judged.passed and [row.passed for row in judged.keys] == [False, True, True]
    assert (judged.keys[0].expected_effects, judged.keys[0].observed_effects) == (1, 2)
    retried = replace(
        steps["lost before commit"],
        end=End(path=(S.SENT, S.UNKNOWN, S.NOT_COMMITTED, S.RETRYABLE, S.SENT, S.COMMITTED)),
        effects=1,
    )
    judged = rejudge(stage, result, replace(drill, steps=(steps["probed"], steps["reply lost"], retried)))
    assert not judged.passed and [row.passed for row in judged.keys] == [True, True, False]
    assert judged.keys[2].observed_end == "SENT → UNKNOWN → NOT_COMMITTED → RETRYABLE, told: stop"
    assert all(check.passed for check in judged.checks)  # only the table differs, and that is enough


def test_a_backlog_of_lost_replies_is_committed_by_one_check_each(stage):
    result = passed(stage, "queue-backlog", backlog=BACKLOG)

    ids = [row.call_id for row in result.keys]
    assert len(ids) == BACKLOG
    assert Call.objects.filter(pk__in=ids, state=S.COMMITTED).count() == BACKLOG
    applied = Receipt.objects.filter(call_id__in=ids, applied=True, observed="committed")
    assert applied.count() == BACKLOG and applied.values("call_id").distinct().count() == BACKLOG
    queries = [r["key"] for r in stage.sandbox.requests(path_prefix="/refunds/by-key/")]
    keys = [row.key for row in result.keys]
    assert sorted(queries) == sorted(keys)  # one status query per key: never two workers on one call
    effects = stage.sandbox.ledger()["by_key"]
    assert [effects.get(key) for key in keys] == [1] * BACKLOG


def test_a_drill_whose_expectation_is_not_met_fails_with_the_mismatch(stage):
    """The ledger holds one effect for the key; a table claiming two must fail the drill (a wrong end fails it too:
    the command's test below)."""
    claims_two = replace(DRILLS["timeout-after-send"], effects=2)
    lines: list[str] = []
    result = run_drill(stage, "timeout-after-send", log=lines.append, expect=claims_two)

    assert not result.passed
    (row,) = result.keys
    assert (row.expected_effects, row.observed_effects, row.passed) == (2, 1, False)
    assert row.observed_end == row.expected_end == "SENT → UNKNOWN → COMMITTED"
    assert all(check.passed for check in result.checks)  # only the effects differ, and that is enough
    assert "1 effect(s) MISMATCH: expected SENT → UNKNOWN → COMMITTED, 2" in "\n".join(lines)
    assert result.observed.startswith("SENT → UNKNOWN → COMMITTED; 1 effect;") and lines[-1].startswith("  FAIL")

    # A table that says the refund was also undone: the call has no compensation entry, and that row fails.
    undone = CompensationEnd(path=(E.SENT, E.COMMITTED), effects=1, what="cancellation")
    judged = rejudge(stage, result, replace(DRILLS["timeout-after-send"], compensation=undone))
    call_row, missing = judged.keys
    assert call_row.passed and not judged.passed
    assert (missing.entry, missing.observed_end, missing.expected_end, missing.passed) == (
        1,
        "no entry was made",
        "entry 1: sent → committed",
        False,
    )


def test_the_command_prints_the_result_table_and_stores_the_run_for_the_console(transactional_db, client):
    out = StringIO()
    call_command("drill", "timeout after send", "--workers", "1", stdout=out)

    printed = out.getvalue()
    assert "== timeout after send (timeout-after-send) ==" in printed
    table = printed[printed.index("\ndrill ") + 1 :].splitlines()
    assert [cell.strip() for cell in table[0].split("|")] == ["drill", "expected", "observed", "result"]
    assert table[2].startswith("timeout after send") and table[2].endswith("| pass")
    assert "1 of 1 drills passed" in printed
    run = DrillRun.objects.get()
    assert (run.drills, run.passed, run.finished_at is not None) == (["timeout after send"], True, True)
    (stored,) = run.results
    assert stored["passed"] and stored["keys"][0]["observed_end"] == "SENT → UNKNOWN → COMMITTED"
    assert stored["keys"][0]["observed_effects"] == 1
    assert "| pass" in run.log and run.options["backlog"] == 1000

    sync_roles(django_apps)  # the role groups come from a migration: an earlier test's flush removed them
    user_save_with_roles(username="ada", roles=["admin"], password="drill-admin-pw-9", actor=Actor.system("tests"))
    client.login(username="ada", password="drill-admin-pw-9")
    page = client.get(reverse("admin:recovery_drillrun_change", args=[run.pk])).content.decode()
    assert "timeout after send" in page and "SENT → UNKNOWN → COMMITTED; 1 effect; checks 2/2" in page
    assert 'name="_save"' not in page  # read-only: a drill run is never edited


def test_the_command_exits_non_zero_when_a_drill_does_not_end_as_the_table_says(transactional_db, monkeypatch, capsys):
    wrong = replace(DRILLS["timeout-after-send"], ends=(End(path=(S.SENT, S.COMMITTED)),))
    monkeypatch.setitem(DRILLS, "timeout-after-send", wrong)

    with pytest.raises(SystemExit) as exit:
        execute_from_command_line(["manage.py", "drill", "timeout-after-send", "--workers", "1", "--api-workers", "0"])

    assert exit.value.code == 1
    captured = capsys.readouterr()
    assert "MISMATCH: expected SENT → COMMITTED" in captured.out
    assert captured.out.rstrip().splitlines()[-1].endswith("| FAIL")
    assert "0 of 1 drills passed" in captured.err and "failed: timeout after send" in captured.err
    run = DrillRun.objects.get()
    assert run.passed is False and run.results[0]["keys"][0]["passed"] is False


def test_the_command_lists_the_drills_and_refuses_an_unknown_name():
    out = StringIO()
    call_command("drill", "--list", stdout=out)

    listed = out.getvalue()
    assert all(listed.count(f"{slug} ") == 1 for slug in DRILLS)
    assert "(not run here)" not in listed  # every row of docs/drills.md's table that the command runs is listed
    assert "step probed: SENT → COMMITTED, 2 effects" in listed  # provider ignores keys: the probe's second effect
    assert "step replayed: SENT → UNKNOWN → STILL_UNKNOWN → COMMITTED, 1 effect" in listed  # status API down
    assert "two-approvers        two approvers: 50 rounds of two approvals at once" in listed
    assert "needs: REDIS_URL (skipped with the reason without it)" in listed
    assert "its compensation: entry 1: sent → unknown → committed; 1 cancellation under its own key" in listed
    assert "its compensation: entry 1: sent → failed; 0 cancellations under its own key" in listed
    assert (
        "step payment: SENT → UNKNOWN → COMMITTED → COMPENSATING → COMPENSATED, 1 effect; entry 1: sent → committed,"
        " 1 refund" in listed
    )
    every = (
        "refused-before-send, timeout-after-send, deferred-report-lost, lost-before-commit, duplicate-callbacks, "
        "rate-limit, dependency-5xx, "
        "status-api-down, queue-backlog, worker-killed-mid-replay, two-approvers, provider-ignores-keys, "
        "compensation-reply-lost, compensation-refused, saga-aborted, saga-aborted-unknown-step, lookup-by-listing, "
        "eventually-consistent-search, square-wire, mcp-reply-lost, mcp-approval-hold, "
        "mcp-upstream-killed"
    )
    with pytest.raises(CommandError) as refused:
        call_command("drill", "nope")
    assert str(refused.value) == f"no drill 'nope'; the drills are: {every}"
    assert not DrillRun.objects.exists()  # nothing ran, nothing stored


# The drills of operator actions --------------------------------------------------------------------------------------

ROUNDS = 50  # docs/drills.md: 50 rounds of two approvals at once


def action_events(call_id: int) -> list[str]:
    events = AuditEvent.objects.filter(call_id=call_id, action__startswith="action.").order_by("seq")
    return list(events.values_list("action", flat=True))


def replays_after_their_403(stage, rows) -> Counter:
    """How many refund requests the sandbox logged per key after its first (the 403), and with which answers."""
    seen = Counter()
    for row in rows:
        posts = writes(stage, row.key)
        assert posts[0] == ("POST", 403, "error_injected")
        seen[tuple(posts[1:])] += 1
    return seen


@pytest.mark.postgres
def test_two_approvers_at_once_in_fifty_rounds_execute_each_replay_once_with_one_effect(stage):
    result = passed(stage, "two-approvers", rounds=ROUNDS)

    assert len(result.keys) == ROUNDS
    together = next(check for check in result.checks if check.name == "two approvers at once in every round")
    assert together.observed == f"{ROUNDS} of {ROUNDS} rounds" and "in flight together: yes" in together.expected
    refusals = next(check for check in result.checks if check.name == "one approval and one refusal per round")
    assert refusals.observed.startswith(f"{ROUNDS} of {ROUNDS} rounds")
    for row in result.keys:
        assert transitions(row.call_id) == [S.SENT, S.HUMAN_REVIEW, S.SENT, S.COMMITTED]
        (request,) = ActionRequest.objects.filter(call_id=row.call_id)
        assert (request.action, request.status) == ("replay_same_key", ActionStatus.EXECUTED)
        assert request.requested_by.username == DRILL_REVIEWER and request.decided_by.username in DRILL_APPROVERS
        events = action_events(row.call_id)
        assert events.count("action.approved") == events.count("action.executing") == 1
        assert Attempt.objects.filter(call_id=row.call_id).count() == 2
    # The provider's side: after each 403, exactly one replay, answered 200; one effect per key.
    assert replays_after_their_403(stage, result.keys) == {(("POST", 200, "answered"),): ROUNDS}
    effects = stage.sandbox.ledger()["by_key"]
    assert [effects.get(row.key) for row in result.keys] == [1] * ROUNDS


def test_two_approvers_on_any_database_one_approval_one_execution_and_a_wrong_table_fails(stage):
    """On SQLite the approvals of a round run one after the other (and the log says so); on PostgreSQL at once. Then
    the same evidence judged against a table claiming two effects per key, or a call never replayed, fails."""
    lines: list[str] = []
    result = run_drill(stage, "two-approvers", log=lines.append, rounds=3)
    assert result.passed, "\n".join(lines)

    sequential = "SQLite: the two approvals of each round run one after the other" in "\n".join(lines)
    assert sequential == (connection.vendor == "sqlite")
    for row in result.keys:
        assert transitions(row.call_id) == [S.SENT, S.HUMAN_REVIEW, S.SENT, S.COMMITTED]
        assert ActionRequest.objects.get(call_id=row.call_id).status == ActionStatus.EXECUTED
        assert stage.sandbox.ledger(row.key)["effects"] == 1

    claims_two = rejudge(stage, result, replace(DRILLS["two-approvers"], effects=2))
    assert not claims_two.passed
    assert [(row.expected_effects, row.observed_effects, row.passed) for row in claims_two.keys] == [(2, 1, False)] * 3
    never_replayed = rejudge(
        stage, result, replace(DRILLS["two-approvers"], ends=(End(path=(S.SENT, S.HUMAN_REVIEW)),))
    )
    assert not never_replayed.passed and not any(row.passed for row in never_replayed.keys)
    assert never_replayed.keys[0].observed_end == "SENT → HUMAN_REVIEW → SENT → COMMITTED"


@pytest.fixture
def rq_stage(live_server):
    if not settings.REDIS_URL:
        missing_service("needs Redis: run with REDIS_URL=redis://host:6379/0 (the drill kill -9s an RQ worker)")
    with drill_stage(api_url=live_server.url) as stage:
        assert stage.workers is not None
        yield stage
    # The killed worker's job stays STARTED in RQ's registry until its heartbeat lapses (minutes), and the next test
    # database numbers its action requests from 1 again: forget the dead job, so its id is free for that run.
    for request_id in ActionRequest.objects.filter(status=ActionStatus.INTERRUPTED).values_list("pk", flat=True):
        with suppress(NoSuchJobError):
            Job.fetch(f"action-execute-{request_id}", connection=queueing.get_queue().connection).delete()


def test_a_worker_killed_mid_replay_leaves_the_request_interrupted_and_the_call_settled_by_a_receipt(rq_stage):
    stage = rq_stage
    result = passed(stage, "worker-killed-mid-replay")
    (row,) = result.keys

    assert transitions(row.call_id) == [
        S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW, S.SENT, S.UNKNOWN, S.COMMITTED,
    ]  # fmt: skip
    (request,) = ActionRequest.objects.filter(call_id=row.call_id)
    assert request.status == ActionStatus.INTERRUPTED
    assert action_events(row.call_id)[-3:] == ["action.approved", "action.executing", "action.interrupted"]
    swept = AuditEvent.objects.filter(call_id=row.call_id, to_state=S.UNKNOWN).order_by("seq").last()
    assert (swept.from_state, swept.actor_label) == (S.SENT, "job:sweeper")
    receipt = Receipt.objects.filter(call_id=row.call_id, applied=True).latest("id")
    assert (receipt.observed, receipt.local_state_before, receipt.local_state_after) == (
        "committed",
        S.UNKNOWN,
        S.COMMITTED,
    )
    # The provider saw the first request (its reply lost) and one replay, never a second one; one refund.
    assert writes(stage, row.key) == [("POST", None, "dropped_after_commit"), ("POST", 200, "replayed")]
    assert stage.sandbox.ledger(row.key)["effects"] == 1
    assert Attempt.objects.filter(call_id=row.call_id).count() == 2

    # The same evidence against a table that says the call was never swept (replayed straight to COMMITTED) fails.
    wrong = replace(
        DRILLS["worker-killed-mid-replay"],
        ends=(End(path=(S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW, S.SENT, S.COMMITTED)),),
    )
    judged = rejudge(stage, result, wrong)
    assert not judged.passed and not judged.keys[0].passed
    assert all(check.passed for check in judged.checks)  # only the path differs, and that is enough


def test_the_worker_killed_drill_is_skipped_with_the_reason_on_a_stage_without_rq_workers(stage):
    in_process = replace(stage, workers=None)
    lines: list[str] = []
    result = run_drill(in_process, "worker-killed-mid-replay", log=lines.append)

    assert (result.passed, result.keys, result.checks) == (False, [], [])
    assert result.skipped.startswith("needs REDIS_URL: RQ worker processes to kill -9")
    assert lines[-1] == f"  skipped: {result.skipped}"
    assert result_table([result]).splitlines()[-1].endswith("| skipped")


def test_the_command_skips_the_worker_killed_drill_without_redis_and_fails_it_under_require_services(
    transactional_db, settings, monkeypatch
):
    settings.REDIS_URL = None  # the embedded default: in-process jobs, no worker process to kill
    monkeypatch.setattr(drill_command, "REQUIRE_SERVICES", False)
    out = StringIO()
    call_command("drill", "worker killed mid-replay", "--api-workers", "0", stdout=out)

    printed = out.getvalue()
    assert "skipped: needs REDIS_URL" in printed and printed.rstrip().splitlines()[-2].endswith("| skipped")
    assert "0 of 1 drills passed" in printed and "1 skipped (worker killed mid-replay)" in printed
    run = DrillRun.objects.get()
    assert (run.passed, run.results) == (True, [])  # not run: the console lists it under "not run"
    assert run.options["skipped"]["worker killed mid-replay"].startswith("needs REDIS_URL")

    monkeypatch.setattr(drill_command, "REQUIRE_SERVICES", True)
    with pytest.raises(CommandError, match="REQUIRE_SERVICES=1 but needs REDIS_URL"):
        call_command("drill", "worker-killed-mid-replay", "--api-workers", "0", stdout=StringIO())
    assert DrillRun.objects.latest("started_at").passed is False


# The compensation drills ----------------------------------------------------------------------------------------


def test_a_cancellation_whose_reply_is_lost_is_settled_on_its_entry_by_a_receipt_and_never_sent_twice(stage):
    result = passed(stage, "compensation-reply-lost")
    order_row, entry_row = result.keys

    call = Call.objects.get(pk=order_row.call_id)
    assert (entry_row.entry, entry_row.call_id) == (1, call.pk)
    assert transitions(call.pk) == [S.SENT, S.COMMITTED, S.COMPENSATING, S.COMPENSATED]
    (entry,) = CompensationEntry.objects.filter(call=call)
    assert (entry.state, entry.attempts_count, entry.idempotency_key) == ("committed", 1, entry_row.key)
    assert entry.idempotency_key == f"{call.idempotency_key}.compensation-1"  # its own key, derived once
    assert entry_transitions(call.pk) == ["sent", "unknown", "committed"]
    (request,) = ActionRequest.objects.filter(call=call)
    assert (request.action, request.status, entry.requested_by_id) == ("start_compensation", "executed", request.pk)
    assert request.requested_by.username == DRILL_REVIEWER and request.decided_by.username == DRILL_APPROVERS[0]
    (receipt,) = CompensationReceipt.objects.filter(entry=entry)
    assert (receipt.observed, receipt.applied, receipt.state_before, receipt.state_after) == (
        "committed",
        True,
        "unknown",
        "committed",
    )
    # The sandbox's side: the order; one cancel under the entry's key, its reply lost; one cancellation, whose
    # reference the receipt found by that key.
    assert writes(stage, call.idempotency_key) == [("POST", 200, "answered")]
    assert writes(stage, entry.idempotency_key) == [("POST", None, "dropped_after_commit")]
    cancels = stage.sandbox.requests(path_prefix=f"/orders/{call.provider_ref}/cancel")
    assert [(r["method"], r["key"]) for r in cancels] == [("POST", entry.idempotency_key)]
    assert [e["kind"] for e in stage.sandbox.ledger(call.idempotency_key)["entries"]] == ["orders"]
    (cancellation,) = stage.sandbox.ledger(entry.idempotency_key)["entries"]
    assert cancellation["kind"] == "cancellations" and cancellation["provider_ref"] == receipt.provider_ref

    # The same evidence against a table that says the cancel was answered at once, or that it undid nothing, fails.
    drill = DRILLS["compensation-reply-lost"]
    answered = rejudge(
        stage, result, replace(drill, compensation=replace(drill.compensation, path=(E.SENT, E.COMMITTED)))
    )
    assert not answered.passed and [row.passed for row in answered.keys] == [True, False]
    assert answered.keys[1].observed_end == "entry 1: sent → unknown → committed"
    nothing = rejudge(stage, result, replace(drill, compensation=replace(drill.compensation, effects=0)))
    assert not nothing.passed
    assert (nothing.keys[1].expected_effects, nothing.keys[1].observed_effects) == (0, 1)
    assert all(check.passed for check in nothing.checks)  # only the effects differ, and that is enough


def test_a_refused_cancellation_fails_its_entry_and_is_never_sent_again(stage):
    result = passed(stage, "compensation-refused")
    order_row, entry_row = result.keys

    call = Call.objects.get(pk=order_row.call_id)
    assert transitions(call.pk) == [S.SENT, S.COMMITTED, S.COMPENSATING, S.COMPENSATION_FAILED]
    (entry,) = CompensationEntry.objects.filter(call=call)
    assert (entry.state, entry.outcome, entry.attempts_count, entry.checks_made) == ("failed", "refused", 1, 0)
    assert entry_transitions(call.pk) == ["sent", "failed"] and entry_row.key == entry.idempotency_key
    attempt = entry.attempts.get()
    assert (attempt.row, attempt.http_status, attempt.error_code) == ("refusal", 409, "not_cancellable")
    assert not CompensationReceipt.objects.filter(entry=entry).exists()
    (request,) = ActionRequest.objects.filter(call=call)
    assert (request.action, entry.requested_by_id) == ("start_compensation", request.pk)
    # The sandbox's side, after the reconcile schedule ran: one refused cancel, never a status query or a second
    # cancel; the order stands, nothing was cancelled.
    assert writes(stage, entry.idempotency_key) == [("POST", 409, "error_injected")]
    cancels = stage.sandbox.requests(path_prefix=f"/orders/{call.provider_ref}/cancel")
    assert [(r["method"], r["key"], r["status"]) for r in cancels] == [("POST", entry.idempotency_key, 409)]
    assert stage.sandbox.requests(path_prefix=f"/cancellations/by-key/{entry.idempotency_key}") == []
    assert stage.sandbox.ledger(entry.idempotency_key)["effects"] == 0
    assert [e["kind"] for e in stage.sandbox.ledger(call.idempotency_key)["entries"]] == ["orders"]


# The `make run` demo path ------------------------------------------------------------------------------------------


def test_the_demo_leaves_a_refund_reconciliation_could_not_settle_and_its_same_key_replay_makes_one_refund(
    stage, console_people
):
    """What the README's demo walk-through does in the browser, with the same roles: the status-API-down scenario
    leaves a refund in HUMAN_REVIEW at the poll budget (its effect exists at the provider); the reviewer previews
    and requests a same-key replay, the approver approves it, a worker executes it: COMMITTED, one refund."""
    lines: list[str] = []
    [played] = run_scenarios(stage, ["status-api-down"], lines.append)
    assert played.passed, "\n".join(lines)
    call_id, key = played.calls["refund"], played.keys["refund"]
    call = Call.objects.get(pk=call_id)
    assert (call.state, call.outcome, call.checks_made) == (S.HUMAN_REVIEW, "poll_budget_exhausted", 3)
    assert transitions(call_id) == [S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW]
    assert stage.sandbox.ledger(key)["effects"] == 1  # committed before its reply was lost

    reviewer, approver = console_people["reviewer"], console_people["approver"]
    preview = action_preview(call_id=call_id, action="replay_same_key", user=reviewer, actor=Actor.for_user(reviewer))
    assert writes(stage, key) == [("POST", None, "dropped_after_commit")]  # the dry run sent nothing
    (planned,) = preview.plan["requests"]
    assert planned["headers"]["Idempotency-Key"] == key and "sandbox-dev-key" not in str(preview.plan)
    action_request(
        request_id=preview.pk,
        user=reviewer,
        actor=Actor.for_user(reviewer),
        reason="reconciliation could not settle it; the provider deduplicates by key",
        plan_hash=preview.plan_hash,
    )
    action_approve(
        request_id=preview.pk, user=approver, actor=Actor.for_user(approver), reason="same key: at most one refund"
    )
    assert wait(lambda: Call.objects.get(pk=call_id).state == S.COMMITTED, 60)

    # The replay's report commits the call first and the worker marks the request EXECUTED in its next transaction
    # (recovery/services/action_execution.py): wait for that too instead of reading between the two.
    assert wait(lambda: ActionRequest.objects.get(pk=preview.pk).status == ActionStatus.EXECUTED, 10)
    assert transitions(call_id)[-2:] == [S.SENT, S.COMMITTED]
    assert writes(stage, key) == [("POST", None, "dropped_after_commit"), ("POST", 200, "replayed")]
    ledger = stage.sandbox.ledger(key)
    assert ledger["effects"] == 1 and len(ledger["entries"]) == 1


# The saga drills -------------------------------------------------------------------------------------------------


def saga_rows(result) -> dict[str, list]:
    """The drill's key rows by step: the call's row first, then its compensation entries'."""
    rows: dict[str, list] = {}
    for row in result.keys:
        rows.setdefault(row.step, []).append(row)
    return rows


def undo_posts(stage, call: Call) -> list[dict]:
    return stage.sandbox.requests(key=f"{call.idempotency_key}.compensation-1", method="POST")


def test_an_aborted_saga_undoes_the_payment_then_the_order_and_the_task_is_compensated(stage):
    result = passed(stage, "saga-aborted")
    rows = saga_rows(result)
    assert [row.step for row in result.keys] == ["order", "order", "payment", "payment", "shipment"]

    order, payment, shipment = (Call.objects.get(pk=rows[step][0].call_id) for step in ("order", "payment", "shipment"))
    for call in (order, payment):
        assert transitions(call.pk) == [S.SENT, S.COMMITTED, S.COMPENSATING, S.COMPENSATED]
        (entry,) = CompensationEntry.objects.filter(call=call)
        assert (entry.state, entry.attempts_count) == ("committed", 1)
        assert entry_transitions(call.pk) == ["sent", "committed"]
    assert transitions(shipment.pk) == [S.SENT, S.RETRYABLE, S.FAILED_PERMANENT]
    assert not CompensationEntry.objects.filter(call=shipment).exists()
    # The sandbox's own clock: the payment's refund reached it before the order's cancel.
    (refund,), (cancel,) = undo_posts(stage, payment), undo_posts(stage, order)
    assert (refund["path"], cancel["path"]) == ("/refunds", f"/orders/{order.provider_ref}/cancel")
    assert at(refund) < at(cancel)
    assert CompensationEntry.objects.get(call=payment).created_at < CompensationEntry.objects.get(call=order).created_at
    assert [stage.sandbox.ledger(c.idempotency_key)["effects"] for c in (order, payment, shipment)] == [1, 1, 0]
    assert order.task.outcome == "compensated" and order.task.saga == "done"

    # The same evidence against a table that says the order was undone first (its cancel's entry unknown), or that
    # the shipment took effect, fails.
    drill = DRILLS["saga-aborted"]
    steps = {step.step: step for step in drill.steps}
    shipped = replace(drill, steps=(steps["order"], steps["payment"], replace(steps["shipment"], effects=1)))
    judged = rejudge(stage, result, shipped)
    assert not judged.passed and [row.passed for row in judged.keys] == [True, True, True, True, False]
    lost = replace(steps["order"], compensation=replace(steps["order"].compensation, path=(E.SENT, E.UNKNOWN)))
    judged = rejudge(stage, result, replace(drill, steps=(lost, steps["payment"], steps["shipment"])))
    assert not judged.passed and judged.keys[1].observed_end == "entry 1: sent → committed"
    assert all(check.passed for check in judged.checks)  # only the entry's end differs, and that is enough


def test_a_step_unknown_at_the_abort_is_settled_by_a_receipt_then_undone_before_the_order(stage):
    result = passed(stage, "saga-aborted-unknown-step")
    rows = saga_rows(result)

    order, payment, shipment = (Call.objects.get(pk=rows[step][0].call_id) for step in ("order", "payment", "shipment"))
    assert transitions(payment.pk) == [S.SENT, S.UNKNOWN, S.COMMITTED, S.COMPENSATING, S.COMPENSATED]
    assert transitions(order.pk) == [S.SENT, S.COMMITTED, S.COMPENSATING, S.COMPENSATED]
    assert transitions(shipment.pk) == [S.FAILED_PERMANENT]  # refused at admission, abandoned by the abort
    receipt = Receipt.objects.get(call=payment, applied=True)
    (refund,), (cancel,) = undo_posts(stage, payment), undo_posts(stage, order)
    assert payment.task.saga_requested_at < receipt.checked_at < at(refund) < at(cancel)
    assert writes(stage, payment.idempotency_key) == [("POST", None, "dropped_after_commit")]  # never sent again
    assert [stage.sandbox.ledger(c.idempotency_key)["effects"] for c in (order, payment, shipment)] == [1, 1, 0]
    assert order.task.outcome == "compensated"


def test_square_wire_sends_a_form_body_keyed_in_a_field_and_reads_squares_decline_as_a_refusal(stage):
    (row,) = passed(stage, "square-wire").keys

    call = Call.objects.get(pk=row.call_id)
    assert transitions(call.pk) == [S.SENT, S.FAILED_PERMANENT]
    (attempt,) = Attempt.objects.filter(call=call)
    assert (attempt.http_status, attempt.error_code, attempt.failure["row"]) == (402, "CARD_DECLINED", "refusal")
    assert attempt.facts["result"]["errors"][0]["code"] == "CARD_DECLINED"  # Square's shape, as the runtime saw it
    assert writes(stage, call.idempotency_key) == [("POST", 402, "error_injected")]  # the key read from the body
    assert stage.sandbox.ledger(call.idempotency_key)["effects"] == 0

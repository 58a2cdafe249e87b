"""The fault drills of SPEC §18 through the real stack: the live API, a sandbox process, and background jobs (an RQ
worker process on Redis with REDIS_URL, the in-process runner without). Each drill must pass, and each test then
checks the drill's key facts again on its own, from the database and the sandbox, rather than trusting the runner's
verdict; one test proves that a drill whose expectation is not met fails, and the command prints its table, stores
the run and exits non-zero on a mismatch.
"""

from __future__ import annotations

from dataclasses import replace
from io import StringIO
from itertools import pairwise

import pytest
from django.apps import apps as django_apps
from django.core.management import CommandError, call_command, execute_from_command_line
from django.urls import reverse

from recovery.audit import Actor
from recovery.drills import runner
from recovery.drills.runner import run_drill
from recovery.drills.stage import drill_stage
from recovery.drills.table import DRILLS, End
from recovery.models import Attempt, AuditEvent, Breaker, Call, DrillRun, GateDecision, Receipt
from recovery.roles import sync_roles
from recovery.services.users import user_save_with_roles
from recovery.states import CallState as S

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 40  # the command makes 1,000; the suite keeps to a size that runs in seconds


@pytest.fixture
def stage(live_server):
    with drill_stage(api_url=live_server.url) as stage:
        yield stage


def passed(stage, slug: str, **options) -> runner.DrillResult:
    lines: list[str] = []
    result = run_drill(stage, slug, log=lines.append, **options)
    assert result.passed, "\n".join(lines)
    assert result.keys and all(row.passed for row in result.keys)
    assert [check.name for check in result.checks] == list(DRILLS[slug].checks)
    return result


def transitions(call_id: int) -> list[str]:
    events = AuditEvent.objects.filter(call_id=call_id).exclude(from_state="").order_by("seq")
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
    times = [runner._at(r) for r in seen]
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


def test_a_status_api_that_is_down_sends_the_unknown_refund_to_a_person_at_the_poll_budget(stage):
    (row,) = passed(stage, "status-api-down").keys

    call = Call.objects.get(pk=row.call_id)
    assert transitions(call.pk) == [S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW]
    assert (call.checks_made, call.outcome) == (3, "poll_budget_exhausted")
    assert list(Receipt.objects.filter(call=call).values_list("observed", flat=True)) == ["failed"] * 3
    status = [r["status"] for r in stage.sandbox.requests(key=row.key) if r["method"] == "GET"]
    assert status == [503, 503, 503]
    assert writes(stage, row.key) == [("POST", None, "dropped_after_commit")]
    assert stage.sandbox.ledger(row.key)["effects"] == 1


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
    assert "(not run here)       two approvers: needs two approvers acting at once" in listed
    with pytest.raises(CommandError, match="no drill 'nope'; the drills are: refused-before-send, timeout-after-send"):
        call_command("drill", "nope")
    assert not DrillRun.objects.exists()  # nothing ran, nothing stored

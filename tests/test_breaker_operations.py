"""An operator's force open and reset of a tool's breaker (docs/breakers.md, docs/actions.md): a dry run that changes
nothing, a force open on one reviewer's confirmation that admission honours and nothing but a reset lifts, a reset that
needs a second person and applies once, only to the breaker as it was requested — and the console pages that drive them.

Breakers move by the real storage (recovery.services.breakers); admission runs through the real API."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from recovery_client import NotAdmitted

from recovery.audit.chain import Actor, verify_all
from recovery.models import AuditEvent, Breaker, BreakerBucket, BreakerOperation, Tool
from recovery.models.roles import APPROVER, REVIEWER, VIEWER
from recovery.selectors.breakers import breaker_view
from recovery.services.breaker_operations import (
    breaker_approve_reset,
    breaker_force_open,
    breaker_operations_expire_due,
    breaker_preview,
    breaker_reject_reset,
    breaker_request_reset,
)
from recovery.services.breakers import breaker_record, breaker_reserve_probe
from recovery.services.errors import Refusal
from recovery.services.users import user_save_with_roles
from tests.console import HOSTILE_SCRIPT, NO_ROLE, PASSWORD, SIGNED_OUT, page_text, signed_in
from tests.test_concurrency import run_workers
from tests.test_console_task_page import add, make_runtime, open_task

POLICY = {
    "window_s": 60,
    "bucket_s": 10,
    "min_calls": 4,
    "failure_rate": 0.5,
    "cooldown_s": 30,
    "half_open_probes": 1,
    "probe_lease_s": 60,
}


@pytest.fixture
def tool(registry) -> Tool:
    return Tool.objects.create(name="order.search", provider=registry["provider"], side_effect="read", breaker=POLICY)


def ago(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


def record(tool: Tool, failed: bool, at, *, times: int = 1, probe: bool = False):
    for _ in range(times):
        view = breaker_record(tool, counts_as_failure=failed, probe=probe, now=at)
    return view


def open_it(tool: Tool, seconds_ago: float = 0) -> None:
    record(tool, True, ago(seconds_ago), times=POLICY["min_calls"])
    assert Breaker.objects.get(tool=tool).state == "open"


def as_actor(user) -> Actor:
    return Actor.for_user(user)


def force(tool: Tool, user, reason: str = "provider incident INC-42: stop sending") -> BreakerOperation:
    return breaker_force_open(tool_id=tool.pk, user=user, actor=as_actor(user), reason=reason)


def request_reset(tool: Tool, user, reason: str = "the provider says it is fixed") -> BreakerOperation:
    seen = breaker_preview(tool_id=tool.pk, operation="reset").version
    return breaker_request_reset(tool_id=tool.pk, user=user, actor=as_actor(user), reason=reason, seen=seen)


def approve(op: BreakerOperation, user, reason: str = "checked their status page") -> BreakerOperation:
    return breaker_approve_reset(operation_id=op.pk, user=user, actor=as_actor(user), reason=reason)


def events() -> list[str]:
    return list(AuditEvent.objects.order_by("seq").values_list("action", flat=True))


def breaker_events() -> list[str]:
    return [action for action in events() if action.startswith("breaker.")]


def both_roles(username: str = "both"):
    user, _ = user_save_with_roles(
        username=username, roles=[REVIEWER, APPROVER], password=PASSWORD, actor=Actor.system("t")
    )
    return user


def inside(html: str, marker: str, end: str) -> str:
    """The text of the element whose opening tag holds `marker`, up to `end`."""
    return page_text(html.split(marker, 1)[1].split(">", 1)[1].split(end, 1)[0])


def stored() -> tuple:
    """Everything an operation could change: the breaker rows, buckets, operations and the audit trail."""
    return (
        list(Breaker.objects.order_by("pk").values_list("state", "opened_at", "probes_reserved", "updated_at")),
        list(BreakerBucket.objects.order_by("pk").values_list("bucket_start", "successes", "failures")),
        list(BreakerOperation.objects.order_by("pk").values_list("status", flat=True)),
        AuditEvent.objects.count(),
    )


# --- force open --------------------------------------------------------------------------------------------------


@pytest.mark.django_db
class TestForceOpen:
    def test_it_forces_a_breaker_that_never_opened_open_in_one_confirmation(self, people, tool):
        reviewer = people[REVIEWER]
        op = force(tool, reviewer)

        row = Breaker.objects.get(tool=tool)
        assert (row.state, row.probes_reserved) == ("forced_open", 0)
        assert (op.operation, op.status, op.decided_by, op.breaker_state) == ("force_open", "applied", None, "closed")
        (event,) = AuditEvent.objects.filter(action="breaker.forced_open")
        assert (event.from_state, event.to_state, event.actor_label) == ("closed", "forced_open", "user:reviewer")
        assert event.reason == "provider incident INC-42: stop sending" and event.evidence["tool"] == "order.search"
        view = breaker_view(tool, now=timezone.now())
        assert (view.state, view.forced_by, view.forced_reason) == (
            "forced_open",
            "reviewer",
            "provider incident INC-42: stop sending",
        )
        assert verify_all().ok

    def test_a_forced_open_breaker_never_half_opens_by_itself(self, people, tool):
        open_it(tool, seconds_ago=5)
        assert breaker_reserve_probe(tool, now=timezone.now()) is False  # cooling down
        force(tool, people[REVIEWER])
        later = timezone.now() + timedelta(hours=2)  # far past the cooldown and any probe lease

        assert breaker_reserve_probe(tool, now=later) is False
        assert breaker_view(tool, now=later).state == "forced_open"
        assert record(tool, False, later, probe=True).state == "forced_open"  # a probe's success does not close it
        assert record(tool, False, later, times=10).state == "forced_open"  # nor do successes
        assert record(tool, True, later, times=10).state == "forced_open"  # nor do failures reopen it
        row = Breaker.objects.get(tool=tool)
        assert (row.state, row.probes_reserved, row.probe_lease_until) == ("forced_open", 0, None)
        assert breaker_events() == ["breaker.opened", "breaker.forced_open"]

    def test_it_forces_a_half_open_breaker_open_and_drops_its_probe(self, people, tool):
        open_it(tool, seconds_ago=40)
        assert breaker_reserve_probe(tool, now=timezone.now())
        force(tool, people[REVIEWER])
        row = Breaker.objects.get(tool=tool)
        assert (row.state, row.probes_reserved, row.probe_lease_until) == ("forced_open", 0, None)
        # The probe's attempt reports after: an ordinary outcome now, which moves nothing.
        assert record(tool, False, timezone.now(), probe=True).state == "forced_open"

    @pytest.mark.parametrize(
        ("who", "reason", "code", "field"),
        [
            (VIEWER, "stop it", "role", ""),
            (APPROVER, "stop it", "role", ""),
            (REVIEWER, "   ", "reason", "reason"),
            (REVIEWER, "x" * 2001, "reason", "reason"),
        ],
    )
    def test_it_refuses_without_the_reviewer_role_or_a_reason_and_changes_nothing(
        self, people, tool, who, reason, code, field
    ):
        before = stored()
        with pytest.raises(Refusal) as refused:
            force(tool, people[who], reason=reason)
        assert (refused.value.code, refused.value.field) == (code, field)
        assert stored() == before and not Breaker.objects.exists()

    def test_it_refuses_to_force_open_a_breaker_forced_open_already(self, people, tool):
        force(tool, people[REVIEWER])
        with pytest.raises(Refusal) as refused:
            force(tool, people["reviewer2"])
        assert refused.value.code == "not_applicable" and "already forced open" in refused.value.message
        assert BreakerOperation.objects.count() == 1


def test_forced_open_denies_admission_through_the_api_with_its_own_reason(people, db):
    runtime = make_runtime()
    task = open_task(runtime)
    call = add(runtime, task.id, 1, tool="order.lookup")
    lookup = Tool.objects.get(name="order.lookup")
    force(lookup, people[REVIEWER], reason="the provider asked us to stop")

    with pytest.raises(NotAdmitted) as denied:
        runtime.admit(call.call_id, "a1")
    gate = denied.value.gate
    assert (gate["reason"], gate["required_next"]["action"]) == ("breaker_open", "degrade")
    assert gate["required_next"]["detail"]["forced_open"] is True
    (check,) = [c for c in gate["checks"] if c["name"] == "breaker"]
    assert check == {
        "name": "breaker",
        "passed": False,
        "detail": "breaker forced_open by an operator: reviewer, the provider asked us to stop; only an operator's "
        "reset closes it",
    }
    assert runtime.get_call(call.call_id)["state"] == "READY"  # nothing was sent

    approve(request_reset(lookup, people[REVIEWER]), people[APPROVER])
    assert runtime.admit(call.call_id, "a2").call_state == "SENT"


# --- reset ---------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
class TestReset:
    def test_a_reset_closes_the_breaker_and_clears_its_window_and_probes(self, people, tool):
        open_it(tool, seconds_ago=40)
        record(tool, False, ago(1))
        assert breaker_reserve_probe(tool, now=timezone.now())  # half_open, its probe out
        op = request_reset(tool, people[REVIEWER])
        assert (op.status, op.breaker_state, op.decided_by) == ("requested", "half_open", None)
        assert (op.preview["window"]["calls"], op.preview["window"]["failures"]) == (5, 4)
        assert breaker_events() == ["breaker.opened", "breaker.reset_requested"]
        assert Breaker.objects.get(tool=tool).state == "half_open"  # a request changes nothing

        done = approve(op, people[APPROVER])

        assert (done.status, done.decided_by.username, done.decision_reason) == (
            "applied",
            "approver",
            "checked their status page",
        )
        row = Breaker.objects.get(tool=tool)
        assert (row.state, row.opened_at, row.probes_reserved, row.probe_lease_until) == ("closed", None, 0, None)
        assert not BreakerBucket.objects.filter(tool=tool).exists()
        (event,) = AuditEvent.objects.filter(action="breaker.reset")
        assert (event.from_state, event.to_state, event.actor_label) == ("half_open", "closed", "user:approver")
        assert event.evidence["cleared_calls"] == 5 and event.evidence["requested_by"] == "reviewer"
        # Counting starts afresh: one failure after the reset does not reopen it.
        assert record(tool, True, timezone.now()).state == "closed"
        assert verify_all().ok

    def test_it_needs_a_second_person(self, people, tool):
        both = both_roles()
        force(tool, people[REVIEWER])
        op = request_reset(tool, both)
        with pytest.raises(Refusal) as refused:
            approve(op, both)
        assert refused.value.code == "four_eyes"
        with pytest.raises(Refusal) as refused:
            breaker_reject_reset(operation_id=op.pk, user=both, actor=as_actor(both), reason="no")
        assert refused.value.code == "four_eyes"
        with pytest.raises(Refusal) as refused:  # a reviewer is not an approver
            approve(op, people["reviewer2"])
        assert refused.value.code == "role"
        assert Breaker.objects.get(tool=tool).state == "forced_open"
        assert BreakerOperation.objects.get(pk=op.pk).status == "requested"

    def test_the_database_refuses_a_decision_by_the_requester(self, people, tool):
        force(tool, people[REVIEWER])
        op = request_reset(tool, people[REVIEWER])
        with pytest.raises(IntegrityError), transaction.atomic():
            BreakerOperation.objects.filter(pk=op.pk).update(
                status="rejected", decided_by=people[REVIEWER], decided_at=timezone.now()
            )
        with pytest.raises(IntegrityError), transaction.atomic():  # an applied reset names its decider
            BreakerOperation.objects.filter(pk=op.pk).update(status="applied")
        assert BreakerOperation.objects.get(pk=op.pk).status == "requested"

    def test_a_reset_approved_after_the_breaker_moved_is_stale_and_changes_nothing(self, people, tool):
        open_it(tool, seconds_ago=40)  # open, past its cooldown
        op = request_reset(tool, people[REVIEWER])
        # Then it moved: its probe went out and failed, so it reopened — open again, but not the open it was.
        assert breaker_reserve_probe(tool, now=timezone.now())
        assert record(tool, True, timezone.now(), probe=True).state == "open"
        page = signed_in(people, APPROVER).get(f"/operations/breaker-operations/{op.pk}/").content.decode()
        assert "it was open, it is open now, changed since" in inside(page, 'id="moved"', "</p>")
        before = stored()

        with pytest.raises(Refusal) as refused:
            approve(op, people[APPROVER])

        assert refused.value.code == "stale" and "moved since the request" in refused.value.message
        breakers, buckets, _, _ = stored()
        assert (breakers, buckets) == before[:2]  # the breaker and its window untouched
        assert BreakerOperation.objects.get(pk=op.pk).status == "stale"
        assert breaker_events()[-1] == "breaker.reset_stale"
        with pytest.raises(Refusal) as refused:
            approve(op, both_roles("approver2"))
        assert refused.value.code == "not_pending"

    def test_a_reset_closed_by_a_probe_before_its_approval_is_stale(self, people, tool):
        open_it(tool, seconds_ago=40)
        op = request_reset(tool, people[REVIEWER])
        assert breaker_reserve_probe(tool, now=timezone.now())
        assert record(tool, False, timezone.now(), probe=True).state == "closed"
        with pytest.raises(Refusal) as refused:
            approve(op, people[APPROVER])
        assert refused.value.code == "stale" and "it is closed now" in refused.value.message

    def test_a_rejected_reset_leaves_the_breaker_as_it_is(self, people, tool):
        force(tool, people[REVIEWER])
        op = request_reset(tool, people[REVIEWER])
        done = breaker_reject_reset(
            operation_id=op.pk, user=people[APPROVER], actor=as_actor(people[APPROVER]), reason="incident still open"
        )
        assert (done.status, done.decided_by.username, done.decision_reason) == (
            "rejected",
            "approver",
            "incident still open",
        )
        assert Breaker.objects.get(tool=tool).state == "forced_open"
        with pytest.raises(Refusal) as refused:
            approve(op, people[APPROVER])
        assert refused.value.code == "not_pending"

    def test_it_refuses_a_reset_of_a_closed_breaker_one_that_moved_since_the_dry_run_or_a_second_request(
        self, people, tool
    ):
        with pytest.raises(Refusal) as refused:
            request_reset(tool, people[REVIEWER])
        assert refused.value.code == "not_applicable"
        open_it(tool)
        seen = breaker_preview(tool_id=tool.pk, operation="reset").version
        force(tool, people["reviewer2"])  # moves it after the reviewer's dry run
        with pytest.raises(Refusal) as refused:
            breaker_request_reset(
                tool_id=tool.pk, user=people[REVIEWER], actor=as_actor(people[REVIEWER]), reason="r", seen=seen
            )
        assert refused.value.code == "stale"
        request_reset(tool, people[REVIEWER])
        with pytest.raises(Refusal) as refused:
            request_reset(tool, people["reviewer2"])
        assert refused.value.code == "pending" and "requested by reviewer" in refused.value.message
        assert BreakerOperation.objects.filter(operation="reset").count() == 1

    def test_requests_expire(self, people, tool, settings):
        force(tool, people[REVIEWER])
        settings.RECOVERY_ACTION_TTL_S = 60
        op = request_reset(tool, people[REVIEWER])
        assert op.expires_at - op.requested_at == timedelta(seconds=60)
        BreakerOperation.objects.filter(pk=op.pk).update(expires_at=ago(1))
        with pytest.raises(Refusal) as refused:
            approve(op, people[APPROVER])
        assert refused.value.code == "expired"
        assert BreakerOperation.objects.get(pk=op.pk).status == "expired"
        assert Breaker.objects.get(tool=tool).state == "forced_open"
        # The sweep expires the undecided ones; a new request may then be made.
        second = request_reset(tool, people[REVIEWER])
        BreakerOperation.objects.filter(pk=second.pk).update(expires_at=ago(1))
        assert breaker_operations_expire_due() == 1 and breaker_operations_expire_due() == 0
        assert breaker_events().count("breaker.reset_expired") == 2


# --- the dry run -------------------------------------------------------------------------------------------------


def test_the_dry_run_shows_what_it_blocks_and_changes_nothing(people, tool, make_call, task, registry):
    from recovery.models import Task

    other = Task.objects.create(tenant=registry["tenant"], external_id="other-task", agent="demo", goal="g")
    for state in ("READY", "READY", "RETRYABLE", "UNKNOWN", "HUMAN_REVIEW", "COMMITTED", "FAILED_PERMANENT"):
        make_call(state, tool=tool)
    make_call("SENT", tool=tool, on_task=other)
    make_call("READY")  # another tool's
    open_it(tool, seconds_ago=5)
    before = stored()

    with CaptureQueriesContext(connection) as queries:
        shown = breaker_preview(tool_id=tool.pk, operation="force_open")
        reset = breaker_preview(tool_id=tool.pk, operation="reset")

    assert not [q["sql"] for q in queries if not q["sql"].lstrip().upper().startswith("SELECT")]
    assert len(queries) == 8  # four each
    assert stored() == before
    assert shown.calls_by_state == {"READY": 2, "RETRYABLE": 1, "SENT": 1, "UNKNOWN": 1, "HUMAN_REVIEW": 1}
    assert (shown.open_calls, shown.tasks, shown.stored, shown.state, shown.refusal) == (6, 2, "open", "open", "")
    assert (reset.window_calls, reset.window_failures) == (4, 4)


# --- two approvers at once -------------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_approvals_apply_a_reset_once(console_people, tool):
    people = console_people  # the role groups again: an earlier transactional test's flush removed them
    approvers = [people[APPROVER]] + [both_roles(f"approver-{i}") for i in range(3)]
    force(tool, people[REVIEWER])
    op = request_reset(tool, people[REVIEWER])
    results: list[str] = []

    def work(index: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            approve(op, approvers[index], reason=f"approver {index}")
        except Refusal as refused:
            results.append(refused.code)
        else:
            results.append("applied")

    assert run_workers(work, workers=len(approvers)) == []
    assert sorted(results) == ["applied"] + ["not_pending"] * (len(approvers) - 1)
    assert breaker_events().count("breaker.reset") == 1
    assert Breaker.objects.get(tool=tool).state == "closed"
    assert verify_all().ok


# --- the console ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "status"), [(SIGNED_OUT, 302), (NO_ROLE, 403), (VIEWER, 403), (APPROVER, 403), (REVIEWER, 200)]
)
def test_only_reviewers_open_the_dry_run_and_confirm_it(people, tool, who, status):
    client = signed_in(people, who)
    for operation in ("force-open", "reset"):
        assert client.get(f"/operations/breakers/{tool.pk}/{operation}/").status_code == status
    post = client.post(f"/operations/breakers/{tool.pk}/force-open/", {"reason": "stop", "confirm": "on"})
    assert post.status_code == (302 if who in (SIGNED_OUT, REVIEWER) else 403)
    assert Breaker.objects.filter(state="forced_open").exists() == (who == REVIEWER)


def test_the_dry_run_page_shows_the_figures_and_the_form(people, tool, make_call):
    make_call("UNKNOWN", tool=tool)
    make_call("READY", tool=tool)
    open_it(tool, seconds_ago=5)
    response = signed_in(people, REVIEWER).get(f"/operations/breakers/{tool.pk}/force-open/")
    text = page_text(response.content.decode())
    assert "Dry run" in text and "nothing has changed yet" in text
    assert "It blocks 2 open calls in 1 task" in text
    assert "Total 2 calls in 1 task" in text and "4 calls, 4 failed" in text
    assert 'id="operation-form"' in response.content.decode()
    assert "nobody approves it" in text and "for the approver" not in text  # a force open needs no second person
    assert Breaker.objects.get(tool=tool).state == "open"


def test_form_errors_are_shown_next_to_their_fields_and_change_nothing(people, tool):
    client = signed_in(people, REVIEWER)
    before = stored()
    response = client.post(f"/operations/breakers/{tool.pk}/force-open/", {"reason": "  "})
    assert response.status_code == 400
    html = response.content.decode()
    reason_error = html.split('id="id_reason-error"', 1)[1].split("</p>", 1)[0]
    assert "Give a reason" in reason_error
    confirm_error = html.split('id="id_confirm-error"', 1)[1].split("</p>", 1)[0]
    assert "Confirm that you have read" in confirm_error
    too_long = client.post(f"/operations/breakers/{tool.pk}/force-open/", {"reason": "x" * 2001, "confirm": "on"})
    assert too_long.status_code == 400 and "at most 2000 characters" in too_long.content.decode()
    assert stored() == before


def test_the_breakers_page_shows_who_forced_it_open_and_why_escaped(people, tool):
    client = signed_in(people, REVIEWER)
    response = client.post(
        f"/operations/breakers/{tool.pk}/force-open/", {"reason": f"incident {HOSTILE_SCRIPT}", "confirm": "on"}
    )
    assert response.status_code == 302 and response["Location"] == f"/operations/breakers/#tool-{tool.pk}"
    page = client.get(response["Location"])
    html = page.content.decode()
    assert HOSTILE_SCRIPT not in html and "&lt;script&gt;" in html
    cell = inside(html, f'id="operator-{tool.pk}"', "</td>")
    assert cell.startswith("forced open by reviewer") and f"incident {HOSTILE_SCRIPT}" in cell
    assert "Request reset…" in cell and "Force open…" not in cell
    assert "is forced open" in page_text(html)  # the message
    history = inside(html, f'id="history-{tool.pk}"', "</table>")
    assert "breaker.forced_open closed → forced_open" in history and "user:reviewer" in history
    viewer = page_text(signed_in(people, VIEWER).get("/operations/breakers/").content.decode())
    assert "forced open by reviewer" in viewer and "Force open…" not in viewer and "Request reset…" not in viewer


def test_a_reset_goes_from_request_to_approval_in_the_console(people, tool):
    force(tool, people["reviewer2"])
    reviewer, approver = signed_in(people, REVIEWER), signed_in(people, APPROVER)
    dry_run = reviewer.get(f"/operations/breakers/{tool.pk}/reset/")
    seen = dry_run.context["form"]["seen"].value()
    assert "The breaker closes" in page_text(dry_run.content.decode())
    response = reviewer.post(
        f"/operations/breakers/{tool.pk}/reset/", {"reason": "fixed upstream", "confirm": "on", "seen": seen}
    )
    assert response.status_code == 302
    (op,) = BreakerOperation.objects.filter(operation="reset")

    # The requester sees it pending, without the forms; the approver sees the forms, on both pages.
    mine = reviewer.get("/operations/breakers/").content.decode()
    assert f'id="pending-reset-{op.pk}"' in mine and "approve-reason" not in mine
    assert reviewer.post(f"/operations/breaker-operations/{op.pk}/approve/", {"approve-reason": "x"}).status_code == 403
    theirs = approver.get("/operations/breakers/").content.decode()
    pending = inside(theirs, f'id="pending-reset-{op.pk}"', "</div>")
    assert pending.startswith("reset requested by reviewer") and "fixed upstream" in pending
    assert "Approve reset" in pending and "Reject" in pending
    queue = approver.get("/approvals/").content.decode()
    assert f'id="reset-{op.pk}"' in queue and "reset order.search" in page_text(queue)

    empty = approver.post(f"/operations/breaker-operations/{op.pk}/approve/", {"approve-reason": ""})
    assert empty.status_code == 400 and 'id="id_approve-reason-error"' in empty.content.decode()
    assert Breaker.objects.get(tool=tool).state == "forced_open"

    done = approver.post(f"/operations/breaker-operations/{op.pk}/approve/", {"approve-reason": "checked"})
    assert done.status_code == 302
    page = approver.get(done["Location"]).content.decode()
    cell = inside(page, f'id="operator-{tool.pk}"', "</td>")
    assert cell.startswith("reset by approver (requested by reviewer)") and "fixed upstream" in cell
    assert "approved: checked" in cell and "breaker is closed" in page_text(page)
    assert Breaker.objects.get(tool=tool).state == "closed"
    again = approver.post(f"/operations/breaker-operations/{op.pk}/approve/", {"approve-reason": "twice"})
    assert again.status_code == 409 and "nothing more can be done" in page_text(again.content.decode())


def test_the_operation_page_tells_a_requester_who_approves_that_someone_else_decides(people, tool):
    both = both_roles()
    force(tool, people[REVIEWER])
    op = request_reset(tool, both)
    client = signed_in({"both": both}, "both")
    html = client.get(f"/operations/breaker-operations/{op.pk}/").content.decode()
    assert 'id="four-eyes"' in html and 'id="approve-form"' not in html
    assert "What approving would let through now" in page_text(html)
    refused = client.post(f"/operations/breaker-operations/{op.pk}/approve/", {"approve-reason": "mine"})
    assert refused.status_code == 409 and "four eyes" in page_text(refused.content.decode())
    assert Breaker.objects.get(tool=tool).state == "forced_open"


def test_the_call_page_says_who_forced_its_tools_breaker_open_and_why(people, tool, make_call):
    call = make_call("UNKNOWN", tool=tool)
    client = signed_in(people, VIEWER)
    assert "forced-by" not in client.get(f"/calls/{call.pk}/").content.decode()
    force(tool, people[REVIEWER], reason=f"INC-42 {HOSTILE_SCRIPT}")

    response = client.get(f"/calls/{call.pk}/")
    html = response.content.decode()
    assert 'id="forced-by"' in html and HOSTILE_SCRIPT not in html
    text = page_text(html)
    assert "forced_open by reviewer: INC-42" in text and "only an approved reset closes it" in text

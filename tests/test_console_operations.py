"""The operations pages (docs/breakers.md, docs/console.md, docs/drills.md): every breaker's state, window and history
with every tool's retry-path safety, each provider's status-endpoint breaker, and the fault drills' stored runs with
their results and logs.

Breakers are moved by the real storage (recovery.services.breakers, status_breakers) at explicit times; drill runs
are stored in the shape `manage.py drill` stores them (recovery.devtools.drills.results' DrillResult.as_json()).
"""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recovery.devtools.drills.results import CheckRow, DrillResult, KeyRow
from recovery.models import BreakerBucket, DrillRun, Provider, Tool
from recovery.models.roles import ROLES, VIEWER
from recovery.services.breakers import breaker_record, breaker_reserve_probe
from recovery.services.status_breakers import status_breaker_allows, status_breaker_record
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT, NO_ROLE, SIGNED_OUT, signed_in

POLICY = {"window_s": 60, "bucket_s": 10, "min_calls": 4, "failure_rate": 0.5, "cooldown_s": 30}


INLINE = re.compile(r"</?(?:span|a|code|strong|em)\b[^>]*>")


def text(html: str) -> str:
    """The text as a reader sees it: inline tags dropped, other tags a space, entities decoded, spaces collapsed."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", INLINE.sub("", html)))).strip()


def row(body: str, marker: str) -> str:
    """The text of the table row whose opening tag holds `marker` (an id="..." or data-...="...")."""
    return text(body.split(marker, 1)[1].split(">", 1)[1].split("</tr>", 1)[0])


def record(tool: Tool, failed: bool, ago_s: float, times: int = 1):
    for _ in range(times):
        view = breaker_record(
            tool, counts_as_failure=failed, probe=False, now=timezone.now() - timedelta(seconds=ago_s)
        )
    return view


def stored_run(results: list[DrillResult], *, log: str = "", finished: bool = True, ago_s: int = 0) -> DrillRun:
    started = timezone.now() - timedelta(seconds=ago_s + 95)
    run = DrillRun.objects.create(
        drills=[result.name for result in results] or ["timeout after send"],
        started_at=started,
        options={"backlog": 20, "workers": 1, "api_workers": 0, "database": connection.vendor},
        jobs="in-process runner" if finished else "",
    )
    if finished:
        DrillRun.objects.filter(pk=run.pk).update(
            finished_at=started + timedelta(seconds=95),
            passed=bool(results) and all(result.passed for result in results),
            results=[result.as_json() for result in results],
            log=log,
        )
        run.refresh_from_db()
    return run


def drill_result(name: str, *, passed: bool = True, keys: int = 1, failing: int = 0, **extra) -> DrillResult:
    rows = [
        KeyRow(
            key=f"{name.replace(' ', '-')}-key-{i}",
            call_id=1000 + i,
            expected_end="SENT → UNKNOWN → COMMITTED",
            observed_end="SENT → UNKNOWN → STILL_UNKNOWN" if i < failing else "SENT → UNKNOWN → COMMITTED",
            expected_effects=1,
            observed_effects=2 if i < failing else 1,
            passed=i >= failing,
        )
        for i in range(keys)
    ]
    checks = [
        CheckRow(name="settled by a receipt", expected="a committed receipt", observed="1 receipt", passed=True),
        CheckRow(
            name="no second request", expected="1 request", observed="1 request" if passed else "2", passed=passed
        ),
    ]
    fields = {
        "slug": name.replace(" ", "-"),
        "name": name,
        "injected": "refund committed, reply dropped",
        "expected": "SENT → UNKNOWN → COMMITTED; 1 effect per key; 2 checks",
        "observed": "as expected" if passed else "1 key not as expected",
        "passed": passed,
        "seconds": 12.5,
        "keys": rows,
        "checks": checks,
    }
    return DrillResult(**(fields | extra))


# --- who may see them ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", [SIGNED_OUT, NO_ROLE, *ROLES])
def test_every_role_reads_the_operations_pages_and_nobody_else(people, who):
    run = stored_run([drill_result("timeout after send")])
    client = signed_in(people, who)
    for path, status in [
        ("/operations/breakers/", 200),
        ("/operations/drills/", 200),
        (f"/operations/drills/{run.pk}/", 200),
        ("/operations/drills/?before=abc", 400),  # a bad page position: a field error, not a 500
        (f"/operations/drills/{run.pk + 1}/", 404),  # no such run (the permission is checked first)
    ]:
        response = client.get(path)
        if who == SIGNED_OUT:
            assert response.status_code == 302 and response["Location"].startswith("/sign-in/?next=/operations/")
        elif who == NO_ROLE:
            assert response.status_code == 403, path
        else:
            assert response.status_code == status, (who, path)


# --- breakers ------------------------------------------------------------------------------------------------------


def test_it_shows_each_breakers_state_window_and_history(people, registry):
    provider = registry["provider"]
    flapping = Tool.objects.create(name="stock.reserve", provider=provider, side_effect="write", breaker=POLICY)
    busy = Tool.objects.create(
        name="order.search", provider=provider, side_effect="read", breaker=POLICY | {"min_calls": 10}
    )
    quiet = Tool.objects.create(name="price.quote", provider=provider, side_effect="read", breaker=POLICY)

    # stock.reserve opened 5 minutes ago, its probe failed (reopened), then a later probe closed it; then it
    # opened again 20 s ago and is cooling down.
    record(flapping, True, 300, times=4)
    breaker_reserve_probe(flapping, now=timezone.now() - timedelta(seconds=260))
    breaker_record(flapping, counts_as_failure=True, probe=True, now=timezone.now() - timedelta(seconds=259))
    breaker_reserve_probe(flapping, now=timezone.now() - timedelta(seconds=200))
    breaker_record(flapping, counts_as_failure=False, probe=True, now=timezone.now() - timedelta(seconds=199))
    record(flapping, True, 20, times=4)
    # order.search: 3 failures and 2 successes in its window, one failure outside it: below its min_calls.
    record(busy, True, 120)
    record(busy, True, 5, times=3)
    record(busy, False, 5, times=2)

    body = signed_in(people, VIEWER).get("/operations/breakers/").content.decode()
    reserve = row(body, f'id="tool-{flapping.pk}"')
    assert reserve.startswith("stock.reserve payments · write open")
    assert re.search(r"write open 2\d s \(", reserve) and "cooldown ends" in reserve
    assert "4 calls: 4 failed, 0 succeeded" in reserve and "100 % / opens at 50 %" in reserve
    search = row(body, f'id="tool-{busy.pk}"')
    assert "closed" in search and "5 calls: 3 failed, 2 succeeded" in search
    assert "60 % / opens at 50 % below min calls (10)" in search
    assert "window 1 min in 10 s buckets; min 10 calls; cooldown 30 s; 1 probe, lease 1 min" in search
    idle = body.split('id="idle-tools"', 1)[1].split("</p>", 1)[0]  # no calls in its window: folded into one line
    assert "no calls" in text(idle) and f'<a href="/operations/tools/{quiet.pk}/" id="tool-{quiet.pk}"' in idle

    history = body.split(f'id="history-{flapping.pk}"', 1)[1].split("</table>", 1)[0]
    events = re.findall(r"<code>(breaker\.\w+)</code>", history)
    assert events == ["breaker.opened", "breaker.closed", "breaker.reopened", "breaker.opened"]  # newest first
    assert "4 of 4 calls failed in the last 60 s" in text(history)
    assert "the half-open probe failed: a new cooldown starts" in text(history)
    Tool.objects.filter(pk=busy.pk).update(breaker=POLICY)  # an admin lowers min_calls to 4
    search = row(signed_in(people, VIEWER).get("/operations/breakers/").content.decode(), f'id="tool-{busy.pk}"')
    assert "closed" in search and "at its threshold: the next counted failure opens it" in search
    quiet_line = text(body.split('id="quiet-breakers"', 1)[1].split("</p>", 1)[0])
    assert "order.search" in quiet_line and "price.quote" in quiet_line and "stock.reserve" not in quiet_line


def test_an_open_breaker_past_its_cooldown_reads_half_open_and_shows_its_probe(people, registry):
    tool = Tool.objects.create(name="order.search", provider=registry["provider"], side_effect="read", breaker=POLICY)
    record(tool, True, 100, times=4)
    body = signed_in(people, VIEWER).get("/operations/breakers/").content.decode()
    cells = row(body, f'id="tool-{tool.pk}"')
    assert "half_open" in cells and "stored open: the cooldown is over" in cells and "a probe is free" in cells

    assert breaker_reserve_probe(tool, now=timezone.now())
    cells = row(signed_in(people, VIEWER).get("/operations/breakers/").content.decode(), f'id="tool-{tool.pk}"')
    assert "1 of 1 reserved" in cells and "lease until" in cells and "a probe is free" not in cells


def test_it_states_every_tools_retry_path_safety(people, registry):
    provider = registry["provider"]
    refund = registry["refund"]  # a high-risk write, not replay-safe
    Tool.objects.filter(pk=refund.pk).update(
        status_query={"method": "GET", "path": "/refunds/by-key/{idempotency_key}", "status_map": {}},
        budgets={"max_attempts": 3, "write_retry": 1},
        key_retention_s=86_400,
    )
    keyed = Tool.objects.create(
        name="order.create", provider=provider, side_effect="write", replay_safe=True, fallback="order.queue"
    )
    probed = Tool.objects.create(
        name="grant.create", provider=provider, side_effect="write", replay_safe=True, retry_path="unsafe"
    )
    proved = Tool.objects.create(
        name="refund.replica", provider=provider, side_effect="write", replay_safe=True, retry_path="safe",
        retry_path_key_age_s=120,
    )  # fmt: skip
    search = Tool.objects.create(name="order.search", provider=provider, side_effect="read")
    registry["lookup"].alternates.add(search)

    body = signed_in(people, VIEWER).get("/operations/breakers/").content.decode()
    refund_row = row(body, f'id="retry-{refund.pk}"')
    assert "unprobed: not declared replay-safe: only an attempt that provably was not sent is retried" in refund_row
    assert "not safe" not in body  # one vocabulary: safe, unsafe or unprobed
    assert "never swapped to another tool while degraded (high risk)" in refund_row
    assert "status API: GET /refunds/by-key/{idempotency_key}" in refund_row
    assert "3 attempts; 1 write retry" in refund_row and "1 d" in refund_row
    assert "none: a degraded call stops" in refund_row
    assert 'data-safe="no"' in body.split(f'id="retry-{keyed.pk}"', 1)[1][:40]  # no probe has proved it
    assert "unprobed: declared replay-safe by its registry entry, not proved: no duplicate probe has run" in row(
        body, f'id="retry-{keyed.pk}"'
    )
    assert 'data-safe="yes"' in body.split(f'id="retry-{proved.pk}"', 1)[1][:40]
    assert "safe: a duplicate probe saw an idempotent replay with one effect (keys up to 120 s old)" in (
        row(body, f'id="retry-{proved.pk}"')
    )
    assert "order.queue" in row(body, f'id="retry-{keyed.pk}"')
    assert "no status API: an unknown outcome goes to human review" in row(body, f'id="retry-{keyed.pk}"')
    probed_row = row(body, f'id="retry-{probed.pk}"')
    assert "unsafe: a duplicate probe saw the provider ignore the key" in probed_row
    lookup_row = row(body, f'id="retry-{registry["lookup"].pk}"')
    assert "safe: a read: repeating it changes nothing" in lookup_row and "order.search" in lookup_row
    assert "an accepted alternate may replace it" in lookup_row


def test_it_shows_each_providers_status_endpoint_breaker(people, registry):
    quiet = Provider.objects.create(name="shipping", base_url="http://127.0.0.1:9/")
    provider = registry["provider"]
    moment = timezone.now() - timedelta(seconds=40)
    for _ in range(5):
        status_breaker_record(provider, failed=True, now=moment)
    assert status_breaker_allows(provider, now=timezone.now()) == "probe"  # past the 30 s cooldown: one probe

    body = signed_in(people, VIEWER).get("/operations/breakers/").content.decode()
    table = body.split('id="status-breakers-table"', 1)[1].split("</table>", 1)[0]
    payments = text(table.split('<th scope="row">payments</th>', 1)[1].split("</tr>", 1)[0])
    assert payments.startswith("half_open") and "probe out until" in payments
    assert "5 of 5 status queries failed in 60 s" in payments  # its history, from the audit trail
    assert "window 1 min; min 5 checks; opens at 50 %; cooldown 30 s" in payments
    shipping = text(table.split(f'<th scope="row">{quiet.name}</th>', 1)[1].split("</tr>", 1)[0])
    assert shipping.startswith("closed") and "none in 7 days" in shipping


def _tools_with_breakers(registry, start: int, n: int) -> None:
    now = timezone.now()
    for i in range(start, start + n):
        tool = Tool.objects.create(
            name=f"tool-{i:03d}", provider=registry["provider"], side_effect="read", breaker=POLICY
        )
        if i % 2:
            tool.alternates.add(registry["lookup"])
        for seconds in (0, 10, 20):
            breaker_record(tool, counts_as_failure=bool(i % 3), probe=False, now=now - timedelta(seconds=seconds))
        if i % 3:  # every third tool stays closed; the others open, and some of those flap
            record(tool, True, 0, times=4)
    BreakerBucket.objects.create(tool=registry["lookup"], bucket_start=0, successes=1)  # long gone: outside


def test_the_breakers_page_runs_the_same_statements_for_2_or_40_tools(people, registry):
    client = signed_in(people, VIEWER)
    with CaptureQueriesContext(connection) as few:
        assert client.get("/operations/breakers/").status_code == 200
    _tools_with_breakers(registry, 0, 38)
    Provider.objects.create(name="shipping", base_url="http://127.0.0.1:9/")
    for _ in range(5):
        status_breaker_record(registry["provider"], failed=True, now=timezone.now())
    with CaptureQueriesContext(connection) as many:
        response = client.get("/operations/breakers/")
    assert response.status_code == 200 and len(response.context["page"].tools) == 40
    assert len(few) == len(many), (len(few), len(many))
    assert response.content.decode().count("<code>breaker.opened</code>") == 25  # tools 1, 2, 4, 5, ... 37


def test_idle_tools_fold_into_one_line_with_a_link_each(people, registry):
    """Nine tools without a call in their window are one line naming each (a link to its page), not nine rows."""
    idle = [
        Tool.objects.create(name=f"idle-{i}", provider=registry["provider"], side_effect="read", breaker=POLICY)
        for i in range(7)
    ]
    calling = Tool.objects.create(name="busy.read", provider=registry["provider"], side_effect="read", breaker=POLICY)
    record(calling, False, 5, times=3)  # three successes: closed, with calls
    body = signed_in(people, VIEWER).get("/operations/breakers/").content.decode()

    line = body.split('id="idle-tools">', 1)[1].split("</p>", 1)[0]
    names = ["idle-0", "idle-1", "idle-2", "idle-3", "idle-4", "idle-5", "idle-6", "order.lookup", "refund.create"]
    assert text(line) == f"closed 9 tools idle — no calls in the last 1 min: {', '.join(names)}."
    tools = {tool.name: tool.pk for tool in [*idle, registry["lookup"], registry["refund"]]}
    for name in names:
        link = (
            f'<a href="/operations/tools/{tools[name]}/" id="tool-{tools[name]}" data-state="closed" '
            f'data-fact="tool-breaker" data-tool="{name}" data-value="closed">{name}</a>'
        )
        assert link in line, name
    assert "Nothing: every tool breaker is closed" in text(body)  # nothing needs attention: no row for it
    calling_rows = re.findall(r'<tr id="tool-(\d+)"', body.split("<tbody>", 1)[1].split("</table>")[0])
    assert calling_rows == [str(calling.pk)] and body.count('<tr id="tool-') == 1
    assert "3 calls: 0 failed, 3 succeeded" in row(body, f'id="tool-{calling.pk}"')
    assert "0 need attention · 1 closed with calls or a recent operation · 9 idle" in text(body)
    # A viewer reads no operation; a reviewer finds each idle tool's force open under the line.
    assert "Force open an idle tool" not in body
    reviewer = signed_in(people, "reviewer").get("/operations/breakers/").content.decode()
    operations = reviewer.split('class="idle-operations"', 1)[1].split("</details>", 1)[0]
    for name in names:
        assert f'href="/operations/breakers/{tools[name]}/force-open/">Force open…</a>' in operations, name


def test_idle_tools_with_different_windows_say_so(people, registry):
    Tool.objects.filter(pk=registry["refund"].pk).update(breaker=POLICY | {"window_s": 300})
    line = signed_in(people, VIEWER).get("/operations/breakers/").content.decode().split('id="idle-tools">', 1)[1]
    want = "closed 2 tools idle — no calls in their breaker windows: order.lookup, refund.create."
    assert text(line.split("</p>", 1)[0]) == want


def test_breakers_that_need_attention_lead_with_their_badge_and_bar(people, registry):
    provider = registry["provider"]
    failing = Tool.objects.create(name="stock.check", provider=provider, side_effect="read", breaker=POLICY)
    tripped = Tool.objects.create(name="stock.reserve", provider=provider, side_effect="write", breaker=POLICY)
    cooled = Tool.objects.create(name="order.search", provider=provider, side_effect="read", breaker=POLICY)
    record(failing, True, 5)
    record(failing, False, 5, times=3)  # 1 of 4 failed: closed, but failing
    record(tripped, True, 10, times=4)  # open, cooling down
    record(cooled, True, 100, times=4)  # open past its cooldown: reads half_open
    body = signed_in(people, VIEWER).get("/operations/breakers/").content.decode()

    table = body.split('id="breakers"', 1)[1].split("</table>", 1)[0]
    ids = re.findall(r'<tr id="tool-(\d+)" data-state="(\w+)"', table)
    assert ids == [(str(tripped.pk), "open"), (str(cooled.pk), "half_open"), (str(failing.pk), "closed")]
    assert body.index('id="breakers"') < body.index('id="idle-tools"') < body.index('id="history"')
    assert "3 need attention · 0 closed with calls or a recent operation · 2 idle" in text(body)

    opened = body.split(f'id="tool-{tripped.pk}"', 1)[1].split("</tr>", 1)[0]
    assert 'class="breaker badge breaker-open" data-fact="tool-breaker"' in opened and ">open</span>" in opened
    # The bar: full (4 of 4 failed), red (at or above the threshold), the threshold marked at 50 %.
    assert '<span class="rate-bar mark-10" aria-hidden="true"><span class="fill fill-20 over"></span></span>' in opened
    assert f'<a href="/operations/tools/{tripped.pk}/">stock.reserve</a>' in opened
    assert re.search(r'cooldown ends [^<]+ UTC</span> <span class="probe-in">probes in (1\d|20|\d) s</span>', opened)
    half = body.split(f'id="tool-{cooled.pk}"', 1)[1].split("</tr>", 1)[0]
    assert 'class="breaker badge breaker-half_open" data-fact="tool-breaker"' in half
    assert "a probe is free" in text(half)
    warn = body.split(f'id="tool-{failing.pk}"', 1)[1].split("</tr>", 1)[0]
    assert '<span class="rate-bar mark-10" aria-hidden="true"><span class="fill fill-5 some"></span></span>' in warn
    assert "25 % / opens at 50 %" in text(warn) and "4 calls: 1 failed, 3 succeeded" in text(warn)


# --- drills --------------------------------------------------------------------------------------------------------


def test_the_drill_list_shows_runs_newest_first_with_their_verdicts(people, db):
    passed = stored_run([drill_result("timeout after send"), drill_result("rate limit")], ago_s=3000)
    failed = stored_run([drill_result("status API down", passed=False, keys=1, failing=1)], ago_s=2000)
    running = stored_run([], finished=False)

    body = signed_in(people, VIEWER).get("/operations/drills/").content.decode()
    ids = [int(i) for i in re.findall(r'<tr id="run-(\d+)"', body)]
    assert ids == [running.pk, failed.pk, passed.pk]
    first = row(body, f'id="run-{passed.pk}"')
    assert first.startswith(f"Run {passed.pk} passed timeout after send, rate limit")
    assert "1 min 35 s" in first and "in-process runner" in first
    assert f"api_workers 0, backlog 20, database {connection.vendor}, workers 1" in first
    assert row(body, f'id="run-{failed.pk}"').startswith(f"Run {failed.pk} failed status API down")
    assert row(body, f'id="run-{running.pk}"').startswith(f"Run {running.pk} unfinished")
    assert f'href="/operations/drills/{passed.pk}/"' in body


def test_the_drill_list_pages_by_run_and_refuses_a_bad_position(people, db, monkeypatch):
    monkeypatch.setattr("recovery.selectors.operations.RUNS_PER_PAGE", 2)
    runs = [stored_run([drill_result("rate limit")], ago_s=1000 - i) for i in range(5)]
    client = signed_in(people, VIEWER)
    first = client.get("/operations/drills/")
    assert [r["id"] for r in first.context["rows"]] == [runs[4].pk, runs[3].pk]
    second = client.get(first.context["next_url"])
    assert [r["id"] for r in second.context["rows"]] == [runs[2].pk, runs[1].pk]
    last = client.get(second.context["next_url"])
    assert [r["id"] for r in last.context["rows"]] == [runs[0].pk] and not last.context["next_url"]

    for bad in ("abc", "0", "-3", "9" * 30):
        refused = client.get(f"/operations/drills/?before={bad}")
        assert refused.status_code == 400, bad
        assert "Older than run:" in text(refused.content.decode()) and not refused.context["rows"]


def test_a_drill_run_shows_its_result_table_checks_keys_and_log(people, db):
    run = stored_run(
        [
            drill_result("timeout after send"),
            drill_result("queue backlog", passed=False, keys=120, failing=3),
        ],
        log="== timeout after send ==\n  PASS in 12.5 s\n== queue backlog ==\n  FAIL",
    )
    body = signed_in(people, VIEWER).get(f"/operations/drills/{run.pk}/").content.decode()
    page = text(body)
    assert f"Drill run {run.pk}: failed" in page and "1 of 2 passed" in page and "1 min 35 s" in page
    table = body.split('id="result-table"', 1)[1].split("</table>", 1)[0]
    assert [text(r) for r in re.findall(r"<tr data-passed=.*?</tr>", table, re.S)] == [
        "timeout after send SENT → UNKNOWN → COMMITTED; 1 effect per key; 2 checks as expected pass",
        "queue backlog SENT → UNKNOWN → COMMITTED; 1 effect per key; 2 checks 1 key not as expected FAIL",
    ]
    backlog = body.split('<h2 id="drill-2">', 1)[1]
    assert "120 keys, 3 not as expected. The 50 shown are those not as expected first; 70 more are not shown." in (
        text(backlog)
    )
    keys = re.findall(r'<tr data-passed="(yes|no)">\s*<th scope="row"><code>', backlog)
    assert keys[:3] == ["no", "no", "no"] and len(keys) == 50 and set(keys[3:]) == {"yes"}
    assert "SENT → UNKNOWN → STILL_UNKNOWN" in backlog and "MISMATCH" in backlog
    assert 'href="/calls/1000/"' in backlog  # each key links to its call
    assert "no second request 1 request 2 FAILS" in text(backlog)
    log = body.split('<pre class="log" id="run-log" tabindex="0">', 1)[1].split("</pre>", 1)[0]
    assert log == "== timeout after send ==\n  PASS in 12.5 s\n== queue backlog ==\n  FAIL"


def test_an_unfinished_run_says_so(people, db):
    run = stored_run([], finished=False)
    page = text(signed_in(people, VIEWER).get(f"/operations/drills/{run.pk}/").content.decode())
    assert f"Drill run {run.pk}: unfinished" in page and "not finished: still running, or interrupted" in page
    assert "This run stored no result yet." in page and "No log stored." in page


def test_the_drill_pages_run_the_same_statements_for_one_or_many_runs(people, db):
    client = signed_in(people, VIEWER)
    one = stored_run([drill_result("rate limit")])
    with CaptureQueriesContext(connection) as list_few:
        client.get("/operations/drills/")
    with CaptureQueriesContext(connection) as run_few:
        client.get(f"/operations/drills/{one.pk}/")
    for i in range(30):
        stored_run([drill_result("rate limit"), drill_result("queue backlog", keys=200, failing=i % 3)])
    big = stored_run([drill_result(f"drill {i}", keys=300, failing=5) for i in range(8)], log="x\n" * 5000)
    with CaptureQueriesContext(connection) as list_many:
        assert len(client.get("/operations/drills/").context["rows"]) == 32
    with CaptureQueriesContext(connection) as run_many:
        assert client.get(f"/operations/drills/{big.pk}/").status_code == 200
    assert len(list_few) == len(list_many) and len(run_few) == len(run_many)
    assert "results" not in list_many.captured_queries[-1]["sql"].split("FROM")[0]  # the list never reads them


# --- hostile text --------------------------------------------------------------------------------------------------


def test_hostile_names_logs_and_results_are_shown_as_text(people, registry):
    provider = Provider.objects.create(name=HOSTILE_SCRIPT, base_url="http://127.0.0.1:9/")
    tool = Tool.objects.create(name=HOSTILE_IMG, provider=provider, side_effect="read", breaker=POLICY)
    Tool.objects.create(name="safe.read", provider=provider, side_effect="read", fallback=HOSTILE_IMG)
    tool.alternates.add(registry["lookup"])
    record(tool, True, 0, times=4)
    run = stored_run(
        [
            drill_result(
                HOSTILE_SCRIPT,
                passed=False,
                keys=2,
                failing=1,
                observed=HOSTILE_IMG,
                error=HOSTILE_SCRIPT,
                checks=[CheckRow(name=HOSTILE_IMG, expected=HOSTILE_SCRIPT, observed=HOSTILE_IMG, passed=False)],
            )
        ],
        log=f"agent said {HOSTILE_SCRIPT} and {HOSTILE_IMG}\n</pre><b>not bold</b>",
    )
    DrillRun.objects.filter(pk=run.pk).update(jobs=HOSTILE_IMG, options={HOSTILE_SCRIPT: HOSTILE_IMG})
    client = signed_in(people, VIEWER)
    for url in ("/operations/breakers/", "/operations/drills/", f"/operations/drills/{run.pk}/", "/overview/"):
        body = client.get(url).content.decode()
        main = body.split("<main", 1)[1]
        assert HOSTILE_IMG not in main and HOSTILE_SCRIPT not in main and "<b>not bold</b>" not in main, url
        assert "&lt;" in main, url
    detail = client.get(f"/operations/drills/{run.pk}/").content.decode()
    assert "&lt;/pre&gt;&lt;b&gt;not bold&lt;/b&gt;</pre>" in detail  # the log stays inside its <pre>

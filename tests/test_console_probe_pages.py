"""Duplicate probes where a person looks (docs/replay.md, docs/console.md, docs/console.md): on the call page (its own
timeline entry and a panel), on the tool's page (its retry path, why and since when, its latest probes) and on the
breakers page's retry-path row; and receipts of replay reconciliation (docs/replay.md) worded as such.

The probes are plain rows (DuplicateProbe.objects.create): the real probe flow — the replay, the ledger read, the
judgement — is tested in tests/test_probes*.py. The dry run of "Run a duplicate probe" goes through the console's
preview view and the real action services; a retry path's change goes through recovery.services.probes, which
records it in the audit trail.
"""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import ActionRequest, Call, DuplicateProbe, Receipt, RetryPath, Tool
from recovery.models.roles import REVIEWER, ROLES, VIEWER
from recovery.services.probes import set_retry_path
from tests.console import HOSTILE_IMG, HOSTILE_SCRIPT, NO_ROLE, SIGNED_OUT, page_text, signed_in, statements

BASE_URL = "http://127.0.0.1:9/"
SAFE_DETAIL = "an idempotent replay: the same business id, and 1 effect for the key as expected"
UNSAFE_DETAIL = "the provider's ledger holds 2 effects for the key, 1 expected: it ignored the key"


@pytest.fixture
def refunds(registry) -> Tool:
    """The registry's refund tool as a probe needs it: a request template and a status query that reads the
    provider's ledger (its effects field)."""
    tool = registry["refund"]
    tool.request = {"method": "POST", "path": "/refunds"}
    tool.provider_ref_field = "refund_id"
    tool.replay_safe = True
    tool.status_query = {
        "method": "GET",
        "path": "/refunds/by-key/{idempotency_key}",
        "status_map": {"succeeded": "committed", "pending": "pending", "failed": "not_committed"},
        "effects_field": "effects",
    }
    tool.save()
    return tool


def probe(call: Call, *, ago_s: int = 0, action: ActionRequest | None = None, **fields) -> DuplicateProbe:
    values = {
        "call": call,
        "tool": call.tool,
        "action": action,
        "idempotency_key": call.idempotency_key,
        "key_age_s": 5400,
        "provider_base_url": BASE_URL,
        "first": "COMMITTED",
        "second": "idempotent_replay",
        "http_status": 200,
        "first_business_id": "re_881",
        "second_business_id": "re_881",
        "expected_effects": 1,
        "observed_effects": 1,
        "downstream_audit": "one_effect",
        "decision": "retry_path_safe",
        "detail": SAFE_DETAIL,
        "request": {"replay": {"method": "POST", "url": f"{BASE_URL}refunds"}},
        "response": {"replay": {"http_status": 200}},
        "created_at": timezone.now() - timedelta(seconds=ago_s),
    }
    return DuplicateProbe.objects.create(**(values | fields))


def unsafe(call: Call, **fields) -> DuplicateProbe:
    return probe(
        call, second_business_id="re_882", observed_effects=2, downstream_audit="second_effect",
        second="new_business_id", decision="retry_path_unsafe", detail=UNSAFE_DETAIL, **fields,
    )  # fmt: skip


INLINE = re.compile(r"</?(?:span|a|code|strong|em)\b[^>]*>")


def text(html: str) -> str:
    """The text as a reader sees it: inline tags dropped, other tags a space, entities decoded, spaces collapsed."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", INLINE.sub("", html)))).strip()


def _html(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def _section(html: str, heading_id: str) -> str:
    start = html.rindex("<section", 0, html.index(f'id="{heading_id}"'))
    return html[start : html.index("</section>", start)]


def _row(html: str, row_id: str) -> str:
    start = html.index(f'<tr id="{row_id}"')
    return html[start : html.index("</tr>", start)]


def _timeline(html: str) -> list[tuple[str, str]]:
    """The timeline's entries: (kind, the entry's markup)."""
    found = re.findall(r'<li class="kind-(\w+)">(.*?)</li>', _section(html, "timeline-h"), flags=re.S)
    return [(kind, body) for kind, body in found]


# --- the call page ---------------------------------------------------------------------------------------------


def test_a_probe_is_its_own_timeline_entry_with_its_decision_and_its_action_request(people, refunds, make_call):
    call = make_call("COMMITTED", provider_ref="re_881")
    reviewer = signed_in(people, REVIEWER)
    offered = _html(reviewer.get(f"/calls/{call.pk}/"))
    assert 'data-action="probe_duplicate" data-allowed="yes"' in offered  # a committed write on a sandbox tenant
    # Its dry run: the preview page shows both requests the probe would send, and sends nothing.
    answer = reviewer.post(f"/calls/{call.pk}/actions/probe_duplicate/preview/")
    assert answer.status_code == 302, page_text(answer.content.decode())[:1000]
    request = ActionRequest.objects.get(call=call, action="probe_duplicate")
    plan = page_text(_html(reviewer.get(answer["Location"])))
    assert "Run a duplicate probe" in plan
    assert f"1. the replay: this committed call sent again with its original idempotency key POST {BASE_URL}" in plan
    assert "2. the provider's ledger for the key, read after the replay" in plan
    assert f"GET {BASE_URL}refunds/by-key/{call.idempotency_key}" in plan
    assert "Moves the call COMMITTED → no state by itself" in plan
    assert "the second effect is the evidence, on a test tenant" in plan  # the plan's expected effects
    assert not DuplicateProbe.objects.exists()

    safe = probe(call, action=request, ago_s=60)
    bad = unsafe(call)
    html = _html(signed_in(people, VIEWER).get(f"/calls/{call.pk}/"))
    entries = _timeline(html)
    probes = [body for kind, body in entries if kind == "probe"]
    assert len(probes) == 2
    first, second = (page_text(body) for body in probes)
    assert f"duplicate probe #{safe.pk}: idempotent_replay → one_effect → retry_path_safe" in first
    assert "effects observed 1 of 1 expected" in first
    assert f"key {call.idempotency_key}, 5400 s old" in first and f"provider {BASE_URL}" in first
    assert SAFE_DETAIL in first and f"action request #{request.pk}" in first
    assert f'href="/actions/{request.pk}/"' in probes[0]
    assert f"duplicate probe #{bad.pk}: new_business_id → second_effect → retry_path_unsafe" in second
    assert "effects observed 2 of 1 expected" in second and "second business id re_882" in second
    assert "/actions/" not in probes[1]  # no action request: no link
    # A receipt of its own: in time order among the call's other entries, under its own kind.
    times = re.findall(r'<time datetime="([^"]+)">', _section(html, "timeline-h"))
    assert times == sorted(times)
    assert '<span class="kind">duplicate probe</span>' in probes[0]
    # The panel: one row per probe, with its decision.
    panel = _section(html, "probes-h")
    assert 'data-decision="retry_path_safe"' in _row(panel, f"probe-{safe.pk}")
    unsafe_row = page_text(_row(panel, f"probe-{bad.pk}"))
    assert "new_business_id" in unsafe_row and "second_effect" in unsafe_row and "retry_path_unsafe" in unsafe_row
    assert "2 of 1 expected" in unsafe_row and "1 h 30 min old" in unsafe_row
    assert 'href="#probes-h">Duplicate probes (2)' in html


def test_the_call_page_says_the_tools_retry_path_and_has_no_probe_panel_without_probes(people, refunds, make_call):
    call = make_call("COMMITTED", provider_ref="re_881")
    client = signed_in(people, VIEWER)
    html = _html(client.get(f"/calls/{call.pk}/"))
    intent = page_text(_section(html, "intent-h"))
    assert "retry path unprobed (declared replay-safe by its registry entry; no duplicate probe decided it)" in intent
    assert "unsafe" not in intent  # unprobed is neither safe nor unsafe
    assert 'id="probes-h"' not in html and "kind-probe" not in html
    Tool.objects.filter(pk=refunds.pk).update(retry_path=RetryPath.UNSAFE)
    intent = page_text(_section(_html(client.get(f"/calls/{call.pk}/")), "intent-h"))
    assert "retry path unsafe (same-key replays of this tool are refused)" in intent
    assert f'href="/operations/tools/{refunds.pk}/#retry-path-h"' in html


def test_an_idempotent_replay_receipt_is_worded_as_replay_reconciliation(people, refunds, make_call):
    call = make_call("COMMITTED", provider_ref="re_881")
    common = {"call": call, "provider": refunds.provider, "local_state_before": "UNKNOWN"}
    replayed = Receipt.objects.create(
        source="idempotent_replay", observed="committed", provider_ref="re_881", http_status=200,
        local_state_after="COMMITTED", applied=True, **common,
    )  # fmt: skip
    polled = Receipt.objects.create(
        source="poll", observed="unreachable", local_state_after="UNKNOWN",
        checked_at=timezone.now() - timedelta(minutes=1), **common,
    )  # fmt: skip
    html = _html(signed_in(people, VIEWER).get(f"/calls/{call.pk}/"))
    replay_row, poll_row = (page_text(_row(html, f"receipt-{r.pk}")).split(" UTC ", 1)[1] for r in (replayed, polled))
    assert replay_row.startswith("idempotent replay (replay reconciliation) committed")
    assert "idempotent_replay" not in _row(html, f"receipt-{replayed.pk}")
    assert poll_row.startswith("poll unreachable")
    timeline = page_text(_section(html, "timeline-h"))
    assert "idempotent replay (replay reconciliation) receipt: committed" in timeline
    assert "poll receipt: unreachable" in timeline


# --- the tool's page -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", [SIGNED_OUT, NO_ROLE, *ROLES])
def test_every_role_reads_a_tools_page_and_nobody_else(people, refunds, who):
    response = signed_in(people, who).get(f"/operations/tools/{refunds.pk}/")
    if who == SIGNED_OUT:
        assert response.status_code == 302 and response["Location"].startswith("/sign-in/?next=/operations/tools/")
    elif who == NO_ROLE:
        assert response.status_code == 403
    else:
        assert response.status_code == 200
        assert signed_in(people, who).get(f"/operations/tools/{refunds.pk + 100}/").status_code == 404


def test_the_tools_page_shows_its_retry_path_why_and_since_when_and_its_latest_probes(people, refunds, make_call):
    actor = Actor.system("tests")
    calls = [make_call("COMMITTED", provider_ref="re_881") for _ in range(3)]
    safe = probe(calls[0], ago_s=7200)
    set_retry_path(refunds, RetryPath.SAFE, actor=actor, reason=f"probe #{safe.pk}: {SAFE_DETAIL}", probe=safe)
    bad = unsafe(calls[1], ago_s=3600, key_age_s=90)
    set_retry_path(refunds, RetryPath.UNSAFE, actor=actor, reason=f"probe #{bad.pk}: {UNSAFE_DETAIL}", probe=bad)
    unread = probe(
        calls[2], ago_s=60, observed_effects=None, downstream_audit="unreadable", decision="inconclusive",
        detail="the provider's ledger could not be read for the key", http_status=None, second="no_reply",
        second_business_id="",
    )  # fmt: skip

    html = _html(signed_in(people, VIEWER).get(f"/operations/tools/{refunds.pk}/"))
    retry = text(_section(html, "retry-path-h"))
    assert "Now unsafe same-key replays of this tool are refused (retry_path_unsafe)" in retry
    assert f"Decided by duplicate probe #{bad.pk}" in retry
    assert f"Why: probe #{bad.pk}: {UNSAFE_DETAIL}" in retry
    assert f"Provider when decided {BASE_URL}" in retry
    assert "Since " in retry and "UTC" in retry
    assert f"(for example call {unread.call_id})" in retry  # where to turn it back on
    # Its changes, newest first, from the audit trail.
    changes = text(html[html.index('id="retry-path-changes"') :].split("</table>", 1)[0])
    assert changes.index("safe → unsafe") < changes.index("unprobed → safe")
    assert f"probe #{bad.pk}" in changes and f"probe #{safe.pk}" in changes
    # Its probes, newest first, each with its decision, when, key, key age, effects and call.
    probes = _section(html, "probes-h")
    assert re.findall(r'<tr id="probe-(\d+)"', probes) == [str(unread.pk), str(bad.pk), str(safe.pk)]
    row = text(_row(probes, f"probe-{bad.pk}"))
    assert "retry_path_unsafe" in row and UNSAFE_DETAIL in row and "decided the retry path now" in row
    assert "new_business_id → second_effect" in row and "business id re_882 (first re_881)" in row
    assert "2 of 1 expected" in row and calls[1].idempotency_key in row and "1 min old" in row
    assert f'href="/calls/{calls[1].pk}/#probe-{bad.pk}"' in _row(probes, f"probe-{bad.pk}")
    unread_row = text(_row(probes, f"probe-{unread.pk}"))
    assert "inconclusive" in unread_row and "no reply" in unread_row and "? of 1 expected" in unread_row
    assert "1 h 30 min old" in text(_row(probes, f"probe-{safe.pk}"))


def test_a_tool_never_probed_says_so(people, refunds, registry):
    html = _html(signed_in(people, VIEWER).get(f"/operations/tools/{refunds.pk}/"))
    assert 'data-path="unprobed"' in html and "never counted as safe" in page_text(html)
    assert "No duplicate probe of this tool yet" in page_text(html)
    assert "No recorded change" in page_text(html)
    read = _html(signed_in(people, VIEWER).get(f"/operations/tools/{registry['lookup'].pk}/"))
    assert 'data-path="safe"' in read  # one vocabulary: a read's retry path is safe
    assert "a read, repeating it changes nothing; its retry path needs no probe" in page_text(read)


def test_the_breakers_page_shows_each_tools_retry_path_and_latest_probe(people, refunds, registry, make_call):
    call = make_call("COMMITTED", provider_ref="re_881")
    bad = unsafe(call, ago_s=600)
    set_retry_path(
        refunds, RetryPath.UNSAFE, actor=Actor.system("tests"), reason=f"duplicate probe #{bad.pk}: {UNSAFE_DETAIL}",
        probe=bad,
    )  # fmt: skip
    latest = probe(call, decision="inconclusive", downstream_audit="unreadable", observed_effects=None)
    html = _html(signed_in(people, VIEWER).get("/operations/breakers/"))
    row = _row(html, f"retry-{refunds.pk}")
    shown = text(row)
    assert "unsafe: a duplicate probe saw the provider ignore the key" in shown and "since" in shown
    assert f"duplicate probe #{bad.pk}: {UNSAFE_DETAIL}" in shown
    assert "inconclusive" in shown and "idempotent_replay → unreadable, ? of 1 effect" in shown  # the newest probe
    assert f"key {call.idempotency_key}, 1 h 30 min old" in shown
    assert f'href="/calls/{call.pk}/#probe-{latest.pk}"' in row and f'href="/operations/tools/{refunds.pk}/"' in row
    lookup = text(_row(html, f"retry-{registry['lookup'].pk}"))
    assert "a read: none needed" in lookup and "retry path" not in lookup


def test_probe_text_is_shown_as_text(people, refunds, make_call):
    call = make_call("COMMITTED", provider_ref="re_881")
    hostile = probe(call, detail=HOSTILE_SCRIPT, second_business_id=HOSTILE_IMG, decision="retry_path_unsafe")
    set_retry_path(
        refunds, RetryPath.UNSAFE, actor=Actor.system("tests"), reason=HOSTILE_SCRIPT, probe=hostile
    )  # fmt: skip
    for url in (f"/calls/{call.pk}/", f"/operations/tools/{refunds.pk}/", "/operations/breakers/"):
        html = _html(signed_in(people, VIEWER).get(url))
        assert HOSTILE_SCRIPT not in html and HOSTILE_IMG not in html, url
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html, url


# --- cost: a fixed number of statements ------------------------------------------------------------------------


def _probes(calls: list[Call], each: int) -> None:
    DuplicateProbe.objects.bulk_create(
        DuplicateProbe(
            call=call, tool=call.tool, idempotency_key=call.idempotency_key, key_age_s=n, provider_base_url=BASE_URL,
            first="COMMITTED", second="idempotent_replay", http_status=200, observed_effects=1,
            downstream_audit="one_effect", decision="retry_path_safe", detail=SAFE_DETAIL,
            created_at=timezone.now() - timedelta(seconds=n),
        )
        for call in calls
        for n in range(each)
    )  # fmt: skip


def test_the_call_page_runs_the_same_statements_for_1_or_30_probes(people, refunds, make_call):
    few, many = make_call("COMMITTED", provider_ref="a"), make_call("COMMITTED", provider_ref="b")
    _probes([few], 1)
    _probes([many], 30)
    client = signed_in(people, VIEWER)
    client.get(f"/calls/{few.pk}/")  # warm the session and permission caches alike for both
    n_few, _ = statements(client, f"/calls/{few.pk}/")
    n_many, page = statements(client, f"/calls/{many.pk}/")
    assert n_few == n_many, (n_few, n_many)
    assert page.content.decode().count('<li class="kind-probe">') == 30


def test_the_tool_page_runs_the_same_statements_for_1_or_40_probes(people, refunds, make_call):
    client = signed_in(people, VIEWER)
    _probes([make_call("COMMITTED")], 1)
    client.get(f"/operations/tools/{refunds.pk}/")
    n_few, _ = statements(client, f"/operations/tools/{refunds.pk}/")
    _probes([make_call("COMMITTED") for _ in range(4)], 10)
    for _ in range(3):
        set_retry_path(refunds, RetryPath.SAFE, actor=Actor.system("tests"), reason="again", key_age_s=10)
    n_many, page = statements(client, f"/operations/tools/{refunds.pk}/")
    assert n_few == n_many, (n_few, n_many)
    assert n_many <= 9, n_many  # 4 of the page's own (selectors.operations.tool_page), the session's, the layout's
    html = page.content.decode()
    assert html.count('<tr id="probe-') == 20 and "older ones exist" in html


def test_the_breakers_page_reads_every_tools_latest_probe_in_one_statement(people, refunds, registry, make_call):
    client = signed_in(people, VIEWER)
    client.get("/operations/breakers/")
    n_few, _ = statements(client, "/operations/breakers/")
    tools = [
        Tool.objects.create(name=f"grant.create{i}", provider=registry["provider"], side_effect="write")
        for i in range(8)
    ]
    _probes([make_call("COMMITTED", tool=tool) for tool in [refunds, *tools]], 3)
    n_many, page = statements(client, "/operations/breakers/")
    assert n_few == n_many, (n_few, n_many)
    assert page.content.decode().count("all probes</a>") == 9

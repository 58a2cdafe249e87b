"""Every console page, at a desktop width (1440 by 900) and a phone's (390 by 844), in Debian's Chromium (issue 28):

- axe-core (pinned in tests/axe/package-lock.json, `npm ci --prefix tests/axe`) finds no violation of impact
  "serious" or "critical" on it;
- nothing clips its content: the page is no wider than the viewport, no element with `overflow: hidden` or `clip`
  cuts what it holds, and whatever scrolls sideways (a wide table) is a labelled scroll region a keyboard can reach:
  `role="region"`, a name (`aria-label` or `aria-labelledby`) and `tabindex="0"`;
- no word in a table cell is drawn on two lines, the top bar is one line at 1440 px and folded behind Menu at 390 px,
  and on each call page at 1440 by 900 the decision card and the actions' heading end within the first screen (the
  design system of docs/console.md; issue 47);
- no CSP violation and no script error (tests/browser.py's `assert_clean`).

Each page is photographed whole at both widths: var/test-artifacts/browser/pages-1440-<page>.png and
pages-390-<page>.png. A failure lists every page's problems at once, each axe rule with its impact and the elements
it named, so it says what to fix.

The data is made the real way, by the helpers the console's other tests use: an UNKNOWN refund and two in human
review through the services (tests/test_console_call_page.py, tests/test_console_actions.py), a dry run and a
request made through the console's own forms, a frozen bulk, a refused cancellation against the sandbox process
(tests/test_console_compensations.py), an open breaker, a forced-open one with a reset waiting for approval, a
stored drill run, and the metrics folded as the periodic job would. axe is injected with `page.evaluate` (CDP
evaluation is not subject to the page's Content-Security-Policy, which allows only the console's own scripts).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from recovery.audit.chain import Actor
from recovery.models import BulkAction, Tool
from recovery.models.roles import APPROVER, REVIEWER
from recovery.providers.status import StatusAnswer
from recovery.services.breakers import breaker_record
from recovery.services.metrics import metrics_fold
from recovery.services.reconcile import apply_answer
from recovery.services.users import user_save_with_roles
from tests.conftest import missing_service
from tests.console import PASSWORD, signed_in
from tests.test_breaker_operations import force, request_reset
from tests.test_console_actions import in_human_review, load_payments, previewed, requested
from tests.test_console_call_page import unknown_refund
from tests.test_console_compensations import refused_cancel
from tests.test_console_compensations import world as world  # the sandbox registry and a runtime: a fixture
from tests.test_console_operations import drill_result, stored_run

pytestmark = pytest.mark.django_db(transaction=True)

AXE = Path(__file__).resolve().parent / "axe" / "node_modules" / "axe-core" / "axe.min.js"
VIEWPORTS = {1440: {"width": 1440, "height": 900}, 390: {"width": 390, "height": 844}}
SERIOUS = ("serious", "critical")

# axe.run on the whole document; of each violation, what a failure must name.
RUN_AXE = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.map(n => ({target: n.target.join(" "), html: n.html.slice(0, 160)})),
  }));
}"""

# What clips: a page wider than the viewport (with the outermost elements that stick out), an element whose
# overflow-x is hidden or clip and whose content is wider than it, and a sideways scroller that is not a labelled
# scroll region a keyboard can reach (form controls scroll their own text and are left out).
CLIPPED = """() => {
  const name = el => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    (el.classList.length ? "." + [...el.classList].join(".") : "");
  const problems = [];
  const width = window.innerWidth;
  const contained = el => {
    for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
      if (getComputedStyle(up).overflowX !== "visible") return true;
    }
    return false;
  };
  if (document.documentElement.scrollWidth > width) {
    const wide = [...document.querySelectorAll("body *")].filter(
      el => el.getBoundingClientRect().right > width + 1 && !contained(el));
    // (Something absolutely placed inside a scroller whose containing block is outside it still widens the page.)
    const named = wide.length ? wide : [...document.querySelectorAll("body *")].filter(
      el => el.getBoundingClientRect().right > width + 1 && getComputedStyle(el).position === "absolute");
    const outer = named.filter(el => !named.includes(el.parentElement)).slice(0, 12);
    problems.push(`the page is ${document.documentElement.scrollWidth}px wide in a ${width}px viewport: ` +
      outer.map(el => `${name(el)} (right edge ${Math.round(el.getBoundingClientRect().right)}px)`).join(", "));
  }
  for (const el of document.querySelectorAll("body *")) {
    if (el.matches("input, textarea, select") || !el.getClientRects().length) continue;
    if (el.clientWidth <= 1 && el.clientHeight <= 1) continue;  // visually hidden: text for screen readers only
    // Truncated on purpose (docs/console.md, the design system): an id or key whose title holds it whole (and a copy
    // button beside it), and a folded piece of evidence's one-line summary (the whole of it is one click away).
    if (el.matches(".trunc[title]") && el.title === el.textContent) continue;
    if (el.matches("details.json-fold > summary")) continue;
    const overflow = getComputedStyle(el).overflowX;
    if (el.scrollWidth <= el.clientWidth + 1) continue;
    if (overflow === "hidden" || overflow === "clip") {
      problems.push(`${name(el)} clips its content (overflow-x: ${overflow}; ` +
        `${el.scrollWidth}px in ${el.clientWidth}px)`);
    } else if (overflow === "auto" || overflow === "scroll") {
      const labelled = el.getAttribute("aria-label") || el.getAttribute("aria-labelledby");
      if (el.getAttribute("role") !== "region" || !labelled || el.getAttribute("tabindex") !== "0") {
        problems.push(`${name(el)} scrolls sideways (${el.scrollWidth}px in ${el.clientWidth}px) but is not a ` +
          `labelled scroll region (role="region", aria-label, tabindex="0")`);
      }
    }
  }
  return problems;
}"""


# The design system's layout (docs/console.md, "The design system"): no word in a table cell drawn on two lines (each
# word of each shown text node, measured with Range.getClientRects: its boxes' distinct line tops), and the top bar on
# one line at a desktop width, folded behind its Menu button on a phone.
LAYOUT = """(width) => {
  const problems = [];
  for (const cell of document.querySelectorAll("main td, main th")) {
    if (!cell.getClientRects().length) continue;
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const parent = node.parentElement;
      if (!parent.getClientRects().length || parent.closest("pre")) continue;  // folded, or opened JSON evidence
      for (const word of node.data.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const tops = [...range.getClientRects()].filter(r => r.width > 0).map(r => r.top);
        if (tops.length > 1 && Math.max(...tops) - Math.min(...tops) > 2) {
          problems.push(`the word "${word[0].slice(0, 60)}" breaks across lines in a table cell ` +
            `(${cell.closest("table").id || cell.closest("table").className})`);
        }
      }
    }
  }
  const top = document.getElementById("top");
  const nav = document.getElementById("console-nav");
  if (top && nav) {
    const height = Math.round(top.getBoundingClientRect().height);
    if (width >= 1440 && height > 56) problems.push(`the top bar is ${height}px tall: more than one line`);
    if (width <= 390 && nav.getClientRects().length) problems.push("the navigation is not folded behind Menu");
  }
  return problems;
}"""

# Dense tables keep their header in sight: a table in a region that scrolls (sideways, so the region is the scroll
# container its header sticks in) scrolls down within the region too, its header row staying at the region's top.
STICKY = """() => {
  const out = {checked: 0, problems: []};
  for (const region of document.querySelectorAll("main .scroll")) {
    const head = region.querySelector("thead th");
    if (!head || !region.getClientRects().length || region.scrollHeight <= region.clientHeight + 1) continue;
    region.scrollTop = region.scrollHeight;
    const drift = Math.round(head.getBoundingClientRect().top - region.getBoundingClientRect().top);
    region.scrollTop = 0;
    out.checked += 1;
    if (Math.abs(drift) > 2) out.problems.push(`the header of ${region.getAttribute("aria-label") ||
      region.getAttribute("aria-labelledby")} scrolls away with its rows (${drift}px below the region's top)`);
  }
  return out;
}"""

# The call page answers what the call is, what happened and what can be done within the first screen at 1440 by 900:
# the head (state, tool, key), the decision card and the actions' heading are drawn above the fold.
FIRST_SCREEN = """() => {
  window.scrollTo(0, 0);
  const placed = {};
  for (const id of ["decision", "actions-h", "latest-card-fields"]) {
    const el = document.getElementById(id);
    placed[id] = el ? Math.round(el.getBoundingClientRect().bottom) : null;
  }
  return placed;
}"""


@pytest.fixture(scope="module")
def axe_source() -> str:
    if not AXE.exists():
        missing_service("needs axe-core: npm ci --prefix tests/axe")
    return AXE.read_text()


@pytest.fixture
def pages(world, console_people, monkeypatch) -> dict[str, tuple[str, int]]:
    """Every page a person with the reviewer and approver roles can open, by name: (path, expected status)."""
    people = console_people
    both = {"roles": [REVIEWER, APPROVER], "password": PASSWORD, "actor": Actor.system("tests")}
    people["both"], _ = user_save_with_roles(username="both", **both)
    compensation = refused_cancel(world)  # the sandbox registry's order.create, its cancellation refused
    load_payments(monkeypatch)  # then the console tests' refund registry (refund.create on "payments")

    unknown = [unknown_refund() for _ in range(3)]
    answer = StatusAnswer(observed="pending", provider_status="pending", http_status=200)
    apply_answer(unknown[0].pk, answer, worker="tests-worker")
    waiting, asked = in_human_review(), in_human_review()
    preview = previewed(people, waiting, "replay_same_key", who="both")
    request = requested(people, asked, "replay_same_key", reason="the provider keeps the key for 24 h: replay it")
    reviewer = signed_in(people, REVIEWER)
    frozen = reviewer.post(
        "/queues/unknown/bulk/", {"action": "escalate", "selection": "rows", "call": [c.pk for c in unknown[1:]]}
    )
    assert frozen.status_code == 302, frozen.status_code
    bulk = BulkAction.objects.get()
    assert reviewer.post(
        f"/bulk/{bulk.pk}/request/", {"reason": "the status API is down", "selection_hash": bulk.selection_hash}
    ).status_code == 302  # fmt: skip

    refund, lookup = Tool.objects.get(name="refund.create"), Tool.objects.get(name="order.lookup")
    for _ in range(12):
        breaker_record(refund, counts_as_failure=True, probe=False, now=timezone.now() - timedelta(minutes=4))
    force(lookup, people[REVIEWER])
    reset = request_reset(lookup, people[REVIEWER])
    run = stored_run(
        [drill_result("timeout after send"), drill_result("status API down", passed=False, keys=3, failing=1)],
        log="== status API down ==\n  provider answered 503\n  FAIL in 12.5 s",
    )
    metrics_fold()
    delivery_with_tries()
    return {
        "overview": ("/overview/", 200),
        "metrics": ("/overview/metrics/", 200),
        "queue-unknown": ("/queues/unknown/", 200),
        "queue-human-review": ("/queues/human-review/", 200),
        "queue-compensation-problems": ("/queues/compensation-problems/", 200),
        "queue-calls": ("/queues/calls/", 200),
        "call": (f"/calls/{asked.pk}/", 200),
        "call-unknown": (f"/calls/{unknown[0].pk}/", 200),
        "call-human-review": (f"/calls/{waiting.pk}/", 200),
        "call-compensation": (f"/calls/{compensation.pk}/", 200),
        "task": (f"/tasks/{unknown[0].task_id}/", 200),
        "action-preview": (f"/actions/{preview.pk}/", 200),
        "action-request": (f"/actions/{request.pk}/", 200),
        "approvals": ("/approvals/", 200),
        "bulk": (f"/bulk/{bulk.pk}/", 200),
        "audit": ("/audit/", 200),
        "breakers": ("/operations/breakers/", 200),
        "breaker-dry-run": (f"/operations/breakers/{refund.pk}/force-open/", 200),
        "breaker-operation": (f"/operations/breaker-operations/{reset.pk}/", 200),
        "tool": (f"/operations/tools/{refund.pk}/", 200),
        "drills": ("/operations/drills/", 200),
        "drill": (f"/operations/drills/{run.pk}/", 200),
        "notifications": ("/notifications/", 200),
        "404": ("/no-such-page/", 404),
    }


def delivery_with_tries() -> None:
    """The delivery log's page needs a delivery retried, with a receiver's long answer (docs/notifications.md)."""
    from recovery.models import DeliveryAttempt, NotificationChannel, NotificationDelivery, NotificationRule

    channel = NotificationChannel.objects.create(name="oncall-hook", kind="webhook", url="https://hooks.example.com/x")
    rule = NotificationRule.objects.create(name="reviews-to-oncall", channel=channel, events=["human_review"])
    now = timezone.now()
    delivery = NotificationDelivery.objects.create(rule=rule, window_start=now, due_at=now, next_try_at=now)
    DeliveryAttempt.objects.create(
        delivery=delivery, number=1, outcome="failed", status_code=500, reason="HTTP 500", answer="x" * 300
    )


STICKY_CHECKED: dict[int, int] = {}  # per width, the scrolling regions whose header was checked


def problems_on(console, width: int, name: str, axe_source: str) -> list[str]:
    """What axe and the clipping check find on the page now open, and its screenshot."""
    page = console.page
    page.evaluate(axe_source)
    found = [
        f"{name} at {width}px: axe {v['id']} ({v['impact']}): {v['help']}\n"
        + "\n".join(f"      {n['target']}  {n['html']}" for n in v["nodes"][:6])
        for v in page.evaluate(RUN_AXE)
        if v["impact"] in SERIOUS
    ]
    found += [f"{name} at {width}px: {problem}" for problem in page.evaluate(CLIPPED)]
    found += [f"{name} at {width}px: {problem}" for problem in page.evaluate(LAYOUT, width)]
    sticky = page.evaluate(STICKY)
    STICKY_CHECKED[width] = STICKY_CHECKED.get(width, 0) + sticky["checked"]
    found += [f"{name} at {width}px: {problem}" for problem in sticky["problems"]]
    if width == 1440 and name.startswith("call"):
        placed = page.evaluate(FIRST_SCREEN)
        found += [
            f"{name} at {width}px: #{id} ends at {bottom}px, below the first screen (900px)"
            for id, bottom in placed.items()
            if id != "latest-card-fields" and (bottom is None or bottom > VIEWPORTS[width]["height"])
        ]
        fields = placed["latest-card-fields"]
        if fields is not None and fields > VIEWPORTS[width]["height"]:
            found.append(f"{name} at {width}px: the decision card's fields end at {fields}px, below the first screen")
    console.shot(f"pages-{width}-{name}")
    return found


@pytest.mark.parametrize("width", sorted(VIEWPORTS, reverse=True))
def test_every_page_passes_axe_and_clips_nothing(width, pages, open_console, axe_source):
    problems: list[str] = []

    # Signed out: sign-in; then a viewer opening Approvals gets the 403.
    viewer = open_console()
    viewer.page.set_viewport_size(VIEWPORTS[width])
    viewer.page.goto("/sign-in/")
    problems += problems_on(viewer, width, "sign-in", axe_source)
    viewer.sign_in("viewer", start="/approvals/")
    assert viewer.page.get_by_role("heading", level=1).inner_text().startswith("Not allowed")
    problems += problems_on(viewer, width, "403", axe_source)
    viewer.assert_clean()
    # The API docs (django-ninja's Swagger UI, not the console's markup: no axe here) fit a phone's screen too: a
    # mobile context, where a page without a viewport meta is laid out 980 px wide.
    phone = viewer.context.browser.new_context(base_url=viewer.base_url, viewport=VIEWPORTS[width], is_mobile=True)
    docs = phone.new_page()
    docs.goto("/api/v1/docs")
    docs.locator("#swagger-ui .opblock").first.wait_for()
    wide, seen = docs.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    if max(wide, seen) > width:
        problems.append(f"api-docs at {width}px: laid out {seen}px wide, content {wide}px")
    phone.close()

    # A person with the reviewer and approver roles: every other page, with its forms.
    both = open_console()
    page = both.page
    page.set_viewport_size(VIEWPORTS[width])
    both.sign_in("both", start="/overview/")
    for name, (path, status) in pages.items():
        response = page.goto(path)
        assert response.status == status, (name, path, response.status)
        problems += problems_on(both, width, name, axe_source)

    # A dry run refused (no evidence to mark a call committed) is drawn at the preview's own URL, which only posts.
    page.goto(pages["call-human-review"][0])
    with page.expect_navigation():
        page.locator("#action-mark_committed").get_by_role("button").click()
    assert page.url.endswith("/actions/mark_committed/preview/")
    assert page.locator("#evidence-form").is_visible()
    problems += problems_on(both, width, "action-preview-refused", axe_source)
    both.assert_clean()

    assert not problems, f"{len(problems)} problems at {width}px:\n" + "\n".join(problems)
    assert STICKY_CHECKED.get(width, 0) > 0, "no page had a table long enough to check that its header sticks"

"""A queue row (docs/console.md): what its cells show, computed once per row, and its markup.

The row's markup is written here, not in the template: the queue page draws 50 rows every 5 s for every reviewer,
and the template engine's per-variable lookups were two thirds of the page's server time (docs/benchmarks.md, "The
queue benchmark"). Every value is escaped once, by `decorate`, before it is written.
"""

from __future__ import annotations

from html import escape

from django.utils.safestring import SafeString

from console.templatetags.design_tags import copy_button, tone
from console.views.common import age_text, due_text, url_pattern
from recovery.engine.states import CallState
from recovery.models import Call, IdentitySource
from recovery.selectors.assignments import assignees
from recovery.selectors.facts import row_facts
from recovery.selectors.observed import admission_answers
from recovery.selectors.queues import Queue
from recovery.selectors.waiting import asked_for, why_waiting

OBSERVED_TITLE = "reported after the fact from OpenTelemetry spans"


def decorate(
    rows: list, now, user, can_review: bool, *, tools: dict[int, str], tenants: dict[int, str], queue: Queue
) -> None:
    """What each row's cells show, computed once in Python: its link, its tool's and tenant's names, its age, its last
    receipt's age, whether it is held, the claim button the user gets (claim if free, release if theirs, none if a
    colleague holds it) and, in the compensation problems queue, its latest entry. The claim buttons name the queue,
    so the row drawn again after a claim has the same cells. Then its markup, as `row["html"]`."""
    open_url, claim_url, release_url, task_url = (
        url_pattern(name) for name in ("console:call", "console:claim", "console:release", "console:task")
    )
    if queue.compensation:
        claim_url, release_url = (f"{url}?queue={queue.slug}" for url in (claim_url, release_url))
    answers = admission_answers(row["id"] for row in rows if row["observed"])  # one statement, if any is observed
    asked = asked_for(row["id"] for row in rows if row["state"] == CallState.HUMAN_REVIEW)  # one, if any
    owners = assignees(row["id"] for row in rows)  # one, if any row
    assign_url = url_pattern("console:assign")
    for row in rows:
        pk = row["id"]
        row["open_url"] = open_url.format(pk)
        row["task_url"] = task_url.format(row["task_id"])
        row["tool_name"], row["tenant_name"] = tools.get(row["tool_id"], ""), tenants.get(row["tenant_id"], "")
        row["age"] = age_text(now - row["state_changed_at"])
        row["since"] = f"{row['state_changed_at']:%Y-%m-%d %H:%M:%S} UTC"
        row["receipt_age"] = age_text(now - row["last_receipt_at"]) if row["last_receipt_at"] else ""
        row["held"] = held = Call.claim_live(row["claimed_by_id"], row["claim_until"], now)
        row["fact"] = row_facts(row).values  # the data-value of its state and last receipt, as every page's
        row["entry"] = entry_text(row) if queue.compensation else ""
        row["why"] = row["entry"] or why_waiting(row["state"], row["outcome"], row["checks_made"], asked.get(pk, ""))
        answer = answers.get(pk)
        row["admission"] = answer.text if answer else ""
        row["button"] = row["button_url"] = row["button_label"] = ""
        row["due"], row["overdue"] = due_text(row["state"], row["risk"], row["state_changed_at"], now, held=held)
        row["mcp_server"], row["mcp_text"] = mcp_text(row.get("mcp"))
        row["assignee"] = owners.get(pk, "")
        row["assign_url"] = assign_url.format(pk) if can_review and row["assignee"] != user.get_username() else ""
        if can_review and not held:
            row["button"], row["button_label"], row["button_url"] = "claim", "Claim", claim_url.format(pk)
        elif can_review and row["claimed_by_id"] == user.pk:
            row["button"], row["button_label"], row["button_url"] = "release", "Release", release_url.format(pk)
        _escape(row)
        row["html"] = row_html(row, can_review=can_review)


def mcp_text(origin: list | None) -> tuple[str, str]:
    """A call through the MCP gateway: its server, and who sent it (the client's name and version) and how its task
    was chosen; ("", "") for any other call."""
    if not origin:
        return "", ""
    server, name, version, source = origin
    client = f"{name} {version}".strip() or "an unnamed client"
    return server, f"{client}; task by {IdentitySource(source).label}"


def entry_text(row: dict) -> str:
    """Why a compensation problem is listed: its latest entry's number and state (and how it ended)."""
    if row.get("entry_number") is None:
        return "no entry"
    outcome = f" ({row['entry_outcome']})" if row.get("entry_outcome") else ""
    return f"compensation {row['entry_number']}: {row['entry_state']}{outcome}"


# What a row shows as text (agents' and providers' text among it: external ids, names, statuses).
_SHOWN = (
    "id", "open_url", "task_url", "task_external_id", "task_id", "step_index", "tool_name", "tenant_name", "risk",
    "state", "since", "age", "checks_made", "receipt_age", "last_receipt_status", "holder", "button", "button_url",
    "button_label", "entry", "admission", "why", "idempotency_key", "due", "assignee", "assign_url", "mcp_server",
    "mcp_text",
)  # fmt: skip


def _escape(row: dict) -> None:
    """Each shown value escaped once (html.escape: the template engine's five replacements) and marked safe."""
    for name in _SHOWN:
        value = row[name]
        if value is not None:
            row[name] = SafeString(escape(value if isinstance(value, str) else str(value)))
    row["fact"] = {name: escape(value) for name, value in row["fact"].items()}


def row_html(row: dict, *, can_review: bool, notice: str = "", notice_error: bool = False) -> SafeString:
    """The row's `<tr>`, from a decorated row (every value already escaped)."""
    pk, fact = row["id"], row["fact"]
    pick = (
        f'<td class="pick"><input type="checkbox" name="call" value="{pk}" form="bulk" '
        f'aria-label="Select call {pk}"></td>'
        if can_review
        else ""
    )
    observed = ""
    if row["observed"]:
        title = row["admission"] or OBSERVED_TITLE
        observed = f' <span class="observed-mark" title="{title}">observed (from traces)</span>'
    if row["mcp_server"]:
        observed += (
            f' <span class="mcp-mark" data-fact="mcp" data-value="{row["mcp_server"]}">MCP {row["mcp_server"]}</span>'
            f' <span class="muted mcp-client">{row["mcp_text"]}</span>'
        )
    why = row["why"] or f'<span class="muted">not waiting ({row["state"]})</span>'
    entry = f' <span class="muted entry">{row["entry"]}</span>' if row["entry"] else ""
    receipt = (
        f'{row["last_receipt_status"] or "—"} <span class="muted">{row["receipt_age"]} ago</span>'
        if row["receipt_age"]
        else '<span class="muted">none</span>'
    )
    claimed = ' class="claimed"' if row["held"] else ""
    key = row["idempotency_key"]  # one line, truncated: the whole key on hover and by its copy button
    return SafeString(
        f'<tr id="call-{pk}" data-id="{pk}" data-call="{pk}" tabindex="-1"{claimed}>'
        f"{pick}"
        f'<td><a class="open" href="{row["open_url"]}">call {pk}</a><br><span class="muted">task '
        f'<span class="trunc" title="{row["task_external_id"]}"><a class="task-name" href="{row["task_url"]}">'
        f"{row['task_external_id']}</a></span> #{row['task_id']}</span></td>"
        f'<td class="why" data-fact="waits" data-value="{"yes" if row["why"] else "no"}">{why}</td>'
        f'<td class="nowrap"><span class="trunc" title="{key}"><code class="key">{key}</code></span>'
        f"{copy_button(key, 'key')}</td>"
        f'<td>{row["step_index"]}</td><td class="nowrap">{row["tool_name"]}{observed}</td><td>{row["tenant_name"]}</td>'
        f'<td><span class="risk badge-mark tone-{tone(row["risk"])} risk-{row["risk"]}">{row["risk"]}</span></td>'
        f'<td><span class="state badge-mark tone-{tone(row["state"])} state-{str(row["state"]).lower()}" '
        f'data-fact="state" data-value="{fact["state"]}">{row["state"]}</span>{entry}</td>'
        f'<td title="in this state since {row["since"]}">{row["age"]}{_due_mark(row)}</td><td>{row["checks_made"]}</td>'
        f'<td data-fact="last-receipt" data-value="{fact["last_receipt"]}">{receipt}</td>'
        f'<td class="claim">{_claim_cell(row, notice, notice_error)}</td>'
        "</tr>"
    )


def _claim_cell(row: dict, notice: str, notice_error: bool) -> str:
    """Who holds the call, the user's claim or release button, and the notice of a claim just made."""
    cell = f'<span class="holder">{row["holder"]}</span>' if row["held"] else ""
    if row["button"]:
        url = row["button_url"]
        cell += (
            f'<button type="submit" form="claims" formaction="{url}" hx-post="{url}" hx-target="closest tr" '
            f'hx-swap="outerHTML" class="claim-button" data-action="{row["button"]}">{row["button_label"]}</button>'
        )
    elif not row["held"]:
        cell += '<span class="muted">—</span>'
    if row["assignee"]:
        cell += f'<span class="assignee">assigned to {row["assignee"]}</span>'
    if row["assign_url"]:
        url = row["assign_url"]
        cell += (
            f'<button type="submit" form="claims" formaction="{url}" hx-post="{url}" hx-vals=\'{{"assignee": "me"}}\' '
            'hx-target="closest tr" hx-swap="outerHTML" class="assign-me">Assign to me</button>'
        )
    if notice:
        cell += f'<p class="notice{" error" if notice_error else ""}" role="status">{escape(notice)}</p>'
    return cell


def _due_mark(row: dict) -> str:
    """When the item is due (for its first claim or its resolution, docs/notifications.md) and whether it is late."""
    if not row["due"]:
        return ""
    late = row["overdue"]
    return (
        f'<br><span class="due{" overdue" if late else ""}" data-fact="due" '
        f'data-value="{"overdue" if late else "due"}">{row["due"]}</span>'
    )

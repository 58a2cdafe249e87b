"""The call page (docs/console.md, "The call page"): everything a reviewer needs to decide an UNKNOWN item.
Diagnostics are loaded only for `recovery.view_diagnostic`; each allowed action is a Preview (a dry run), never an
execution. The status block refreshes, but the evidence never changes under the reader.
"""

from __future__ import annotations

import json
from datetime import timedelta

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ObjectDoesNotExist
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.views.actions import EVIDENCE_ACTIONS, LABELS, EvidenceForm
from console.views.common import DIAGNOSTIC, REVIEW, VIEW, age_text, by_reason, due_text, render_page, requires
from recovery.engine.actions import recommended
from recovery.engine.reconcile import Observation
from recovery.models import Call
from recovery.models import Decision as DecisionRow
from recovery.selectors.approvals import OPEN
from recovery.selectors.assignments import reviewer_names
from recovery.selectors.call_page import CallPage, CallStatus, call_page, call_status
from recovery.selectors.facts import retry_path_of, shown_facts
from recovery.selectors.observed import admission_of, call_spans
from recovery.selectors.waiting import required_action
from recovery.services.action_plans import call_facts, options_for

REFRESH_S = 5


class SeenForm(forms.Form):
    """What the page showed when it was drawn (its live refresh sends it back): the call's version and checks."""

    version = forms.IntegerField(required=False, min_value=0, max_value=2**31 - 1)
    checks = forms.IntegerField(required=False, min_value=0, max_value=2**31 - 1)


@require_GET
@login_required
@requires(VIEW)
def call(request: HttpRequest, call_id: int) -> HttpResponse:
    now = timezone.now()
    seen = SeenForm(request.GET)
    valid = seen.is_valid()
    seen_values = seen.cleaned_data if valid else {}
    if request.htmx:
        status = call_status(call_id, now=now)
        if status is None:
            raise Http404("No such call.")
        context = _status_context(request, status, seen_values, now) | {"seen_form": seen}
        return render_page(request, "console/call.html", context, partial="live", status=200 if valid else 400)
    readable = request.user.has_perm(DIAGNOSTIC)
    page = call_page(call_id, diagnostics_readable=readable, now=now)
    if page is None:
        raise Http404("No such call.")
    context = (
        _status_context(request, page.status, seen_values, now)
        | _page_context(request, page, now)
        | {"seen_form": seen}
    )
    return render_page(request, "console/call.html", context, status=200 if valid else 400)


def _page_context(request: HttpRequest, page: CallPage, now) -> dict:
    """The page below the live block: what may be done now, the decisions, attempts and receipts."""
    current = page.call
    diagnostic_refs = {d.pk: d.ref for d in page.diagnostics}
    numbers = {a.pk: a.number for a in page.attempts}
    latest = page.latest_decision
    return _actions_context(request, page, now) | {
        "reviewers": reviewer_names() if request.user.has_perm(REVIEW) else [],
        "page": page,
        "task": current.task,
        "action_requests": [
            {"req": r, "label": LABELS.get(r.action, r.action), "stale": _stale(r, current)}
            for r in page.action_requests
        ],
        "latest_number": numbers.get(latest.attempt_id) if latest else None,
        "latest_card": card_text(current, latest, numbers) if latest else "",
        "latest_fields": card_fields(latest) if latest else [],
        "earlier_cards": [
            {"number": numbers[d.attempt_id], "text": card_text(current, d, numbers), "at": d.created_at}
            for d in page.decisions[:-1]
        ],
        "attempt_rows": [
            {"attempt": a, "diagnostic_ref": diagnostic_refs.get(a.diagnostic_id, "")} for a in page.attempts
        ],
        "receipt_rows": [
            {"receipt": r, "diagnostic_ref": diagnostic_refs.get(r.diagnostic_id, "")} for r in page.receipts
        ],
        "observation": _observation(page) if current.observed else None,
    }


def _actions_context(request: HttpRequest, page: CallPage, now) -> dict:
    """The catalogue's answer for this person on this call (the facts the action services read, with the key's age
    the page already has), the recommended action first."""
    current = page.call
    facts = call_facts(current, user=request.user, now=now, key_since=page.status.key.since)
    actions = options_for(current, facts, perms=request.user.get_all_permissions())
    latest = page.latest_decision
    tool = current.tool
    advice = recommended(
        actions,
        state=current.state,
        outcome=current.outcome,
        asked=required_action(latest.required_next) if latest else "",
        retry_path=tool.retry_path,
        replay_safe=tool.replay_safe,
    )
    offered = (
        _offered(current.pk, a) | {"recommended": advice is not None and a.name == advice.name}
        for a in actions
        if a.allowed
    )
    return {
        "retry_path": retry_path_of(tool.side_effect, tool.retry_path),
        "actions": actions,
        "allowed_actions": sorted(offered, key=lambda offer: not offer["recommended"]),
        "recommendation": advice,
        "forbidden_groups": by_reason((a.reason, a) for a in actions if not a.allowed),
    }


def _observation(page: CallPage) -> dict:
    """An observed call's spans, and attempt by attempt what admission answered (the gate answers already read)."""
    answers = {g.attempt_id: admission_of(g) for g in page.gates if g.attempt_id and not g.dry_run}
    spans = call_spans(page.call)
    return {
        "spans": spans,
        "without_arguments": bool(spans) and not any(s.has_arguments for s in spans),
        "attempts": [{"attempt": a, "answer": answers.get(a.pk)} for a in page.attempts],
    }


def _offered(call_id: int, action) -> dict:
    """An allowed action as the page offers it: a form that previews it (with the evidence fields an action that
    settles the call by hand needs; their ids carry the action's name, both forms being on one page)."""
    evidence = EvidenceForm(auto_id=f"{action.name}-%s") if action.name in EVIDENCE_ACTIONS else None
    url = reverse("console:action-preview", args=[call_id, action.name])
    return {"action": action, "preview_url": url, "evidence_form": evidence}


def _stale(req, current: Call) -> bool:
    """An open request made for an earlier version of the call: deciding it would be refused as stale."""
    return req.status in OPEN and req.call_version != current.version


def _assignee(current: Call) -> str:
    """Who the call is assigned to ("" for nobody): read with the call (recovery.selectors.call_page)."""
    try:
        return current.assignment.assignee.get_username()
    except ObjectDoesNotExist:
        return ""


def _status_context(request: HttpRequest, status: CallStatus, seen: dict, now) -> dict:
    current = status.call
    version = seen.get("version")
    checks = seen.get("checks")
    version = current.version if version is None else version
    checks = current.checks_made if checks is None else checks
    key = status.key
    if key.expired:
        retention = f"expired {age_text(now - key.expires_at)} ago: a replay with this key is no longer deduplicated"
    else:
        retention = f"expires in {age_text(key.expires_at - now)}"
    return {
        "call": current,
        "status": status,
        "in_state": age_text(now - current.state_changed_at),
        "retention": retention,
        "retention_total": age_text(timedelta(seconds=key.retention_s)),
        "being_confirmed": current.state in ("UNKNOWN", "STILL_UNKNOWN")
        and current.last_receipt_status == Observation.PENDING,
        "changed": current.version != version,
        "new_checks": max(current.checks_made - checks, 0),
        "live_url": f"{request.path}?version={version}&checks={checks}",
        "refresh_s": REFRESH_S,
        "now": now,
        "facts": shown_facts(current),
        "due": due_text(current.state, current.risk, current.state_changed_at, now, held=status.claim_live),
        "assignee": _assignee(current),
    }


# --- the decision card as docs/design/decisions.md prints it ----------------------------------------------------------


def _columns(*cells: str, width: int = 28) -> str:
    return "".join(cell.ljust(width) for cell in cells[:-1]) + cells[-1]


def _limit(value) -> str:
    return "no limit" if value is None else str(value)


def _budget(budget: dict) -> str:
    parts = [f"attempt {budget.get('attempt')}/{_limit(budget.get('max_attempts'))}"]
    parts.append(f"task rounds {budget.get('task_rounds')}/{_limit(budget.get('max_rounds'))}")
    deadline = budget.get("deadline_in_s")
    if deadline is not None:
        parts.append(f"deadline in {deadline:g} s" if deadline >= 0 else f"deadline passed {-deadline:g} s before")
    if budget.get("token_budget") is not None:
        parts.append(f"tokens {budget.get('tokens_used')}/{budget.get('token_budget')}")
    return ", ".join(parts)


def _required_next(required: dict) -> str:
    parts = [f"action: {required.get('action', '')}", f"after_ms: {required.get('after_ms', 0)}"]
    for name, value in (required.get("detail") or {}).items():
        parts.append(f"{name}: {json.dumps(value, ensure_ascii=False, default=str)}")
    return "{" + ", ".join(parts) + "}"


def card_text(current: Call, decision: DecisionRow, numbers: dict[int, int]) -> str:
    """The stored card (Decision.card, as the API returned it) laid out as docs/design/decisions.md prints one: plain
    text, which the template escapes like any other (the public message came through the engine, the key from the
    runtime)."""
    card = decision.card or {}
    budget = card.get("budget") or {}
    number = numbers.get(decision.attempt_id, budget.get("attempt"))
    lines = [
        _columns(
            f"call: {current.pk}",
            f"attempt: {number} of {_limit(budget.get('max_attempts'))}",
            f"error: {card.get('error', '')}",
        ),
        _columns(
            f"phase: {card.get('phase', '')}",
            f"stage: {card.get('stage', '')}",
            f"side_effect: {card.get('side_effect', '')}",
        ),
        _columns(f"idempotency_key: {current.idempotency_key}", f"budget: {_budget(budget)}", width=56),
        _columns(
            f"decision: {card.get('route', decision.route)}", f"delay_ms: {card.get('delay_ms', decision.delay_ms)}"
        ),
        f"next: [{', '.join(card.get('next', decision.next_actions))}]",
        f"forbidden: [{', '.join(card.get('forbidden', decision.forbidden))}]",
        f"public_message: {json.dumps(card.get('public_message', decision.public_message), ensure_ascii=False)}",
        f"required_next: {_required_next(card.get('required_next', decision.required_next) or {})}",
    ]
    extra = [
        f"{name}: {card[name]}" for name in ("call_state", "outcome", "fallback", "breaker_state") if card.get(name)
    ]
    return "\n".join(lines + ([_columns(*extra)] if extra else []))


def card_fields(decision: DecisionRow) -> list[tuple[str, str]]:
    """The same card as labelled fields, the decision first: what a reviewer reads before the text form."""
    card = decision.card or {}
    required = card.get("required_next", decision.required_next) or {}
    delay = card.get("delay_ms", decision.delay_ms) or 0
    fields = [
        ("Decision", str(card.get("route", decision.route))),
        ("Then", _required_next(required) if required else "nothing more"),
        ("Why", ", ".join(str(card[k]) for k in ("error", "phase", "stage") if card.get(k)) or "—"),
        ("Next steps", ", ".join(card.get("next", decision.next_actions)) or "none"),
        ("Forbidden", ", ".join(card.get("forbidden", decision.forbidden)) or "nothing"),
        ("Wait before", f"{delay / 1000:g} s" if delay else "no wait"),
        ("Budget", _budget(card.get("budget") or {})),
        ("The model reads", str(card.get("public_message", decision.public_message)) or "—"),
    ]
    fields += [(name.replace("_", " ").capitalize(), str(card[name])) for name in ("call_state", "outcome",
               "fallback", "breaker_state") if card.get(name)]  # fmt: skip
    return fields


urlpatterns = [path("calls/<int:call_id>/", call, name="call")]

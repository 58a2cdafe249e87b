"""The audit page (docs/console.md, "The audit trail"): search, export as JSON lines or CSV, and verifying the chains.
Every role searches and exports; only admins verify, because a check is recorded. Exports are oldest first, every
hashed field as stored, and CSV cells a spreadsheet would run as a formula get a leading apostrophe.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.utils.html import format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from console.views.common import EXPORT, VERIFY, VIEW, render_page, requires, url_pattern
from recovery.audit.actions import REQUEST_EVENTS
from recovery.audit.chain import Actor, chain_key
from recovery.models import ActorKind
from recovery.selectors.audit import (
    EXPORT_COLUMNS,
    AuditFilters,
    AuditPage,
    audit_export_rows,
    audit_page,
    match_of,
)
from recovery.services.audit_checks import ALL, audit_verify

logger = logging.getLogger(__name__)

MAX_ID = 2**63 - 1  # a bigint: anything larger can name no row, and would overflow the query parameter
FILTER_NAMES = ("actor", "kind", "action", "task", "call", "from", "to")
EXPORT_LINKS = (("jsonl", "JSON lines"), ("csv", "CSV"))
FORMATS = {"jsonl": ("application/x-ndjson; charset=utf-8", "jsonl"), "csv": ("text/csv; charset=utf-8", "csv")}
# A moment as typed: a date, or a date and time (minutes, seconds, a fraction), optionally with an offset.
_MOMENT = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})"
    r"(?:[T ](?P<minute>\d{2}:\d{2})(?::(?P<second>\d{2})(?P<fraction>\.\d{1,6})?)?(?P<offset>Z|[+-]\d{2}:?\d{2})?)?",
    re.ASCII,
)
MOMENT_HINT = "UTC: 2025-01-31 or 2025-01-31 14:00"


class MomentField(forms.Field):
    """A moment in UTC unless an offset is given. As an upper bound (`end`) it includes the whole unit written:
    "2025-01-31" means up to the end of that day, "14:00" up to 14:00:59.999999. Cleans to the bound's moment (the
    upper bound exclusive)."""

    def __init__(self, *, end: bool, **kwargs) -> None:
        super().__init__(required=False, **kwargs)
        self.end = end

    def to_python(self, value) -> datetime | None:
        text = (value or "").strip()
        if not text:
            return None
        found = _MOMENT.fullmatch(text) if len(text) <= 40 else None
        try:
            if found is None:
                raise ValueError
            moment = datetime.fromisoformat(text.replace(" ", "T", 1))
            if timezone.is_naive(moment):
                moment = moment.replace(tzinfo=UTC)
            if self.end:
                moment += _unit(found)
        except (ValueError, OverflowError):
            raise forms.ValidationError(
                "Not a date or time: write it as 2025-01-31, 2025-01-31 14:00 or 2025-01-31T14:00:05Z (UTC unless an "
                "offset is given).",
                code="invalid",
            ) from None
        return moment.astimezone(UTC)


def _unit(found: re.Match) -> timedelta:
    if found["fraction"]:
        return timedelta(microseconds=1)
    if found["second"]:
        return timedelta(seconds=1)
    return timedelta(minutes=1) if found["minute"] else timedelta(days=1)


def _id_field(label: str) -> forms.IntegerField:
    return forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_ID,
        label=label,
        widget=forms.TextInput(attrs={"inputmode": "numeric"}),
        error_messages={
            "invalid": "Enter the id as a whole number, e.g. 42.",
            "min_value": "Ids start at 1.",
            "max_value": "No id is that large.",
        },
    )


class AuditSearchForm(forms.Form):
    """The search's filters, all optional and all in the URL, so a search can be shared and exported as shown."""

    actor = forms.CharField(
        required=False, max_length=200, label="Actor", help_text="exact, or a prefix ending in *: user:alice, job:*"
    )
    kind = forms.ChoiceField(required=False, choices=[("", "any kind"), *ActorKind.choices], label="Actor kind")
    action = forms.CharField(
        required=False, max_length=64, label="Action", help_text="exact, or a prefix: call.transition, call."
    )
    task = _id_field("Task id")
    call = _id_field("Call id")
    before = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID, widget=forms.HiddenInput)
    after = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID, widget=forms.HiddenInput)
    format = forms.ChoiceField(
        required=False,
        choices=[("", "JSON lines"), ("jsonl", "JSON lines"), ("csv", "CSV")],
        widget=forms.HiddenInput,
        error_messages={"invalid_choice": "Export as jsonl or csv."},
    )

    def __init__(self, data: QueryDict) -> None:
        super().__init__(data)
        # "from" is a Python keyword, so these two are added here rather than declared above (the URL says from/to).
        self.fields["from"] = MomentField(end=False, label="From", help_text=MOMENT_HINT)
        self.fields["to"] = MomentField(end=True, label="To", help_text="UTC, inclusive: a date means its whole day")

    def clean(self) -> dict:
        data = super().clean()
        since, until = data.get("from"), data.get("to")
        if since and until and until <= since:
            self.add_error("to", "“To” must be later than “From”.")
        if data.get("before") is not None and data.get("after") is not None:
            self.add_error("after", "A page starts before one event or after one, not both: use Newest.")
        return data

    def filters(self) -> AuditFilters:
        data = self.cleaned_data
        return AuditFilters(
            actor=match_of(data.get("actor") or ""),
            actor_kind=data.get("kind") or "",
            action=match_of(data.get("action") or "", dot_is_prefix=True),
            task_id=data.get("task"),
            call_id=data.get("call"),
            since=data.get("from"),
            until=data.get("to"),
            before=data.get("before"),
            after=data.get("after"),
        )

    def controls(self) -> list[dict]:
        """The visible filters as the page draws them (the select's options already escaped by format_html)."""
        drawn = []
        for name in FILTER_NAMES:
            field = self[name]
            current = str(self.data.get(name, ""))
            options = ""
            if name == "kind":
                marked = ((v, " selected" if v == current else "", text) for v, text in field.field.choices)
                options = format_html_join("", '<option value="{}"{}>{}</option>', marked)
            described = [f"{field.auto_id}-hint"] if field.help_text else []
            described += [f"{field.auto_id}-error"] if field.errors else []
            drawn.append(
                {
                    "name": name,
                    "id": field.auto_id,
                    "describedby": " ".join(described),
                    "label": field.label,
                    "hint": field.help_text,
                    "errors": field.errors,
                    "options": options,
                    "value": current,
                    "numeric": name in ("task", "call"),
                }
            )
        return drawn


@require_GET
@login_required
@requires(VIEW)
def audit(request: HttpRequest) -> HttpResponse:
    form = AuditSearchForm(request.GET)
    return _search_page(request, form)


def _search_page(request: HttpRequest, form: AuditSearchForm) -> HttpResponse:
    """The search page: 200 with a page of events, or 400 with the field errors (and no query run)."""
    valid = form.is_valid()
    filters = form.filters() if valid else AuditFilters()
    page = audit_page(filters) if valid else None
    kept = _filter_query(request.GET)
    paged = filters.before is not None or filters.after is not None
    export = reverse("console:audit-export")
    context = {
        "form": form,
        "controls": form.controls(),
        "hidden_errors": [(name, form[name].errors) for name in ("before", "after", "format") if form[name].errors],
        "page": page,
        "rows": _named(page.rows) if page else [],
        "filters": filters,
        "paged": paged,
        "older_url": f"{request.path}?{_with(kept, before=str(page.older))}" if page and page.older else "",
        "newer_url": f"{request.path}?{_with(kept, after=str(page.newer))}" if page and page.newer else "",
        "newest_url": f"{request.path}?{kept.urlencode()}" if valid and paged else "",
        "shown": _shown(page, filters) if page and page.rows else None,
        "export_urls": [(label, f"{export}?{_with(kept, format=fmt)}") for fmt, label in EXPORT_LINKS] if valid else [],
        "can_verify": request.user.has_perm(VERIFY),
        "verify_task": filters.task_id if valid else None,
        "here": request.get_full_path(),
    }
    return render_page(request, "console/audit.html", context, partial="results", status=200 if valid else 400)


def _shown(page: AuditPage, filters: AuditFilters) -> dict:
    """Which stretch of the trail a page shows, by `seq` and time (the page counts nothing: a COUNT reads every
    match), and whether it is the newest or the oldest end of it."""
    newest, oldest = page.rows[0], page.rows[-1]
    ends = [end for end, there in (("the newest", page.newer is None), ("the oldest", page.older is None)) if there]
    everything = "every event that matches" if filters.any else "the whole trail"
    return {
        "count": len(page.rows),
        "newest_seq": f"{newest['seq']:,}",
        "oldest_seq": f"{oldest['seq']:,}",
        "newest_at": newest["created_at"],
        "oldest_at": oldest["created_at"],
        "position": everything if len(ends) == 2 else "".join(ends),
    }


# How the page names each kind of actor, beside the name itself.
ACTOR_KINDS = {
    ActorKind.USER: "person",
    ActorKind.TOKEN: "agent token",
    ActorKind.JOB: "job",
    ActorKind.SYSTEM: "system",
}


def _named(rows: list[dict]) -> list[dict]:
    """Each event with what a reader knows its ids by, and the pages they open: the call (its tool and idempotency
    key), the task (its external id and agent), the actor (a person's username, an agent token's name, a job's or a
    command's), a search for every event by that actor, and the action request, bulk action or breaker operation
    its evidence names. Nothing here reads the database: the names came with the page's one statement."""
    call_url, task_url = url_pattern("console:call"), url_pattern("console:task")
    for row in rows:
        kind, label = row["actor_kind"], row["actor_label"]
        tail = label.split(":", 1)[1] if label.startswith(f"{kind}:") else label
        row["actor_name"] = row["actor_user__username"] or row["actor_token__name"] or tail
        row["actor_kind_text"] = ACTOR_KINDS.get(kind, kind)
        row["actor_url"] = "?" + QueryDict.fromkeys(["actor"], value=label).urlencode()
        row["call_url"] = call_url.format(row["call_id"]) if row["call_id"] else ""
        row["task_url"] = task_url.format(row["task_id"]) if row["task_id"] else ""
        row["links"] = _evidence_links(row["action"], row["evidence"])
    return rows


def _evidence_links(action: str, evidence) -> list[tuple[str, str]]:
    """The action request, bulk action or breaker operation an event's evidence names, as (text, page) pairs."""
    found: dict[str, int] = {}
    if isinstance(evidence, dict):
        for key in ("action_request", "bulk", "breaker_operation"):
            if _an_id(evidence.get(key)):
                found[key] = evidence[key]
        if action in REQUEST_EVENTS and _an_id(evidence.get("request")):
            found["action_request"] = evidence["request"]  # an action request's own steps name it "request"
    elif isinstance(evidence, list):  # an executed action's transition: ["action_request:12", "ref:re_1", ...]
        for item in evidence:
            key, _, value = str(item).partition(":")
            if key == "action_request" and value.isascii() and value.isdigit() and _an_id(int(value)):
                found[key] = int(value)
    what = evidence.get("action") if isinstance(evidence, dict) and isinstance(evidence.get("action"), str) else ""
    links = []
    for key, (name, text) in _LINKED.items():
        if key in found:
            named = f"{text} {found[key]}" + (f" · {what}" if what and key != "breaker_operation" else "")
            links.append((named, url_pattern(name).format(found[key])))
    return links


def _an_id(value) -> bool:
    return type(value) is int and 0 < value <= MAX_ID


_LINKED = {
    "action_request": ("console:action", "action request"),
    "bulk": ("console:bulk", "bulk action"),
    "breaker_operation": ("console:breaker-op", "breaker operation"),
}


def _filter_query(query: QueryDict) -> QueryDict:
    """The filters as the links carry them on: the ones set, each once, without the page position or format."""
    kept = QueryDict(mutable=True)
    for name in FILTER_NAMES:
        value = query.get(name, "")
        if value.strip():
            kept[name] = value
    return kept


def _with(query: QueryDict, **extra: str) -> str:
    copy = query.copy()
    for key, value in extra.items():
        copy[key] = value
    return copy.urlencode()


@require_GET
@login_required
@requires(EXPORT)
def audit_export(request: HttpRequest) -> HttpResponse:
    """Every event the filters match, oldest first, streamed: a large trail is never held in memory at once."""
    form = AuditSearchForm(request.GET)
    if not form.is_valid():
        return _search_page(request, form)
    filters = form.filters()
    content_type, extension = FORMATS[form.cleaned_data.get("format") or "jsonl"]
    rows = audit_export_rows(filters)
    lines = _csv_lines(rows) if extension == "csv" else _jsonl_lines(rows)
    response = StreamingHttpResponse(_batched(lines), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{_file_name(filters, extension)}"'
    patch_cache_control(response, private=True, no_store=True)
    return response


def _file_name(filters: AuditFilters, extension: str) -> str:
    """ASCII only (ids are integers): e.g. audit-task-42-20250131T140005Z.jsonl."""
    scope = f"task-{filters.task_id}" if filters.task_id else f"call-{filters.call_id}" if filters.call_id else "trail"
    return f"audit-{scope}{'-filtered' if _narrowed(filters) else ''}-{timezone.now():%Y%m%dT%H%M%SZ}.{extension}"


def _narrowed(filters: AuditFilters) -> bool:
    """Filtered beyond one task's (or call's) whole history: the file is a selection, not a whole chain."""
    return any((filters.actor, filters.actor_kind, filters.action, filters.since, filters.until)) or bool(
        filters.task_id and filters.call_id
    )


def _exported(row: dict) -> dict:
    """A row as exported: the moment as event_hash writes it (UTC, ISO 8601, microseconds), the rest as stored."""
    return row | {"created_at": row["created_at"].astimezone(UTC).isoformat(timespec="microseconds")}


def _jsonl_lines(rows: Iterator[dict]) -> Iterator[str]:
    # ASCII-escaped: no line or paragraph separator inside a value can split a line for a reader that splits on them.
    for row in rows:
        yield json.dumps(_exported(row), ensure_ascii=True, separators=(",", ":")) + "\n"


class _Line:
    """A file-like object csv.writer writes one row to and hands back as text."""

    def write(self, value: str) -> str:
        return value


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")


def csv_cell(value) -> str:
    """A cell as written: None empty, numbers as they are, text neutralized against formula injection."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    elif not isinstance(value, str):
        return str(value)
    return "'" + value if value.startswith(_FORMULA_STARTS) else value


def _csv_lines(rows: Iterator[dict]) -> Iterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow(EXPORT_COLUMNS)
    for row in rows:
        exported = _exported(row)
        yield writer.writerow([csv_cell(exported[column]) for column in EXPORT_COLUMNS])


def _batched(lines: Iterator[str], size: int = 64 * 1024) -> Iterator[bytes]:
    """About 64 KB per write, not one write per row."""
    buffer: list[str] = []
    length = 0
    for line in lines:
        buffer.append(line)
        length += len(line)
        if length >= size:
            yield "".join(buffer).encode()
            buffer, length = [], 0
    if buffer:
        yield "".join(buffer).encode()


@require_POST
@login_required
@requires(VERIFY)
def audit_verify_view(request: HttpRequest) -> HttpResponse:
    """Verify the whole trail, or the task chain named by `task`; the result is shown on the audit page."""
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = reverse("console:audit")
    raw_task = request.POST.get("task", "").strip()
    if raw_task and not (raw_task.isascii() and raw_task.isdigit() and 0 < int(raw_task) <= MAX_ID):
        messages.error(request, "Nothing verified: the task id must be a whole number, e.g. 42.")
        return redirect(target)
    scope = chain_key(int(raw_task)) if raw_task else ALL
    try:
        report = audit_verify(scope=scope, actor=Actor.for_user(request.user))
    except DatabaseError:
        logger.exception("audit verification failed to run")
        messages.error(request, "The check could not run (a database error). Try again, or run manage.py verify_audit.")
        return redirect(target)
    what = f"Task {int(raw_task)}'s chain" if raw_task else "The audit trail"
    if report.ok and raw_task and report.events == 0:
        messages.success(request, f"Task {int(raw_task)} has no audit events: there was no chain to verify.")
    elif report.ok:
        chains = f" in {report.chains} chain{'s' if report.chains != 1 else ''}" if scope == ALL else ""
        messages.success(request, f"{what} is intact: {report.events} events{chains} verified.")
    else:
        messages.error(
            request,
            f"{what} is BROKEN: {report.problem} ({report.events} events read). Something changed the trail outside "
            "the product: keep this message, and compare the trail with an earlier export.",
        )
    return redirect(target)


urlpatterns = [
    path("audit/", audit, name="audit"),
    path("audit/export/", audit_export, name="audit-export"),
    path("audit/verify/", audit_verify_view, name="audit-verify"),
]

"""A status lookup by listing (docs/providers.md, docs/reconciliation.md): for a provider with no lookup by key, list
or search its objects with a request templated from the call, page by page up to the registry's bound, and match each
item on the marker the call's own request put in it (`metadata.recovery_key == {idempotency_key}`).

What it can prove: matched items are the call's effects (`committed`, effects = how many, every reference kept).
What it cannot: "not listed" is `not_committed` only when every page was read and the provider's visibility lag
(`visible_after_s`) has passed since the attempt finished; before that `pending`, and a listing cut at its page bound
is `ambiguous`. settle() decides from that as from any receipt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlencode

import requests
from django.utils import timezone

from recovery.engine.reconcile import Observation
from recovery.engine.redact import redact
from recovery.engine.storable import loads
from recovery.engine.validation import MISSING, resolve
from recovery.models import Call, Tool
from recovery.providers.requests import TemplateError, fill_body, fill_text, query_string
from recovery.providers.status import (
    MAX_BODY,
    Reply,
    StatusAnswer,
    fetch_status,
    outbound_headers,
    status_session,
    status_url,
)

DEFAULT_PAGES = 5
MAX_REFS = 50  # matched references kept on a receipt


@dataclass
class Listing:
    """What the pages said: the matched items' references, how many pages were read and whether more remained."""

    matched: list[str] = field(default_factory=list)
    pages: int = 0
    status: int | None = None  # the last page's HTTP status
    items: int = 0
    cut: bool = False


def _values(call: Call) -> dict:
    arguments = call.arguments if isinstance(call.arguments, dict) else {}
    return {**arguments, "idempotency_key": call.idempotency_key, "provider_ref": call.provider_ref}


def finished_at(call: Call) -> datetime | None:
    """When the call's last attempt finished (its outcome reported): the visibility window counts from it. An attempt
    never reported (swept to UNKNOWN after its outcome timeout) counts from the call's last change of state, the later
    moment: the window is never short. One indexed read, made by the query's thread (which closes its connection)."""
    reported = call.attempts.order_by("-number").values_list("reported_at", flat=True).first()
    return reported or call.state_changed_at or call.sent_at


def fetch_lookup(tool: Tool, call: Call) -> Reply | StatusAnswer:
    """The tool's status lookup, whatever its kind: a listing read and judged here, a query by key's reply (read
    later by status.read_status), or, for a lookup that is a same-key replay, nothing learned by a query."""
    kind = (tool.status_query or {}).get("kind") or "key"
    if kind == "list":
        return list_status(tool, call)
    if kind == "replay":
        return StatusAnswer(observed=Observation.AMBIGUOUS, error="the lookup is a same-key replay (no status query)")
    return fetch_status(tool, call)


def shown_lookup(tool: Tool, call: Call) -> dict | None:
    """The lookup's (first) request as a plan shows it, credentials masked; None when there is none to send."""
    query = tool.status_query or {}
    kind = query.get("kind") or "key"
    if kind == "list":
        try:
            url, params, _ = _listing_request(tool, call)
        except TemplateError:
            return None
        url += f"?{params}" if params else ""
    else:
        url = status_url(tool, call) if kind == "key" else None
    if url is None:
        return None
    return {"method": query.get("method") or "GET", "url": url, "headers": outbound_headers(tool.provider)[1]}


def _listing_request(tool: Tool, call: Call) -> tuple[str, str, dict[str, str]]:
    """The listing's URL and query string, and the match's fields with the values the call's marker must have."""
    query = tool.status_query or {}
    values = _values(call)
    url = tool.provider.base_url.rstrip("/") + fill_text(str(query.get("path") or ""), values, quoted=True)
    wanted = {}
    for name, template in (query.get("match") or {}).items():
        value = fill_body(template, values)
        if value is None or value == "":
            # An empty marker would match every item that lacks the field: no match is ever made on nothing.
            raise TemplateError(f"the match on {name} needs {template}, which the call lacks")
        wanted[name] = str(value)
    return url, query_string(query.get("query"), values), wanted


def list_status(tool: Tool, call: Call, *, now: datetime | None = None) -> StatusAnswer:
    """Read the listing and say what it proves. Never raises for what the network or the provider does."""
    query = tool.status_query or {}
    try:
        url, params, wanted = _listing_request(tool, call)
    except TemplateError as exc:
        return StatusAnswer(observed=Observation.AMBIGUOUS, error=str(exc))
    headers, shown = outbound_headers(tool.provider)
    record = {"method": query.get("method") or "GET", "url": url + (f"?{params}" if params else ""), "headers": shown}
    listing = Listing()
    failed = _read_pages(tool, query, url, params, headers, wanted, listing)
    response = {"pages": listing.pages, "items": listing.items, "cut": listing.cut, "matched": listing.matched}
    if failed is not None:
        status, error = failed
        response.update(status=status, error=error)
        if not listing.matched:
            # A page that failed (no reply, 4xx, 5xx) counts against the status breaker; a page that answered in a
            # shape the registry does not describe is unreadable, as an unmapped status is.
            unreadable = status is not None and status < 400
            observed = Observation.AMBIGUOUS if unreadable else Observation.FAILED
            return StatusAnswer(
                observed=observed, http_status=status, request=record, response=response, error=error,
                endpoint_failed=not unreadable,
            )  # fmt: skip
        response["cut"] = True  # what was matched stands; the count is of the pages read
    return _verdict(tool, call, listing, record, response, now or timezone.now())


def _read_pages(tool, query, url, params, headers, wanted, listing: Listing) -> tuple[int | None, str] | None:
    """Page through the listing into `listing`; (http status, error) when a page could not be read."""
    pages = int(query.get("max_pages") or DEFAULT_PAGES)
    timeout = (tool.provider.connect_timeout_s, tool.provider.read_timeout_s)
    ref_field = query.get("ref_field") or tool.provider_ref_field or "id"
    following, cursor = query.get("next") or {}, None
    for _ in range(pages):
        page_params = params
        if cursor is not None:
            page_params = "&".join(p for p in (params, urlencode({following["param"]: cursor})) if p)
        target = url + (f"?{page_params}" if page_params else "")
        try:
            method = query.get("method") or "GET"
            reply = status_session().request(method, target, headers=headers, timeout=timeout, allow_redirects=False)
        except requests.RequestException as exc:
            return None, redact(f"{type(exc).__name__}: {exc}")
        if reply.status_code >= 400:
            return reply.status_code, f"the listing answered {reply.status_code}"
        body, items = _page(reply, query)
        if items is None:
            return reply.status_code, f"no list of items at {query.get('items')!r} in the listing"
        listing.pages, listing.items, listing.status = listing.pages + 1, listing.items + len(items), reply.status_code
        listing.matched += [_text(resolve(item, ref_field))[:255] for item in items if _matches(item, wanted)]
        if not _more(body, following):
            return None
        cursor = _cursor(body, items, following)
        if not cursor:
            return reply.status_code, "the listing says more follow but gives no cursor to ask for them"
    listing.cut = True
    return None


def _more(body: object, following: dict) -> bool:
    """Whether the page says another follows: its `more` flag, or (paged by a token in the page) a token."""
    if not following:
        return False  # the registry requires `next` on a listing; without it nothing says more follow
    if "more" in following and resolve(body, following["more"]) is not True:
        return False
    return "more" in following or bool(_text(resolve(body, following["page_cursor"])))


def _cursor(body: object, items: list, following: dict) -> str:
    if "page_cursor" in following:
        return _text(resolve(body, following["page_cursor"]))
    return _text(resolve(items[-1], following["cursor"])) if items and isinstance(items[-1], dict) else ""


def _page(reply: requests.Response, query: dict) -> tuple[object, list | None]:
    """A page's body and its items (None when the page holds no list where the registry says)."""
    try:
        body = loads(reply.content[: MAX_BODY * 16])  # bounded: a page of a hundred objects, not a runaway answer
    except ValueError:
        return None, None
    items = resolve(body, query.get("items") or "data") if isinstance(body, dict) else MISSING
    return body, items if isinstance(items, list) else None


def _matches(item: object, wanted: dict[str, str]) -> bool:
    return isinstance(item, dict) and all(_text(resolve(item, name)) == value for name, value in wanted.items())


def _text(value) -> str:
    return str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""


def _verdict(tool: Tool, call: Call, listing: Listing, record: dict, response: dict, now: datetime) -> StatusAnswer:
    common = {"request": record, "response": response, "http_status": listing.status}
    if listing.matched:
        return StatusAnswer(
            observed=Observation.COMMITTED,
            provider_status=f"listed {len(listing.matched)}",
            provider_ref=listing.matched[0],
            effects=len(listing.matched),
            **{**common, "response": {**response, "matched": listing.matched[:MAX_REFS]}},
        )
    if listing.cut:
        error = f"not among the first {listing.pages} pages, and more follow: the listing was cut"
        return StatusAnswer(observed=Observation.AMBIGUOUS, provider_status="listing_cut", error=error, **common)
    window = int((tool.status_query or {}).get("visible_after_s") or 0)
    finished = finished_at(call)
    waited = (now - finished).total_seconds() if finished else window
    if waited < window:
        error = f"not listed {waited:.1f} s after the attempt; the provider may take {window} s to list it"
        return StatusAnswer(observed=Observation.PENDING, provider_status="not_listed_yet", error=error, **common)
    return StatusAnswer(observed=Observation.NOT_COMMITTED, provider_status="not_listed", effects=0, **common)

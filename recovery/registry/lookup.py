"""The registry's status lookups (docs/providers.md, docs/reconciliation.md): a tool's `status_query` is one of three
kinds — `key` (a GET by key or reference, read through `status_map`), `list` (a listing or search, paged up to a
bound, whose items are matched on a marker the request itself sends), or `replay` (the provider answers a same-key
re-send with the original outcome: replay reconciliation is the lookup). The keys are declared here and the rules
that read two of them, or the tool's request, at once.
"""

from __future__ import annotations

from typing import Any

from recovery.engine.validation import MISSING, resolve
from recovery.registry.checks import (
    CALL_PLACEHOLDERS,
    STATUS_PLACEHOLDERS,
    Context,
    Key,
    check_object,
    child,
    choice,
    dotted,
    integer,
    name,
    placeholders,
    show,
    template_strings,
)
from recovery.registry.wire import query_template

KINDS = ("key", "list", "replay")
LOOKUP_PLACEHOLDERS = STATUS_PLACEHOLDERS | CALL_PLACEHOLDERS
MAX_PAGES = 20


def _match(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, dict) or not value:
        ctx.error(path, 'must map item fields to templates, e.g. {"metadata.recovery_key": "{idempotency_key}"}')
        return False
    ok = True
    for field, template in value.items():
        ok = dotted(ctx, field, child(path, field)) and ok
        if not isinstance(template, str) or not placeholders(template):
            what = f"must be a template naming the call, e.g. {{idempotency_key}} (got {show(template)})"
            ctx.error(child(path, field), what)
            ok = False
    return ok


NEXT_PAGE = {
    "param": Key(name(100), required=True),  # the query parameter that asks for the next page (starting_after)
    "cursor": Key(dotted),  # what it is given: this field of a page's last item (Stripe: id), or
    "page_cursor": Key(dotted),  # this field of the page itself (Square's cursor, Stripe Search's next_page)
    "more": Key(dotted),  # the page's field that says another page follows (has_more); needed with `cursor`
}


def _next_page(ctx: Context, value: Any, path: str) -> bool:
    passed = check_object(ctx, value, path, NEXT_PAGE, "the next page")
    if passed is None or passed != set(value):
        return False
    if ("cursor" in value) == ("page_cursor" in value):
        ctx.error(path, "needs exactly one of cursor (a field of the last item) or page_cursor (a field of the page)")
        return False
    if "cursor" in value and "more" not in value:
        ctx.error(child(path, "more"), "required with cursor: the page's field that says more follow (has_more)")
        return False
    return True


# The keys a status_query may carry besides method, path and status_map (recovery.registry.format.STATUS_QUERY).
LOOKUP_KEYS = {
    "kind": Key(choice(*KINDS)),  # key (default), list, replay
    "query": Key(query_template),  # list: query parameters, templated from the call
    "items": Key(dotted),  # list: where a page's items are (data)
    "match": Key(_match),  # list: item field -> template; every field must equal for an item to be the call's effect
    "ref_field": Key(dotted),  # list: a matched item's reference (default: the tool's provider_ref_field, else id)
    "next": Key(_next_page),  # list: how to ask for the next page
    "max_pages": Key(integer(1, MAX_PAGES)),  # list: pages read at most; a listing cut there proves nothing
    "visible_after_s": Key(integer(0, 86_400)),  # list: how long a new item may take to appear (a search's lag)
}
_LIST_ONLY = ("items", "match", "ref_field", "next", "max_pages", "visible_after_s")


def lookup_kind(query: Any) -> str:
    return query.get("kind") or "key" if isinstance(query, dict) else ""


def check_status_query(ctx: Context, tool: dict, path: str, args: frozenset[str] | None) -> None:
    """The rules of a tool's status_query that read more than one key: by kind, its required keys, its placeholders
    and, for a listing, that the request sends every marker the match looks for."""
    query = tool["status_query"]
    kind = lookup_kind(query)
    for key in _LIST_ONLY if kind != "list" else ():
        if key in query:
            ctx.error(child(path, key), f'only for a status_query of kind "list" (this one is {kind!r})')
    for key in ("method", "path") if kind != "replay" else ():
        if key not in query:
            ctx.error(child(path, key), f"required for a status_query of kind {kind!r}")
    if kind == "replay":
        for key in ("method", "path", "status_map"):
            if key in query:
                ctx.error(child(path, key), "a replay lookup re-sends the tool's own request: nothing to set here")
        reconcile = tool.get("reconcile")
        if not (isinstance(reconcile, dict) and reconcile.get("replay_when_status_down") is True):
            what = "a replay lookup is replay reconciliation: set reconcile.replay_when_status_down"
            ctx.error(child(path, "kind"), what)
        return
    if kind == "key":
        _check_key_lookup(ctx, query, path)
        return
    _check_list_lookup(ctx, tool, query, path, args)


def _check_list_lookup(ctx: Context, tool: dict, query: dict, path: str, args: frozenset[str] | None) -> None:
    for key in ("items", "match", "next"):
        if key not in query:
            # Without `next` a listing could not tell a complete answer from a first page: "not listed" would lie.
            ctx.error(child(path, key), 'required for a status_query of kind "list"')
    allowed = LOOKUP_PLACEHOLDERS | (args or frozenset())
    for key in ("path", "query", "match"):
        for where, text in template_strings(query.get(key), child(path, key)):
            for placeholder in placeholders(text):
                if args is not None and placeholder.split(".")[0] not in allowed:
                    ctx.error(where, f"{{{placeholder}}} is neither an argument nor the call's key or provider_ref")
    if isinstance(query.get("match"), dict):
        _check_markers(ctx, tool.get("request"), query["match"], child(path, "match"))


def _check_key_lookup(ctx: Context, query: dict, path: str) -> None:
    """A lookup by key names the call's key or reference in its path or its query, and nothing else of the call."""
    if "status_map" not in query:
        ctx.error(child(path, "status_map"), "required: it maps the provider's status strings to observations")
    if not isinstance(query.get("path"), str):
        return  # required, said above
    found: set[str] = set()
    for where, text in [
        (child(path, "path"), query["path"]),
        *template_strings(query.get("query"), child(path, "query")),
    ]:
        names = set(placeholders(text))
        found |= names
        for placeholder in sorted(names - STATUS_PLACEHOLDERS):
            what = f"{{{placeholder}}} is not available to a status query (only {{idempotency_key}}, {{provider_ref}})"
            ctx.error(where, what)
    if not found & STATUS_PLACEHOLDERS:
        what = (
            "must contain {idempotency_key} or {provider_ref} (here or in query): status is looked up by the call's key"
        )
        ctx.error(child(path, "path"), what)


def _check_markers(ctx: Context, request: Any, match: dict, path: str) -> None:
    """A listing finds the call's effect by a marker the request put in it: each matched field must be sent by the
    request with the very template the match compares (the body at that path, or the key's body field)."""
    request = request if isinstance(request, dict) else {}
    place = request.get("key") if isinstance(request.get("key"), dict) else {}
    for field, template in match.items():
        if not isinstance(template, str):
            continue
        sent = resolve(request.get("body"), field) if isinstance(request.get("body"), dict) else MISSING
        if sent == template or (place.get("field") == field and template == "{idempotency_key}"):
            continue
        ctx.error(
            child(path, field),
            f"the request never sends {template} at {field}: the listing could not find the call's effect; put it in "
            f'request.body (e.g. "metadata": {{"recovery_key": "{{idempotency_key}}"}})',
        )


def marker_paths(request: Any) -> list[str]:
    """The body paths whose template is exactly the call's key (`metadata.recovery_key`): where a runtime puts the key
    besides its header, so that what it sends carries the marker a listing matches (the admission's `wire`)."""
    body = request.get("body") if isinstance(request, dict) else None
    if not isinstance(body, dict):
        return []
    found = template_strings(body, "$")
    return [where[2:] for where, text in found if text == "{idempotency_key}" and "[" not in where]

"""The registry file format (docs/registry.md), declared object by object, and `validate_registry`: an object's own
keys first, then its cross-field rules on the values that passed, so one mistake is reported once. References may
point into the same file or at rows already in the database.
"""

from __future__ import annotations

import math
from typing import Any

from recovery.engine.types import BackoffPolicy, BreakerPolicy
from recovery.models import Provider, Tool
from recovery.registry.checks import (
    CALL_PLACEHOLDERS,
    COMPENSATION_ROOTS,
    KINDS,
    METHODS,
    OBSERVATIONS,
    PLACEHOLDER_NAME_RE,
    Context,
    Key,
    RegistryError,
    ToolRef,
    base_url,
    body_template,
    boolean,
    check_object,
    child,
    choice,
    dotted,
    env_name,
    integer,
    is_json_scalar,
    json_schema,
    name,
    number,
    placeholders,
    string,
    string_list,
    template_path,
    template_strings,
)
from recovery.registry.lookup import LOOKUP_KEYS, check_status_query
from recovery.registry.mcp import MCP_PROVIDER, MCP_TOOL, check_mcp_providers, check_mcp_tool
from recovery.registry.wire import ENCODINGS, answer_path, check_request_wire, header_name, key_place, query_template


def _nested(spec: dict[str, Key], what: str, *, required: bool = False) -> Key:
    """A nested object's key: it passes when every key in it passed and none it requires is missing."""

    def check(ctx: Context, value: Any, path: str) -> bool:
        passed = check_object(ctx, value, path, spec, what)
        return passed is not None and passed == set(value) and all(k in value for k, r in spec.items() if r.required)

    return Key(check, required=required)


def _nullable(key: Key) -> Key:
    """`key`, or null (checked by the cross-field rules: see _check_side_effect)."""

    def check(ctx: Context, value: Any, path: str) -> bool:
        return value is None or key.check(ctx, value, path)

    return Key(check, required=key.required)


# --- field checks that need more than one rule ----------------------------------------------------------------------


def _tenant_tools(ctx: Context, value: Any, path: str) -> bool:
    if value == "*":
        return True
    if not isinstance(value, list):
        ctx.error(path, 'must be "*" (every tool) or a list of tool names')
        return False
    ok, seen, valid_name = True, set(), name(100)
    for i, tool in enumerate(value):
        where = child(path, i)
        if not valid_name(ctx, tool, where):
            ok = False
        elif tool in seen:
            ctx.error(where, f"{tool!r} is listed twice")
            ok = False
        elif tool not in ctx.tools:
            ctx.error(where, f"no tool {tool!r} in this file or the database")
            ok = False
        else:
            seen.add(tool)
    return ok


def _auth(ctx: Context, value: Any, path: str) -> bool:
    passed = check_object(ctx, value, path, AUTH, "auth")
    if passed is None or "kind" not in passed:
        return False
    kind, ok = value["kind"], True
    if kind == "none":
        for key in ("secret_env", "header"):
            if key in value:
                ctx.error(child(path, key), f"kind 'none' takes no {key}")
                ok = False
        return ok
    if "secret_env" not in value:
        ctx.error(
            child(path, "secret_env"),
            f"required for kind {kind!r}: name the environment variable that holds "
            "the secret (the secret itself never goes in the file)",
        )
        ok = False
    if kind == "header" and "header" not in value:
        ctx.error(child(path, "header"), "required for kind 'header': the header that carries the secret")
        ok = False
    if kind != "header" and "header" in value:
        ctx.error(child(path, "header"), f"only for kind 'header' (this auth is {kind!r})")
        ok = False
    return ok and passed >= set(value)


def _status_map(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, dict) or not value:
        ctx.error(path, "must map the provider's status strings to committed, not_committed or pending")
        return False
    ok = True
    for status, observed in value.items():
        if not status or len(status) > 64:
            ctx.error(child(path, status), "a provider status must be 1 to 64 characters")
            ok = False
        ok = choice(*OBSERVATIONS)(ctx, observed, child(path, status)) and ok
    if ok and "committed" not in value.values():
        ctx.error(path, "no status maps to committed: a reconciled call could never be confirmed")
        ok = False
    return ok


def _compensation_args(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, dict):
        ctx.error(path, "must be an object: the compensation's arguments, with {placeholders}")
        return False
    return body_template(ctx, value, path)


def _scalars(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, list) or not value or not all(is_json_scalar(v) for v in value):
        ctx.error(path, "must be a non-empty list of strings, numbers, booleans or null")
        return False
    return True


def _invariants(ctx: Context, value: Any, path: str) -> bool:
    if not isinstance(value, list):
        ctx.error(path, "must be a list of {result, equals_arg | one_of | minimum}")
        return False
    ok = True
    for i, item in enumerate(value):
        where = child(path, i)
        passed = check_object(ctx, item, where, INVARIANT, "an invariant")
        if passed is None:
            ok = False
            continue
        tests = [key for key in ("equals_arg", "one_of", "minimum") if key in item]
        if len(tests) != 1:
            ctx.error(where, f"needs exactly one of equals_arg, one_of, minimum (has {', '.join(tests) or 'none'})")
            ok = False
        ok = ok and passed >= set(item)
    return ok


# --- the objects of a registry file, key by key ----------------------------------------------------------------------


RATE = number(above=0, maximum=1)
CODES = string_list(string(100, empty=False))

TENANT = {
    "name": Key(name(64), required=True),
    "display_name": Key(string(200)),
    "sandbox": Key(boolean),
    "tools": Key(_tenant_tools),
}

AUTH = {
    "kind": Key(choice("none", "bearer", "header", "basic"), required=True),
    "secret_env": Key(env_name),
    "header": Key(header_name),
}
STATUS_BREAKER = {
    "window_s": Key(integer(1)),
    "min_calls": Key(integer(1)),
    "failure_rate": Key(RATE),
    "cooldown_s": Key(integer(1)),
}
PROVIDER = {
    "name": Key(name(64), required=True),
    "base_url": Key(base_url),  # required unless the provider is an MCP server (check_mcp_provider)
    "connect_timeout_s": Key(number(above=0, maximum=600)),
    "read_timeout_s": Key(number(above=0, maximum=600)),
    "auth": Key(_auth),
    "callback_secret_env": Key(env_name),
    "idempotency_conflict_codes": Key(CODES),
    "status_breaker": _nested(STATUS_BREAKER, "status_breaker"),
    # Where a reply carries its error code, first match wins (default: code, then error.code), and the header that
    # carries the provider's request id (default X-Request-Id): docs/providers.md.
    "error_code_paths": Key(string_list(answer_path, nonempty=True)),
    "request_id_header": Key(header_name),
    "mcp": _nested(MCP_PROVIDER, "an MCP server"),
}

REQUEST = {
    "method": Key(choice(*METHODS), required=True),
    "path": Key(template_path, required=True),
    "encoding": Key(choice(*ENCODINGS)),  # the body's: json (default), form (Stripe's), none (query parameters only)
    "body": Key(body_template),
    "query": Key(query_template),
    "key": Key(key_place),  # default: the Idempotency-Key header for a write, nowhere for a read
}
STATUS_QUERY = {
    "method": Key(choice("GET", "POST")),  # method and path: required unless the lookup is a replay
    "path": Key(template_path),
    "status_map": Key(_status_map),  # required for a lookup of kind "key" (recovery.registry.lookup)
    "status_field": Key(dotted),  # where the provider's status string is in the answer (default "status")
    "effects_field": Key(dotted),  # where it reports how many business effects the key has (optional)
    **LOOKUP_KEYS,
}
RECONCILE = {
    "first_check_s": Key(integer(0)),
    "backoff": Key(number(minimum=1, maximum=10)),
    "max_checks": Key(integer(1)),
    "deadline_s": Key(integer(1)),
    # Replay reconciliation (docs/replay.md): when the status query cannot answer, one same-key replay settles the call.
    # Only for a replay-safe write with an explicit key_retention_s, and only once a duplicate probe proved it.
    "replay_when_status_down": Key(boolean),
}
COMPENSATION = {
    "tool": Key(name(100), required=True),
    "args": Key(_compensation_args),
}
BUDGETS = {
    "max_attempts": Key(integer(1)),
    "write_retry": Key(integer(0)),
    "unknown_budget": Key(integer(0)),
    "max_business_effects": Key(integer(1)),
}
BACKOFF = {
    "base_ms": Key(integer(1)),
    "cap_ms": Key(integer(1)),
    "jitter": Key(choice("proportional", "full")),
}
BREAKER = {
    "window_s": Key(integer(1)),
    "bucket_s": Key(integer(1)),
    "min_calls": Key(integer(1)),
    "failure_rate": Key(RATE),
    "cooldown_s": Key(integer(1)),
    "half_open_probes": Key(integer(1)),
    "probe_lease_s": Key(integer(1)),
}
INVARIANT = {
    "result": Key(dotted, required=True),
    "equals_arg": Key(dotted),
    "one_of": Key(_scalars),
    "minimum": Key(number()),
}


TOOL = {
    "name": Key(name(100), required=True),
    "provider": Key(name(64), required=True),
    "description": Key(string(2000)),
    "request": _nested(REQUEST, "request"),  # required unless the tool is an MCP server's (check_mcp_tool)
    "mcp": _nested(MCP_TOOL, "an MCP tool"),
    "side_effect": Key(choice("read", "write"), required=True),
    "risk": Key(choice("low", "high")),
    "replay_safe": Key(boolean),
    "provider_ref_field": Key(dotted),
    "key_template": Key(string(200, empty=False)),
    "args_schema": Key(json_schema(arguments=True), required=True),
    "result_schema": Key(json_schema()),
    "required_result_fields": Key(string_list(dotted)),
    "max_result_age_s": Key(integer(1)),
    "result_time_field": Key(dotted),
    "invariants": Key(_invariants),
    "approvable_codes": Key(CODES),
    "refusal_codes": Key(CODES),
    "alternates": Key(string_list(name(100))),
    "outcome_timeout_s": Key(integer(1, 86_400)),
    "key_retention_s": Key(integer(1)),
    "status_query": _nullable(_nested(STATUS_QUERY, "status_query")),
    "reconcile": _nested(RECONCILE, "reconcile"),
    "compensation": _nested(COMPENSATION, "compensation"),
    "budgets": _nested(BUDGETS, "budgets"),
    "backoff": _nested(BACKOFF, "backoff"),
    "breaker": _nested(BREAKER, "breaker"),
    "fallback": Key(name(100)),
    "exhausted_to_review": Key(boolean),
}
WRITE_ONLY = ("status_query", "reconcile", "compensation")
WRITE_ONLY_BUDGETS = ("write_retry", "unknown_budget", "max_business_effects")


# --- cross-field rules of a tool ------------------------------------------------------------------------------------


def _argument_names(tool: dict, passed: set[str]) -> frozenset[str] | None:
    """The argument names the schema declares, or None when it does not list them (no placeholder check then)."""
    if "args_schema" not in passed or not isinstance(tool["args_schema"].get("properties"), dict):
        return None
    return frozenset(tool["args_schema"]["properties"])


def _check_placeholders(ctx: Context, template: Any, path: str, allowed, roots: frozenset[str]) -> None:
    for where, text in template_strings(template, path):
        for placeholder in placeholders(text):
            if not PLACEHOLDER_NAME_RE.fullmatch(placeholder):
                ctx.error(where, f"{{{placeholder}}} is not a placeholder: use {{argument}} or {{a.b}}")
                continue
            root = placeholder.split(".")[0]
            if root in roots or allowed is None or root in allowed:
                continue
            known = ", ".join(sorted(roots | (allowed or set())))
            ctx.error(where, f"{{{placeholder}}} is not an argument of this tool (known: {known})")


def _check_key_template(ctx: Context, template: str, path: str, args: frozenset[str] | None) -> None:
    """A key template names arguments only, at least one: a template without one would make every call of the tool
    in a trace the same intent."""
    if not placeholders(template):
        ctx.error(path, "names no argument: every call of this tool in a trace would be one intent (e.g. {order_id})")
        return
    _check_placeholders(ctx, template, path, args, frozenset())


def _check_request(ctx: Context, tool: dict, path: str, args: frozenset[str] | None) -> None:
    request = tool["request"]
    _check_placeholders(ctx, request.get("path", ""), child(path, "path"), args, CALL_PLACEHOLDERS)
    check_request_wire(ctx, request, path, args)
    for key in ("body", "query"):
        if key in request:
            _check_placeholders(ctx, request[key], child(path, key), args, CALL_PLACEHOLDERS)


def _effective(data: dict, defaults: object, key: str):
    return data.get(key, getattr(defaults, key))


def _check_numbers(ctx: Context, tool: dict, path: str, passed: set[str]) -> None:
    if "backoff" in passed:
        backoff, where = tool["backoff"], child(path, "backoff")
        base, cap = _effective(backoff, BackoffPolicy, "base_ms"), _effective(backoff, BackoffPolicy, "cap_ms")
        if isinstance(base, int) and isinstance(cap, int) and cap < base:
            key = "cap_ms" if "cap_ms" in backoff else "base_ms"
            ctx.error(child(where, key), f"cap_ms ({cap}) must be at least base_ms ({base})")
    if "breaker" in passed:
        breaker, where = tool["breaker"], child(path, "breaker")
        window, bucket = _effective(breaker, BreakerPolicy, "window_s"), _effective(breaker, BreakerPolicy, "bucket_s")
        if isinstance(window, int) and isinstance(bucket, int) and window % bucket:
            key = "bucket_s" if "bucket_s" in breaker else "window_s"
            ctx.error(child(where, key), f"bucket_s ({bucket}) must divide window_s ({window}) exactly")
    if "reconcile" in passed:
        reconcile, where = tool["reconcile"], child(path, "reconcile")
        first, deadline = reconcile.get("first_check_s", 0), reconcile.get("deadline_s")
        if isinstance(deadline, int) and isinstance(first, int) and deadline < first:
            ctx.error(
                child(where, "deadline_s"), f"the deadline ({deadline} s) comes before the first check ({first} s)"
            )
    if ("max_result_age_s" in tool) != ("result_time_field" in tool):
        missing = "result_time_field" if "max_result_age_s" in tool else "max_result_age_s"
        ctx.error(
            child(path, missing),
            "max_result_age_s and result_time_field go together: the age is read from that field of the result",
        )


def _check_references(ctx: Context, tool: dict, path: str, passed: set[str], args) -> None:
    own = tool.get("name")
    if "provider" in passed and tool["provider"] not in ctx.providers:
        ctx.error(child(path, "provider"), f"no provider {tool['provider']!r} in this file or the database")
    if "alternates" in passed:
        for i, other in enumerate(tool["alternates"]):
            where = child(child(path, "alternates"), i)
            if other == own:
                ctx.error(where, "a tool is not its own alternate")
            elif other not in ctx.tools:
                ctx.error(where, f"no tool {other!r} in this file or the database")
            elif ctx.tools[other].side_effect != tool.get("side_effect"):
                ctx.error(
                    where, f"{other!r} is a {ctx.tools[other].side_effect} tool: an alternate has the same side effect"
                )
    if "compensation" in passed:
        _check_compensation(ctx, tool, child(path, "compensation"), args)


def _check_compensation(ctx: Context, tool: dict, path: str, args) -> None:
    compensation = tool["compensation"]
    target = ctx.tools.get(compensation["tool"])
    if compensation["tool"] == tool.get("name"):
        ctx.error(child(path, "tool"), "a tool cannot compensate itself")
        return
    if target is None:
        ctx.error(child(path, "tool"), f"no tool {compensation['tool']!r} in this file or the database")
        return
    if target.side_effect != "write":
        ctx.error(child(path, "tool"), f"{compensation['tool']!r} is a read: a compensation undoes an effect")
    mapping = compensation.get("args", {})
    if not isinstance(mapping, dict):
        return
    _check_placeholders(ctx, mapping, child(path, "args"), args, COMPENSATION_ROOTS)
    schema = target.args_schema if isinstance(target.args_schema, dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    for missing in [key for key in required if isinstance(key, str) and key not in mapping]:
        ctx.error(child(path, "args"), f"{compensation['tool']} requires the argument {missing!r}")
    properties = schema.get("properties")
    if schema.get("additionalProperties") is False and isinstance(properties, dict):
        for extra in [key for key in mapping if key not in properties]:
            ctx.error(child(child(path, "args"), extra), f"{compensation['tool']} takes no argument {extra!r}")


def _replays_when_down(tool: dict) -> bool:
    reconcile = tool.get("reconcile")
    return isinstance(reconcile, dict) and reconcile.get("replay_when_status_down") is True


def _check_replay_reconcile(ctx: Context, tool: dict, path: str, passed: set[str]) -> None:
    """Replay reconciliation needs what makes a same-key replay a reconciliation: a write the provider deduplicates
    (replay_safe) and a retention the file states (no default can say how long the provider keeps a key)."""
    if "status_query" in passed and tool["status_query"] is None and not _replays_when_down(tool):
        ctx.error(
            child(path, "status_query"),
            "null only for a write settled by replay reconciliation (reconcile.replay_when_status_down: true): "
            "otherwise an unknown outcome is reconciled by querying the provider's status",
        )
    if not _replays_when_down(tool):
        return
    where = child(child(path, "reconcile"), "replay_when_status_down")
    if tool.get("replay_safe") is not True:
        ctx.error(where, "needs replay_safe: true: only a provider that deduplicates by key can answer a replay")
    if "key_retention_s" not in tool:
        ctx.error(
            child(path, "key_retention_s"),
            "required with reconcile.replay_when_status_down: how long the provider keeps a key decides which "
            "calls may be replayed, and no default can know it",
        )


def _check_side_effect(ctx: Context, tool: dict, path: str, passed: set[str]) -> None:
    if "side_effect" not in passed:
        return
    if tool["side_effect"] == "write":
        if "status_query" not in tool and "mcp" not in tool:  # an MCP tool's is its status_tool, or a person
            ctx.error(
                child(path, "status_query"),
                "required for a write tool: an unknown outcome is reconciled by "
                "querying the provider's status by idempotency key",
            )
        return
    for key in WRITE_ONLY:
        if key in tool:
            ctx.error(child(path, key), "only for write tools: a read has no effect to reconcile or compensate")
    budgets = tool.get("budgets") if isinstance(tool.get("budgets"), dict) else {}
    for key in WRITE_ONLY_BUDGETS:
        if key in budgets:
            ctx.error(child(child(path, "budgets"), key), "only for write tools")


def _check_tool(ctx: Context, tool: Any, path: str) -> None:
    passed = check_object(ctx, tool, path, TOOL, "a tool")
    if passed is None:
        return
    args = _argument_names(tool, passed)
    check_mcp_tool(ctx, tool, path)
    if "request" in passed:
        _check_request(ctx, tool, child(path, "request"), args)
    if "key_template" in passed:
        _check_key_template(ctx, tool["key_template"], child(path, "key_template"), args)
    if "status_query" in passed and tool["status_query"] is not None:
        check_status_query(ctx, tool, child(path, "status_query"), args)
    _check_replay_reconcile(ctx, tool, path, passed)
    if "invariants" in passed and args is not None:
        for i, invariant in enumerate(tool["invariants"]):
            arg = invariant.get("equals_arg")
            if arg is not None and arg.split(".")[0] not in args:
                where = child(child(child(path, "invariants"), i), "equals_arg")
                ctx.error(where, f"{arg!r} is not an argument of this tool")
    _check_side_effect(ctx, tool, path, passed)
    _check_numbers(ctx, tool, path, passed)
    _check_references(ctx, tool, path, passed, args)


# --- the whole file -------------------------------------------------------------------------------------------------


def _items(data: dict, kind: str) -> list:
    value = data.get(kind, [])
    return value if isinstance(value, list) else []


def _names(items: list) -> list[str]:
    return [item["name"] for item in items if isinstance(item, dict) and isinstance(item.get("name"), str)]


def _load_references(ctx: Context, data: dict) -> None:
    """Names a file may refer to: its own, and those already in the database (one query per kind, only if needed)."""
    tools = [item for item in _items(data, "tools") if isinstance(item, dict)]
    ctx.providers = set(_names(_items(data, "providers")))
    for tool in tools:
        if isinstance(tool.get("name"), str) and tool["name"] not in ctx.tools:
            ctx.tools[tool["name"]] = ToolRef(side_effect=tool.get("side_effect"), args_schema=tool.get("args_schema"))
    wanted_providers = {tool["provider"] for tool in tools if isinstance(tool.get("provider"), str)} - ctx.providers
    wanted_tools = _tools_named(data, tools) - set(ctx.tools)
    if wanted_providers:
        ctx.providers |= set(Provider.objects.filter(name__in=wanted_providers).values_list("name", flat=True))
    if wanted_tools:
        for row in Tool.objects.filter(name__in=wanted_tools).values("name", "side_effect", "args_schema"):
            ctx.tools[row["name"]] = ToolRef(side_effect=row["side_effect"], args_schema=row["args_schema"])


def _tools_named(data: dict, tools: list[dict]) -> set[str]:
    """The tools the file's tools (alternates, compensations) and tenants (capabilities) name."""
    named = set()
    for tool in tools:
        if isinstance(tool.get("alternates"), list):
            named.update(v for v in tool["alternates"] if isinstance(v, str))
        if isinstance(tool.get("compensation"), dict) and isinstance(tool["compensation"].get("tool"), str):
            named.add(tool["compensation"]["tool"])
    for tenant in _items(data, "tenants"):
        if isinstance(tenant, dict) and isinstance(tenant.get("tools"), list):
            named.update(v for v in tenant["tools"] if isinstance(v, str))
    return named


def _check_duplicates(ctx: Context, items: list, path: str) -> None:
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            if item["name"] in first:
                ctx.error(
                    child(child(path, i), "name"),
                    f"{item['name']!r} is already defined at {child(path, first[item['name']])}",
                )
            else:
                first[item["name"]] = i


def _check_json(ctx: Context, value: Any, path: str) -> None:
    """Values JSON cannot hold (NaN, infinities; from a caller that did not parse a file), wherever they are."""
    if isinstance(value, float) and not math.isfinite(value):
        ctx.error(path, "NaN and infinities are not JSON numbers")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                _check_json(ctx, item, child(path, key))
            else:
                ctx.error(path, f"object keys are strings in JSON (got {type(key).__name__})")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(ctx, item, child(path, i))
    elif not is_json_scalar(value):
        ctx.error(path, f"not a JSON value ({type(value).__name__})")


def validate_registry(data: Any) -> list[RegistryError]:
    """Every problem in a registry file, in file order; an empty list means it may be loaded."""
    ctx = Context()
    if not isinstance(data, dict):
        return [RegistryError(path="$", message="the registry is a JSON object with tenants, providers and tools")]
    _check_json(ctx, data, "$")
    if ctx.errors:
        return ctx.errors  # the checks below assume JSON values
    for key in data:
        if key not in KINDS:
            ctx.error(child("$", key), f"unknown key {key!r}; the registry has only tenants, providers and tools")
    for kind in KINDS:
        if kind in data and not isinstance(data[kind], list):
            ctx.error(child("$", kind), "must be a list of objects")
    _load_references(ctx, data)
    checks = {"tenants": (TENANT, "a tenant"), "providers": (PROVIDER, "a provider")}
    for kind in KINDS:
        items = _items(data, kind)
        _check_duplicates(ctx, items, child("$", kind))
        for i, item in enumerate(items):
            if kind == "tools":
                _check_tool(ctx, item, child(child("$", kind), i))
            else:
                check_object(ctx, item, child(child("$", kind), i), *checks[kind])
    check_mcp_providers(ctx, _items(data, "providers"))
    return ctx.errors

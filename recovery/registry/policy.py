"""The engine's view of a tool: `tool_policy(tool)` turns a Tool row into the frozen ToolPolicy the engine reads
(docs/registry.md), building value objects only: the provider comes with the row (select_related), the alternates
with `policy_tools()` or `with_alternates()`. Settings absent from the registry take the engine's defaults.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from django.db.models import Prefetch, QuerySet

from recovery.engine.reconcile import ReconcilePolicy, StatusBreakerPolicy
from recovery.engine.types import BackoffPolicy, BreakerPolicy, Budgets, Invariant, ToolPolicy
from recovery.models import Provider, Tool
from recovery.registry.mcp import needs_approval

TOOL_BUDGETS = ("max_attempts", "write_retry", "unknown_budget", "max_business_effects")
# The registry's `reconcile`.
RECONCILE_KEYS = ("first_check_s", "backoff", "max_checks", "deadline_s", "replay_when_status_down")


def policy_tools() -> QuerySet[Tool]:
    """Tools with what tool_policy() reads: two queries for any number of tools."""
    alternates = Prefetch("alternates", queryset=Tool.objects.only("id", "name"))
    return Tool.objects.select_related("provider").prefetch_related(alternates)


def with_alternates(tool: Tool, *, none: bool = False) -> Tool:
    """`tool` with its alternates' names read once into `Tool.alternate_names`, for every tool_policy() of this
    instance (one query; none when read already, or when the caller's own read said it has `none`). For instances
    that live as long as a request: alternates changed later are not seen through this one."""
    if none:
        tool.alternate_names = frozenset()
    elif tool.alternate_names is None:
        tool.alternate_names = frozenset(other.name for other in tool.alternates.all())
    return tool


def _build(cls: type, data: Any, keys: tuple[str, ...] | None = None):
    keys = keys or tuple(f.name for f in fields(cls))
    data = data if isinstance(data, dict) else {}
    return cls(**{key: data[key] for key in keys if key in data})


def _invariant(data: dict) -> Invariant:
    one_of = data.get("one_of")
    return Invariant(
        result=data["result"],
        equals_arg=data.get("equals_arg"),
        one_of=tuple(one_of) if one_of is not None else None,
        minimum=data.get("minimum"),
    )


def reconcile_policy(tool: Tool) -> ReconcilePolicy:
    """The tool's reconciliation schedule (first check, backoff, poll budget, deadline): no query."""
    return _build(ReconcilePolicy, tool.reconcile, RECONCILE_KEYS)


def status_breaker_policy(provider: Provider) -> StatusBreakerPolicy:
    """The breaker of the provider's status endpoint: no query."""
    return _build(StatusBreakerPolicy, provider.status_breaker)


def breaker_policy(tool: Tool) -> BreakerPolicy:
    """The tool's breaker policy alone: no query, for the breaker storage's hot paths (tool_policy reads more)."""
    return _build(BreakerPolicy, tool.breaker)


def tool_policy(tool: Tool) -> ToolPolicy:
    """The engine's view of `tool`: its alternates read now unless they came with it (policy_tools(),
    with_alternates())."""
    return ToolPolicy(
        name=tool.name,
        side_effect=tool.side_effect,
        risk=tool.risk,
        replay_safe=tool.replay_safe,
        retry_path=tool.retry_path,
        retry_path_key_age_s=tool.retry_path_key_age_s,
        provider_ref_field=tool.provider_ref_field,
        args_schema=tool.args_schema,
        result_schema=tool.result_schema,
        required_result_fields=tuple(tool.required_result_fields),
        max_result_age_s=tool.max_result_age_s,
        result_time_field=tool.result_time_field,
        invariants=tuple(_invariant(item) for item in tool.invariants),
        approvable_codes=frozenset(tool.approvable_codes),
        refusal_codes=frozenset(tool.refusal_codes),
        idempotency_conflict_codes=frozenset(tool.provider.idempotency_conflict_codes),
        error_code_paths=tuple(tool.provider.error_code_paths),
        alternates=with_alternates(tool).alternate_names,
        outcome_timeout_s=tool.outcome_timeout_s,
        key_retention_s=tool.key_retention_s,
        budgets=_build(Budgets, tool.budgets, TOOL_BUDGETS),
        backoff=_build(BackoffPolicy, tool.backoff),
        breaker=breaker_policy(tool),
        fallback=tool.fallback,
        exhausted_to_review=tool.exhausted_to_review,
        reconcile=reconcile_policy(tool),
        approval_required=needs_approval(tool),
    )

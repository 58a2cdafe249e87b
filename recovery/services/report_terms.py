"""When a runtime may hand its caller a 2xx before the console has judged it (docs/api.md#reporting-off-the-clock):
the terms an admission answers with. Never for a half-open breaker's probe (the breaker waits on its verdict) nor a
tool whose unknown_budget is 0 (one unsettled call of it stops the task); a deferred report is due within
min(5 s, outcome_timeout_s / 3).
"""

from __future__ import annotations

from recovery.models import Tool
from recovery.providers.requests import wire_of

MAX_DEFER_S = 5.0


def report_terms(tool: Tool, *, probe: bool) -> dict:
    """The admission answer's `report`: whether the report may wait, how long, and the checks a reply must pass."""
    budgets = tool.budgets if isinstance(tool.budgets, dict) else {}
    return {
        "may_defer": not probe and budgets.get("unknown_budget") != 0,
        "within_s": round(min(MAX_DEFER_S, tool.outcome_timeout_s / 3), 3),
        "required_result_fields": list(tool.required_result_fields or ()),
        "provider_ref_field": tool.provider_ref_field or "",
        "key_echo_header": wire_of(tool)["key_header"],
    }

"""GET /api/v1/metrics (docs/metrics.md, "JSON"): whose metrics a token asked for, and the answer.
A tenant that is not the token's and a tool none of its tenants may use answer 404, whether they exist or not.
"""

from __future__ import annotations

from recovery.models import ApiToken, TokenScope
from recovery.selectors.metrics import MetricsReport, tools_of_tenants
from recovery.services.errors import Refusal

# Who may read them: runtimes, and the tokens issued for dashboards and scrapers.
SCOPES = (TokenScope.RUNTIME, TokenScope.METRICS)


def metrics_scope(token: ApiToken, *, tenant: str | None, tool: str | None) -> tuple[tuple[int, ...], int | None]:
    """The tenant ids and the tool id (None: every tool) the request reads; one statement for a tool, none else."""
    tenants = list(token.tenant_list)  # read with the token
    if tenant is not None:
        tenants = [owner for owner in tenants if owner.name == tenant]
        if not tenants:
            raise _not_theirs("tenant", tenant, "Leave tenant out for the sum over the token's tenants, or name one.")
    tool_id = None
    if tool is not None:
        tool_id = tools_of_tenants(tenants).filter(name=tool).values_list("id", flat=True).first()
        if tool_id is None:
            raise _not_theirs("tool", tool, "Leave tool out, or use a name GET /api/v1/capabilities lists.")
    return tuple(sorted(owner.pk for owner in tenants)), tool_id


def _not_theirs(field: str, name: str, suggestion: str) -> Refusal:
    return Refusal(
        "not_found",
        f"no such {field} for this token's tenants",
        status=404,
        field_errors=[
            {
                "field": field,
                "expected": f"the name of a {field} of this token's tenants",
                "received": name,
                "suggestion": suggestion,
            }
        ],
    )


def metrics_answer(report: MetricsReport) -> dict:
    return {
        "window": report.window.key,
        "start": report.start.isoformat(),
        "end": report.end.isoformat(),
        "folded_at": report.folded_at.isoformat() if report.folded_at else None,
        "lag_s": report.lag_s,
        "step_s": report.window.step,
        "queues": report.queues,
        "figures": [
            {
                "key": value.figure.key,
                "title": value.figure.title,
                "kind": value.figure.kind,
                "doc": value.figure.doc,
                "unit": value.figure.unit,
                "value": value.value,
                "numerator": value.numerator,
                "denominator": value.denominator,
                "median": value.median,
                "count": value.count,
                "by_label": [{"label": label, "value": n} for label, n in value.by_label],
                "series": [{"start": point.start.isoformat(), "value": point.value} for point in value.series],
            }
            for value in report.figures
        ],
    }

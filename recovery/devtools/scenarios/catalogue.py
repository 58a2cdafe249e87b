"""The scenarios, in the order the demo plays and lists them (their numbers, which make their ids, follow it)."""

from __future__ import annotations

from recovery.devtools.scenarios.dependency_5xx_storm import dependency_5xx_storm
from recovery.devtools.scenarios.grant_unknown_budget import grant_unknown_budget
from recovery.devtools.scenarios.invalid_result import invalid_result
from recovery.devtools.scenarios.lost_before_commit import lost_before_commit
from recovery.devtools.scenarios.needs_approval import needs_approval
from recovery.devtools.scenarios.no_submission import no_submission
from recovery.devtools.scenarios.order_payment_shipment import order_payment_shipment
from recovery.devtools.scenarios.play import Scenario
from recovery.devtools.scenarios.rate_limited_lookup import rate_limited_lookup
from recovery.devtools.scenarios.reply_lost_after_commit import reply_lost_after_commit
from recovery.devtools.scenarios.saga_cancel_refused import saga_cancel_refused
from recovery.devtools.scenarios.saga_compensated import saga_compensated
from recovery.devtools.scenarios.status_api_down import status_api_down

SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        reply_lost_after_commit,
        lost_before_commit,
        rate_limited_lookup,
        invalid_result,
        order_payment_shipment,
        grant_unknown_budget,
        needs_approval,
        saga_compensated,
        saga_cancel_refused,
        no_submission,
        status_api_down,
        dependency_5xx_storm,
    )
}

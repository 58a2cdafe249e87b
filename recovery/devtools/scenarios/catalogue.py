"""The scenarios, in the order the demo plays and lists them (their numbers, which make their ids, follow it)."""

from __future__ import annotations

from recovery.agent.scenarios.dependency_5xx_storm import dependency_5xx_storm
from recovery.agent.scenarios.grant_unknown_budget import grant_unknown_budget
from recovery.agent.scenarios.invalid_result import invalid_result
from recovery.agent.scenarios.lost_before_commit import lost_before_commit
from recovery.agent.scenarios.needs_approval import needs_approval
from recovery.agent.scenarios.no_submission import no_submission
from recovery.agent.scenarios.order_payment_shipment import order_payment_shipment
from recovery.agent.scenarios.play import Scenario
from recovery.agent.scenarios.rate_limited_lookup import rate_limited_lookup
from recovery.agent.scenarios.reply_lost_after_commit import reply_lost_after_commit
from recovery.agent.scenarios.saga_cancel_refused import saga_cancel_refused
from recovery.agent.scenarios.saga_compensated import saga_compensated
from recovery.agent.scenarios.status_api_down import status_api_down

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

"""The demo agent's scenarios: each one a small task run by the Agent through the real API, against the sandbox
provider with one fault injected, ending in a pinned, checkable end.

    results = run_scenarios(stage, ["reply-lost-after-commit"], log=print)
    assert all(result.passed for result in results)

A scenario takes a Stage (recovery/devtools/drills/stage.py: the API's URL and a token, the sandbox, the registry) and a
log callable, and returns a ScenarioResult whose checks compare what it expected with what it observed — read back from
the console's API (GET /calls/{id}, GET /tasks/{id}) and from the sandbox's own evidence (its ledger of business
effects, its request log), never from the product's models: this is the agent's side of the wire, and it imports
nothing but the runtime and the client.

Faults are scoped to the scenario's own idempotency keys (writes) or to its own order ids (reads, whose routes name
the order), so scenarios run side by side, and next to anyone else's work on the same sandbox, without meeting.
The one exception is a circuit breaker, which is shared by design: the 5xx storm opens order.lookup's, so it runs
alone, after the others (`Scenario.exclusive`), and leaves the breaker closed again by a half-open probe once the
cooldown has passed (3 s on the drill registry, 20 s on the shipped one); the status-API-down refund fails its
checks on purpose, which counts against the provider's status-endpoint breaker, so it runs alone too. That refund is
left in HUMAN_REVIEW for the demo's reviewer and approver to replay with its own key (docs/demo-agent.md).

The same scenarios run on the drill stage (quick reconcile schedules; what the tests use) and on the demo stage
(`make run`'s console and sandbox with the shipped registry's production schedules: a refund's first status check
after 5 s, a payment's after 3 s, a grant's after 2 s).

One module per scenario: its Scenario declared (`@scenario(name=..., title=..., pinned_end=...)`, or
`@exclusive_scenario` for one that runs alone) over the function that plays it. `play` is what every scenario is
given (Play: its agent, its result, its checks), `checks` how a check compares what was expected with what was
observed, `shared` what several scenarios use, `catalogue` their order and `running` how they are run.
"""

from recovery.devtools.scenarios.catalogue import SCENARIOS
from recovery.devtools.scenarios.checks import Check
from recovery.devtools.scenarios.play import Scenario, ScenarioResult
from recovery.devtools.scenarios.running import run_scenario, run_scenarios

__all__ = ["SCENARIOS", "Check", "Scenario", "ScenarioResult", "run_scenario", "run_scenarios"]

"""The demo agent's scenarios (docs/demo-agent.md): each a small task run by the Agent through the real API against
the sandbox with one fault injected, judged from the console's API and the sandbox's evidence, never the product's
models (this is the agent's side of the wire). One module per scenario (`@scenario` / `@exclusive_scenario` for one
that runs alone: a shared breaker); `play`, `checks`, `shared`, `catalogue` and `running` serve them all.
"""

from recovery.devtools.scenarios.catalogue import SCENARIOS
from recovery.devtools.scenarios.checks import Check
from recovery.devtools.scenarios.play import Scenario, ScenarioResult
from recovery.devtools.scenarios.running import run_scenario, run_scenarios

__all__ = ["SCENARIOS", "Check", "Scenario", "ScenarioResult", "run_scenario", "run_scenarios"]

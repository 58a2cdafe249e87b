"""`manage.py demo_agent [--scenario NAME ...] [--list]`: the demo agent plays its scenarios against the console and
sandbox `make run` started, with a token for the demo tenant issued for the run (and revoked) unless --token is given;
exits non-zero when any scenario did not end as pinned (docs/demo-agent.md).
"""

from __future__ import annotations

import threading
import uuid

import requests
from django.core.management.base import BaseCommand, CommandError
from recovery_client import RecoveryClient, RecoveryError

from recovery.audit.chain import Actor
from recovery.devtools.drills.stage import DEMO_TENANT, demo_stage
from recovery.devtools.scenarios import SCENARIOS, ScenarioResult, run_scenarios
from recovery.services.tokens import token_create, token_revoke

START_FIRST = "start `make run` first"


class Command(BaseCommand):
    help = "Run the demo agent's scenarios against the running console and sandbox (start `make run` first)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--scenario",
            action="append",
            dest="scenarios",
            choices=list(SCENARIOS),
            metavar="NAME",
            help="a scenario to run (repeat for several; default: all). See --list.",
        )
        parser.add_argument(
            "--list", action="store_true", dest="list_only", help="list the scenarios and their pinned ends, then exit"
        )
        parser.add_argument("--api", default="http://127.0.0.1:8000", help="the console's URL (default %(default)s)")
        parser.add_argument(
            "--token", help="an API token for the demo tenant (default: issue one for this run, revoked at the end)"
        )

    def handle(self, *args, scenarios, list_only: bool, api: str, token: str | None, **options):
        if list_only:
            for scenario in SCENARIOS.values():
                alone = " (runs alone: it opens a shared breaker)" if scenario.exclusive else ""
                self.stdout.write(f"{scenario.name:<24} {scenario.title}{alone}\n{'':<24} → {scenario.pinned_end}")
            return
        api = api.rstrip("/")
        _reachable(f"{api}/api/v1/openapi.json", f"the console at {api}")
        issued = None
        if not token:
            issued = f"demo-agent-{uuid.uuid4().hex[:8]}"
            try:
                _, token = token_create(name=issued, tenants=[DEMO_TENANT], actor=Actor.system("demo_agent"))
            except ValueError as exc:
                raise CommandError(f"cannot issue a token for the demo tenant ({exc}); {START_FIRST}") from None
        try:
            results = self.play(api, token, scenarios, issued=bool(issued))
        finally:
            if issued:
                token_revoke(name=issued, actor=Actor.system("demo_agent"))
        self.table(results)
        failed = [result.name for result in results if not result.passed]
        if failed:
            raise CommandError(f"{len(failed)} scenario(s) did not end as pinned: {', '.join(failed)}")

    def play(self, api: str, token: str, names: list[str] | None, *, issued: bool) -> list[ScenarioResult]:
        stage = demo_stage(api, token)
        _reachable(f"{stage.sandbox.url}/_sandbox/health", f"the sandbox provider at {stage.sandbox.url}")
        try:
            RecoveryClient(api, token).capabilities(stage.tenant)
        except RecoveryError as exc:
            why = (
                "the token this command issued is in its own database: the console must serve the same one "
                "(DATABASE_URL / RECOVERY_VAR_DIR), or pass --token"
                if issued
                else f"pass a live token for the {stage.tenant} tenant"
            )
            raise CommandError(f"the console at {api} refused the token ({exc.status} {exc.code}): {why}") from None
        lock = threading.Lock()

        def log(line: str) -> None:
            with lock:
                self.stdout.write(line)
                self.stdout.flush()

        self.stdout.write(
            f"demo agent: tenant {stage.tenant} at {api}, sandbox {stage.sandbox.url}, run {stage.run_id}"
        )
        return run_scenarios(stage, names, log)

    def table(self, results: list[ScenarioResult]) -> None:
        rows = [("scenario", "checks", "end")]
        for result in results:
            mark = "" if result.passed else "  ← NOT as pinned"
            rows.append((result.name, result.score, (result.end or result.error) + mark))
        widths = [max(len(row[column]) for row in rows) for column in range(2)]
        self.stdout.write("")
        for number, (name, score, end) in enumerate(rows):
            self.stdout.write(f"{name:<{widths[0]}}  {score:>{widths[1]}}  {end}")
            if number == 0:
                self.stdout.write(f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * 3}")
        for result in results:
            for check in result.checks:
                if not check.passed:
                    self.stdout.write(f"{result.name}: {check}")


def _reachable(url: str, what: str) -> None:
    try:
        response = requests.get(url, timeout=(3, 10))
    except requests.RequestException as exc:
        raise CommandError(f"{what} is not reachable ({type(exc).__name__}): {START_FIRST}") from None
    if response.status_code != 200:
        raise CommandError(f"{what} answered {url} with HTTP {response.status_code}, not as expected: {START_FIRST}")

"""The client against a live console and its sandbox provider (_console.py names them): the versions both sides
check, the API loop an agent writes by hand, and the runtime loop that obeys required_next."""

from __future__ import annotations

import os
import tempfile
import unittest
import urllib.parse
from typing import Any

import recovery_client
import requests
from _console import API_URL, SANDBOX_URL, TENANT, TOKEN, effects, fault, needs_console, refund_request, tool, unique
from recovery_client import (
    API_VERSION_HEADER,
    IncompatibleConsole,
    NotAdmitted,
    RecoveryClient,
    facts_from_exception,
    facts_from_response,
    speaks,
)
from recovery_client.runtime import COMMITTED, Runtime


@needs_console
class Versions(unittest.TestCase):
    def test_every_answer_names_a_version_this_client_speaks(self) -> None:
        answers = [
            requests.get(f"{API_URL}/api/v1/openapi.json", timeout=10),
            requests.get(f"{API_URL}/api/v1/tasks/1", headers={"Authorization": "Bearer wrong"}, timeout=10),
            requests.get(f"{API_URL}/api/v1/no/such/route", timeout=10),
        ]
        self.assertEqual([a.status_code for a in answers], [200, 401, 404])
        self.assertTrue(all(speaks(a.headers.get(API_VERSION_HEADER)) for a in answers), [a.headers for a in answers])
        info = answers[0].json()["info"]
        self.assertEqual(info["version"], answers[0].headers[API_VERSION_HEADER])

    def test_a_console_that_no_longer_serves_this_client_version_answers_426_and_the_client_raises(self) -> None:
        client = RecoveryClient(API_URL, TOKEN)
        client.session.headers["User-Agent"] = "recovery-console-client/0.0.1"  # what a client of long ago sends
        with self.assertRaises(IncompatibleConsole) as refused:
            client.create_task(TENANT, unique("too-old"), agent="client-tests", goal="never opened")
        self.assertEqual(refused.exception.client, recovery_client.__version__)
        self.assertIsNotNone(refused.exception.oldest_client)
        self.assertTrue(speaks(refused.exception.console))

    def test_a_netrc_entry_for_the_console_never_replaces_the_token(self) -> None:
        # requests would send a ~/.netrc login for the host as Basic auth instead of the Bearer token: a 401 that
        # only shows on machines with such a file. The client reads the environment once, and not that file.
        host = urllib.parse.urlsplit(API_URL).hostname
        with tempfile.TemporaryDirectory() as home:
            netrc = os.path.join(home, ".netrc")
            with open(netrc, "w") as out:
                out.write(f"machine {host} login someone password something\n")
            os.chmod(netrc, 0o600)
            before = os.environ.get("NETRC")
            os.environ["NETRC"] = netrc
            try:
                client = RecoveryClient(API_URL, TOKEN)
                task = client.create_task(TENANT, unique("netrc"), agent="client-tests", goal="token, not netrc")
            finally:
                os.environ.pop("NETRC") if before is None else os.environ.update(NETRC=before)
        self.assertEqual(task.status, "open")

    def test_a_server_that_is_not_a_console_is_refused_before_its_answer_is_read(self) -> None:
        with self.assertRaises(IncompatibleConsole) as refused:
            RecoveryClient(SANDBOX_URL, TOKEN).create_task(TENANT, unique("nowhere"), agent="client-tests", goal="g")
        self.assertEqual((refused.exception.client, refused.exception.console), (recovery_client.__version__, None))


@needs_console
class ApiLoop(unittest.TestCase):
    def setUp(self) -> None:
        self.client = RecoveryClient(API_URL, TOKEN)
        self.addCleanup(self.client.session.close)

    def test_admit_send_report_commits_a_refund_once_and_the_task_submits(self) -> None:
        task = self.client.create_task(TENANT, unique("loop"), agent="client-tests", goal="refund once")
        key = unique("refund")
        call = self.client.add_call(
            task.id,
            step=1,
            tool=tool("refund.create"),
            arguments={"order_id": "O-7001", "amount_cents": 700},
            idempotency_key=key,
        )
        self.assertTrue(call.created)
        self.assertTrue(self.client.admit(call.call_id, "a1").admitted)
        try:
            facts = facts_from_response(refund_request(key, "O-7001", 700))
        except requests.RequestException as exc:
            facts = facts_from_exception(exc)
        answer = self.client.report(call.call_id, "a1", facts)

        self.assertEqual(answer.call_state, "COMMITTED")
        with self.assertRaises(NotAdmitted) as again:  # committed: never sent again
            self.client.admit(call.call_id, "a2")
        self.assertEqual(again.exception.gate["reason"], "committed")
        self.assertEqual(effects(key), 1)
        self.assertEqual(self.client.complete_task(task.id, "refunded").outcome, "completed")

    def test_a_preflight_failure_is_answered_with_the_field_to_repair(self) -> None:
        task = self.client.create_task(TENANT, unique("preflight"), agent="client-tests", goal="refund")
        call = self.client.add_call(
            task.id,
            step=1,
            tool=tool("refund.create"),
            arguments={"order_id": "O-7002", "amount_cents": -5},
            idempotency_key=unique("refund"),
        )
        self.assertFalse(call.preflight["passed"])
        self.assertEqual([e["field"] for e in call.preflight["field_errors"]], ["amount_cents"])
        self.assertIsNotNone(call.required_next)
        assert call.required_next is not None
        self.assertEqual(call.required_next["action"], "repair_args")


@needs_console
class RuntimeLoop(unittest.TestCase):
    def test_a_503_is_retried_when_the_console_says_so_and_the_refund_is_made_once(self) -> None:
        client = RecoveryClient(API_URL, TOKEN)
        self.addCleanup(client.session.close)
        lines: list[str] = []
        runtime = Runtime(client, tenant=TENANT, name="client-tests", log=lines.append, max_wait_s=10)
        task = runtime.start_task(unique("runtime"), goal="refund through the loop")
        key = unique("refund")
        fault(route="/refunds", kind="error", status=503, key=key)
        ref = client.add_call(
            task.id,
            step=1,
            tool=tool("refund.create"),
            arguments={"order_id": "O-7003", "amount_cents": 300},
            idempotency_key=key,
        )

        def send(number: int) -> tuple[dict[str, Any], Any]:
            try:
                facts = facts_from_response(refund_request(key, "O-7003", 300))
            except requests.RequestException as exc:
                facts = facts_from_exception(exc)
            return facts, facts.get("result")

        result = runtime.drive_call(
            task.id, ref.call_id, state=ref.state, tool=tool("refund.create"), key=key, send=send
        )

        self.assertEqual((result.outcome, result.state), (COMMITTED, "COMMITTED"), "\n".join(lines))
        self.assertEqual([a.facts.get("http_status") for a in result.sent], [503, 200])
        self.assertEqual(result.attempts[0].required_next["action"], "retry_after")
        self.assertEqual(effects(key), 1)


if __name__ == "__main__":
    unittest.main()

"""The recovered-tool decorator against a live console and its sandbox provider (_console.py names them): what the
model is handed, and the provider's own ledger."""

from __future__ import annotations

import unittest
from typing import Any

from _console import (
    API_URL,
    SANDBOX_API_KEY,
    SANDBOX_URL,
    TENANT,
    TOKEN,
    effects,
    fault,
    needs_console,
    order,
    tool,
    unique,
)
from recovery_client import RecoveryClient, recovered


def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund part or all of an order's payment."""
    reply = recovered.http().post(
        f"{SANDBOX_URL}/refunds",
        json={"order_id": order_id, "amount_cents": amount_cents},
        headers={"Authorization": f"Bearer {SANDBOX_API_KEY}"},
    )
    reply.raise_for_status()
    answer: dict[str, Any] = reply.json()
    return answer


class OutsideATask(unittest.TestCase):
    def test_it_is_refused_and_nothing_is_sent(self) -> None:
        called: list[str] = []

        def never(order_id: str) -> None:
            called.append(order_id)

        answer = recovered.tool("refund.create", key="refund-{order_id}")(never)("O-1")
        self.assertEqual(answer["status"], "refused")
        self.assertEqual(answer["next"], "stop")
        self.assertEqual(called, [])


@needs_console
class Recovered(unittest.TestCase):
    def setUp(self) -> None:
        self.client = RecoveryClient(API_URL, TOKEN)
        self.addCleanup(self.client.session.close)
        self.tool = recovered.tool(tool("refund.create"), key="refund-{order_id}")(refund)

    def test_a_refund_whose_reply_is_lost_ends_committed_with_one_effect(self) -> None:
        order_id = order()
        with recovered.task(
            self.client, tenant=TENANT, external_id=unique("lost"), goal="refund", patience_s=60
        ) as task:
            key = f"{task.external_id}:refund-{order_id}"
            fault(route="/refunds", kind="commit_then_drop", key=key)
            answer = self.tool(order_id, 1250)
            again = self.tool(order_id, 1250)  # the model calls it again: the same call, never a second refund

        self.assertEqual(answer["status"], "committed", answer)
        self.assertIn("took effect", answer["message"])
        self.assertIsNone(answer["next"])
        self.assertEqual(again["status"], "committed", again)
        self.assertEqual(effects(key), 1)

    def test_an_invalid_argument_gets_the_repair_text_and_sends_nothing(self) -> None:
        order_id = order()
        with recovered.task(self.client, tenant=TENANT, external_id=unique("invalid"), goal="refund") as task:
            answer = self.tool(order_id, -5)
            key = f"{task.external_id}:refund-{order_id}"

        self.assertEqual((answer["status"], answer["next"]), ("blocked", "repair_args"), answer)
        self.assertIn("amount_cents", answer["message"])
        self.assertEqual(effects(key), 0)


if __name__ == "__main__":
    unittest.main()

"""A refund tool for LangChain, protected by Recovery Console (docs/recovered-tools.md).

Against what `make run` serves (the console on 127.0.0.1:8000, the sandbox provider on 127.0.0.1:8001):

    .venv/bin/python manage.py create_api_token examples --tenant demo          # prints the token once
    RECOVERY_TOKEN=rc_... .venv/bin/python docs/examples/langchain_tool.py --lose-reply

`--lose-reply` tells the sandbox to make the refund and drop its reply. The tool is invoked as LangChain invokes it
for a model's tool call (`tool.invoke` with the call: the answer is the ToolMessage the model reads next); bind it to
any chat model with `model.bind_tools([refund])`. The refund is made once: the sandbox's ledger for the key says so.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import uuid

import requests
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from recovery_client import RecoveryClient, recovered

API = os.environ.get("RECOVERY_API_URL", "http://127.0.0.1:8000")
TENANT = os.environ.get("RECOVERY_TENANT", "demo")
PROVIDER = os.environ.get("SANDBOX_URL", "http://127.0.0.1:8001")
PROVIDER_KEY = os.environ.get("SANDBOX_API_KEY", "sandbox-dev-key")


@tool(parse_docstring=True)
@recovered.tool("refund.create", key="refund-{order_id}")
def refund(order_id: str, amount_cents: int) -> dict:
    """Refund part or all of an order's payment.

    Args:
        order_id: The order to refund, e.g. O-8848.
        amount_cents: How much to refund, in cents.
    """
    reply = recovered.http().post(
        f"{PROVIDER}/refunds",
        json={"order_id": order_id, "amount_cents": amount_cents},
        headers={"Authorization": f"Bearer {PROVIDER_KEY}"},
        timeout=(2, 5),
    )
    reply.raise_for_status()
    return reply.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--order", default=f"O-{random.randint(10_000, 99_999)}", help="the order to refund")
    parser.add_argument("--lose-reply", action="store_true", help="the sandbox commits the refund, drops the reply")
    args = parser.parse_args()
    logging.basicConfig(format="  runtime: %(message)s")  # what the wrapper does, step by step
    logging.getLogger("recovery_client.recovered").setLevel(logging.INFO)
    token = os.environ.get("RECOVERY_TOKEN")
    if not token:
        sys.exit("Set RECOVERY_TOKEN (python manage.py create_api_token examples --tenant demo prints one).")
    if args.lose_reply:
        fault = {"route": "/refunds", "kind": "commit_then_drop", "times": 1}
        requests.post(f"{PROVIDER}/_sandbox/faults", json=fault, timeout=5).raise_for_status()

    print("the schema the model is given:", json.dumps(convert_to_openai_tool(refund)["function"]["parameters"]))
    client = RecoveryClient(API, token)
    goal = f"refund 1250 cents on order {args.order}"
    with recovered.task(
        client, tenant=TENANT, external_id=f"example-langchain-{uuid.uuid4().hex[:8]}", goal=goal
    ) as task:
        for number, amount in enumerate((-5, 1250), start=1):
            call = {
                "type": "tool_call",
                "id": f"call-{number}",
                "name": refund.name,
                "args": {"order_id": args.order, "amount_cents": amount},
            }
            message = refund.invoke(call)  # a ToolMessage: what the model reads next
            print(f"the model reads, for amount_cents={amount}:", message.content)
        task.submit(f"refunded order {args.order}")
    key = f"{task.external_id}:refund-{args.order}"
    ledger = requests.get(f"{PROVIDER}/_sandbox/ledger", params={"key": key}, timeout=5).json()
    print(f"the sandbox's ledger for {key}: {ledger.get('effects')} effect(s)")
    print(f"the task in the console: {API}/tasks/{task.id}/")


if __name__ == "__main__":
    main()

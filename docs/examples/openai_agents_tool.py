"""A refund tool for the OpenAI Agents SDK, protected by Recovery Console (docs/recovered-tools.md).

Against what `make run` serves (the console on 127.0.0.1:8000, the sandbox provider on 127.0.0.1:8001):

    .venv/bin/python manage.py create_api_token examples --tenant demo          # prints the token once
    RECOVERY_TOKEN=rc_... .venv/bin/python docs/examples/openai_agents_tool.py --lose-reply

`--lose-reply` tells the sandbox to make the refund and drop its reply. With OPENAI_API_KEY set, a real agent run lets
the model decide to call the tool; without it, the tool is invoked the way the SDK's runner invokes it once a model
asked for it (FunctionTool.on_invoke_tool), and the script prints what the model would read. Either way the refund
is made once: the sandbox's ledger for the key says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import uuid

import requests
from agents import Agent, FunctionTool, Runner, function_tool
from agents.tool_context import ToolContext
from recovery_client import RecoveryClient, recovered

API = os.environ.get("RECOVERY_API_URL", "http://127.0.0.1:8000")
TENANT = os.environ.get("RECOVERY_TENANT", "demo")
PROVIDER = os.environ.get("SANDBOX_URL", "http://127.0.0.1:8001")
PROVIDER_KEY = os.environ.get("SANDBOX_API_KEY", "sandbox-dev-key")


@function_tool
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


async def as_the_runner_would(tool: FunctionTool, arguments: dict) -> dict:
    """The SDK's own invocation of a function tool, with the arguments a model sent."""
    payload = json.dumps(arguments)
    context = ToolContext(context=None, tool_name=tool.name, tool_call_id="call-1", tool_arguments=payload)
    return await tool.on_invoke_tool(context, payload)


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

    print("the schema the model is given:", json.dumps(refund.params_json_schema))
    client = RecoveryClient(API, token)
    goal = f"refund 1250 cents on order {args.order}"
    with recovered.task(client, tenant=TENANT, external_id=f"example-openai-{uuid.uuid4().hex[:8]}", goal=goal) as task:
        if os.environ.get("OPENAI_API_KEY"):
            instructions = "Refund what the customer asks for, once; read the tool's message before going on."
            agent = Agent(name="support", instructions=instructions, tools=[refund])
            print(Runner.run_sync(agent, f"Please refund 1250 cents on order {args.order}.").final_output)
        else:
            for arguments in (
                {"order_id": args.order, "amount_cents": -5},
                {"order_id": args.order, "amount_cents": 1250},
            ):
                seen = asyncio.run(as_the_runner_would(refund, arguments))
                print(f"the model reads, for {json.dumps(arguments)}:", json.dumps(seen, indent=2))
        task.submit(f"refunded order {args.order}")
    key = f"{task.external_id}:refund-{args.order}"
    ledger = requests.get(f"{PROVIDER}/_sandbox/ledger", params={"key": key}, timeout=5).json()
    print(f"the sandbox's ledger for {key}: {ledger.get('effects')} effect(s)")
    print(f"the task in the console: {API}/tasks/{task.id}/")


if __name__ == "__main__":
    main()

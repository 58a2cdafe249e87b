"""A fault-injecting stdio MCP proxy for the gateway's tests and drill:
`python mcp_fault_proxy.py --control FILE -- CMD ARGS...` runs the upstream server CMD and relays newline-delimited
JSON-RPC both ways. Before each `tools/call` it reads FILE ({"fault", "tool", "once"}) and applies the fault to a call
of that tool (any tool when empty):

- drop_reply: forward it, wait for the upstream's answer, then drop it and close (the reply is lost);
- drop_before: close without forwarding it (it never reached the upstream);
- hang: forward it and never answer (past the caller's timeout);
- kill: forward it and kill the upstream before its answer can come back;
- kill_after_reply: forward it, wait for the upstream's answer (the effect is made), then kill the upstream and die
  without relaying it: the server process is gone mid-call as far as the gateway can tell;
- delay: forward it and hold the upstream's answer for 2 s before relaying it.

Every `tools/call` forwarded upstream is logged, one JSON line each, to FILE with the suffix .log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

DELAY_S = 2.0


def _fault(control: Path, name: str) -> str:
    try:
        spec = json.loads(control.read_text())
    except (OSError, ValueError):
        return ""
    if not spec.get("fault") or spec.get("tool") not in ("", None, name):
        return ""
    if spec.get("once", True):
        control.write_text("{}")
    return spec["fault"]


def _relay_up(upstream: subprocess.Popen, held: dict, lock: threading.Lock) -> None:
    """The upstream's messages to our stdout, each answer as its request's fault says."""
    for line in upstream.stdout:
        message = json.loads(line)
        with lock:
            fault = held.pop(message.get("id"), "") if "method" not in message else ""
        if fault == "drop_reply":
            os._exit(0)  # the answer came and is lost with the stream
        if fault == "kill_after_reply":
            upstream.kill()
            os._exit(137)  # as a process killed with SIGKILL ends
        if fault == "hang":
            continue
        if fault == "delay":
            time.sleep(DELAY_S)
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    control = Path(options.control)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    upstream = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    held: dict = {}  # request id → the fault its answer gets
    lock = threading.Lock()
    threading.Thread(target=_relay_up, args=(upstream, held, lock), daemon=True).start()
    for line in sys.stdin.buffer:
        message = json.loads(line)
        fault = ""
        if message.get("method") == "tools/call":
            fault = _fault(control, message["params"]["name"])
            if fault == "drop_before":
                os._exit(0)
            with control.with_suffix(".log").open("a") as log:
                params = message["params"]
                log.write(json.dumps({"name": params["name"], "arguments": params.get("arguments")}) + "\n")
            with lock:
                held[message.get("id")] = fault
        upstream.stdin.write(line)
        upstream.stdin.flush()
        if fault == "kill":
            upstream.kill()
            os._exit(0)
    upstream.kill()


if __name__ == "__main__":
    main()

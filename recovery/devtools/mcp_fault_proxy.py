"""A fault-injecting stdio MCP proxy for the gateway's tests and drill:
`python mcp_fault_proxy.py --control FILE -- CMD ARGS...` runs the upstream server CMD and relays newline-delimited
JSON-RPC both ways. Before each `tools/call` it reads FILE ({"fault", "tool", "once"}) and applies the fault to a call
of that tool (any tool when empty):

- drop_reply: forward it, wait for the upstream's answer, then drop it and close (the reply is lost);
- drop_before: close without forwarding it (it never reached the upstream);
- hang: forward it and never answer (past the caller's timeout);
- kill: forward it and kill the upstream before its answer can come back.

Every `tools/call` forwarded upstream is logged, one JSON line each, to FILE with the suffix .log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    control = Path(options.control)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    upstream = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    dropping: set = set()  # answers lost with the stream
    swallowed: set = set()  # answers never relayed, the stream kept open
    lock = threading.Lock()

    def relay_up() -> None:
        for line in upstream.stdout:
            message = json.loads(line)
            with lock:
                dropped, hung = message.get("id") in dropping, message.get("id") in swallowed
            if dropped:
                os._exit(0)  # the answer came and is lost with the stream
            if hung:
                continue
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
        os._exit(0)

    threading.Thread(target=relay_up, daemon=True).start()
    for line in sys.stdin.buffer:
        message = json.loads(line)
        fault = ""
        if message.get("method") == "tools/call":
            fault = _fault(control, message["params"]["name"])
            if fault == "drop_before":
                os._exit(0)
            with control.with_suffix(".log").open("a") as log:
                log.write(
                    json.dumps({"name": message["params"]["name"], "arguments": message["params"].get("arguments")})
                    + "\n"
                )
            if fault in ("drop_reply", "hang"):
                with lock:
                    (dropping if fault == "drop_reply" else swallowed).add(message.get("id"))
        upstream.stdin.write(line)
        upstream.stdin.flush()
        if fault == "kill":
            upstream.kill()
            os._exit(0)
    upstream.kill()


if __name__ == "__main__":
    main()

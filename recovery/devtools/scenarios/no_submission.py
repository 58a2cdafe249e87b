from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from recovery.devtools.scenarios.play import Play, scenario

DEADLINE_S = 6  # the task's deadline, from its start: the agent stops and outlives it (room for a busy machine)


@scenario(
    name="no-submission",
    title="a task that stops without submitting",
    pinned_end="flagged no_submission after its deadline",
)
def no_submission(play: Play) -> None:
    """A task with a deadline stops after one lookup, neither submitted nor abandoned: once the deadline has
    passed it is flagged no_submission, still open, its next action to submit or abandon."""
    key = play.key("lookup")
    order_id, _ = play.order_route("lookup", 1)
    deadline = datetime.now(UTC) + timedelta(seconds=DEADLINE_S)
    task_id = play.start(
        f"summarise order {order_id} within {DEADLINE_S} s", deadline=deadline.isoformat().replace("+00:00", "Z")
    )
    # The replica, not order.lookup: this scenario's lookup must not weigh on the breaker the others exercise.
    lookup = play.tool("order.lookup_replica")
    play.run_call("lookup", task_id, step=1, tool=lookup, key=key, arguments={"order_id": order_id})
    before = play.client.get_task(task_id).raw
    # Read after the deadline only on a machine too busy to make one lookup in DEADLINE_S.
    read_late = datetime.now(UTC) >= deadline
    play.log("  the agent stops here: no submission, no abandon")
    time.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + 0.5)
    after = play.client.get_task(task_id).raw

    if read_late:
        play.log("  (the first read came after the deadline on a busy machine: its flag is not checked)")
    else:
        play.check("flagged before the deadline", False, before["no_submission"])
    play.check("flagged after the deadline", True, after["no_submission"])
    play.check("task status", "open", after["status"])
    play.check("task outcome", None, after["outcome"])
    play.check("next action", "submit_or_abandon", after["next_action"].split(" ")[0])
    play.result.end = f"{after['status']}, no_submission after its {DEADLINE_S} s deadline"

from __future__ import annotations

from recovery.devtools.scenarios import shared
from recovery.devtools.scenarios.play import Play, scenario


@scenario(
    name="grant-unknown-budget",
    title="access grant with unknown budget 0, reply lost",
    pinned_end="the task's other writes refused until it settles",
)
def grant_unknown_budget(play: Play) -> None:
    """Two access grants in one task, on a tool that allows no unknown write (unknown budget 0), the first one's
    reply lost: the second is refused at admission until the first is committed by a receipt."""
    editor_key, viewer_key = play.key("grant-editor"), play.key("grant-viewer")
    user = f"U-{play.digits(1)}"
    play.fault(route="/access/grants", key=editor_key, kind="commit_then_drop", times=1)
    play.fault(route="/access/grants", key=editor_key, kind="delayed_callbacks", ms=shared.HOLD_CALLBACK_MS, times=1)
    task_id = play.start(f"onboard {user}: editor on the repository, viewer on the wiki")
    grant = play.tool("access.grant")
    editor_grant = {"user_id": user, "role": "editor", "resource": f"repo:{user}"}
    editor = play.run_call("editor", task_id, step=1, tool=grant, key=editor_key, arguments=editor_grant, patience_s=0)
    viewer_grant = {"user_id": user, "role": "viewer", "resource": f"wiki:{user}"}
    viewer = play.run_call("viewer", task_id, step=2, tool=grant, key=viewer_key, arguments=viewer_grant)
    outcome = play.submit(task_id, f"{user} onboarded")

    editor_call, _ = shared.check_held_until_settled(
        play, "first grant", editor, "second grant", viewer, "unknown_budget"
    )
    play.check("effects (editor, viewer)", [1, 1], [play.effects(editor_key), play.effects(viewer_key)])
    play.check("first grant write requests", 1, len(play.writes(editor_key)))
    play.check("task outcome", "completed", outcome)
    play.result.end = f"second grant held until the first was {editor_call['state']}, task {outcome}"

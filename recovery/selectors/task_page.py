"""The console's task page (docs/console.md, "The task page"): one task with its steps, facts, budgets and audit trail.
Its facts come from `task_summary`, the API's own reading; the chain is read once, so the events shown are the events
verified. A fixed number of statements whatever the task's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from recovery.audit.chain import AuditReport, chain_key, verify_chain
from recovery.models import AuditEvent, IdentitySource, McpCall, Task, TaskStatus
from recovery.selectors.compensations import effect_story, task_compensations
from recovery.selectors.observed import TaskObservation, task_observation
from recovery.selectors.tasks_calls import task_summary


@dataclass(frozen=True, kw_only=True)
class FactGroup:
    key: str  # the group's name in task_summary (and the API)
    title: str
    meaning: str
    calls: list[dict]
    # Shown even when empty: the confirmed / unknown / not executed facts (docs/design/tasks.md) are always answered.
    always: bool


# In the order a reader asks: what is done, what is still open, what did not happen.
_GROUPS = (
    ("done", "Confirmed", "Committed: the provider has the effect.", True),
    ("accepted_in_progress", "Accepted, in progress", "The provider accepted the work; not done yet.", True),
    ("unknown", "Unknown", "May or may not have happened: being reconciled with the provider, never retried.", True),
    ("needs_review", "Needs review", "Code cannot settle it: a person decides with the evidence.", True),
    ("not_executed", "Not executed", "Confirmed not done (failed permanently or not committed).", True),
    ("in_flight", "In flight", "An attempt was sent; its outcome is not reported yet.", False),
    ("pending", "Pending", "Not attempted yet, or waiting for a retry.", False),
    ("compensated", "Compensation", "Committed effects a saga undoes: each call says what became of its undo.", False),
)

_OUTCOME_MEANING = {
    "completed": "every call settled and the deliverable was submitted",
    "completed_with_unknowns": "submitted while some effects are still unknown",
    "failed": "nothing or not enough was done",
    "degraded": "finished on a fallback path",
    "abandoned": "the runtime or an operator gave up",
    "compensated": "aborted as a saga, and every committed step was undone",
}


@dataclass(frozen=True, kw_only=True)
class NextAction:
    code: str  # task_summary's next_action, as the API answers it
    text: str


@dataclass(frozen=True, kw_only=True)
class Bar:
    """One budget's use: `used` of `limit` (None: no limit) for a <meter>, which clamps what it draws; the template
    says the true numbers in words. The deadline's bar counts seconds from creation, and `delta` is the time left
    (or, when `over`, the time past it) as of now or of the task's closing."""

    key: str
    label: str
    unit: str
    used: int
    limit: int | None
    over: bool
    delta: timedelta | None = None
    closed: bool = False

    @property
    def drawn(self) -> bool:
        """A meter needs a range: a limit of 0 (one unsettled unknown blocks the writes) is said in words only."""
        return bool(self.limit)

    @property
    def low(self) -> float | None:
        """Where the meter turns to a warning colour (70 %), then to a bad one (`high`, 90 %)."""
        return None if self.limit is None else round(self.limit * 0.7, 2)

    @property
    def high(self) -> float | None:
        return None if self.limit is None else round(self.limit * 0.9, 2)


@dataclass(frozen=True, kw_only=True)
class TaskPage:
    task: Task
    summary: dict  # task_summary(task), as the API returns it, with each call's facts
    headline: str
    outcome_meaning: str
    settled_since: bool  # submitted with unknowns, every one of which has settled since
    steps: list[dict]
    facts: list[FactGroup]
    next_action: NextAction
    budget: list[Bar]
    events: list[AuditEvent]
    chain: str
    report: AuditReport
    observation: TaskObservation  # its observed calls and the spans of its trace (docs/recovered-tools.md)


def task_page(task_id: int, *, now: datetime) -> TaskPage | None:
    """Everything the task page shows, or None for an unknown id (11 statements, whatever the task's size)."""
    task = Task.objects.select_related("tenant").filter(pk=task_id).first()
    if task is None:
        return None
    summary = task_summary(task, with_facts=True)
    calls = {brief["call_id"]: brief for key, *_ in _GROUPS for brief in summary[key]}
    _chains(calls, task_compensations(task.pk))
    observation = task_observation(task.pk)
    for call_id, brief in calls.items():
        brief["observed"] = call_id in observation.observed_calls
        answer = observation.observed_calls.get(call_id)
        brief["admission"] = answer.text if answer else ""
    origins = McpCall.objects.filter(call__task_id=task.pk).values(
        "call_id", "server", "client_name", "client_version", "identity_source"
    )
    for origin in origins:  # the calls through the MCP gateway, marked as such wherever the page lists them
        if (brief := calls.get(origin["call_id"])) is not None:
            source = IdentitySource(origin["identity_source"])
            brief["mcp"] = {
                **origin,
                "client": f"{origin['client_name']} {origin['client_version']}".strip(),
                "source": source.label,
            }
    facts = [
        FactGroup(key=key, title=title, meaning=meaning, calls=summary[key], always=always)
        for key, title, meaning, always in _GROUPS
    ]
    chain = chain_key(task.pk)
    events = list(AuditEvent.objects.filter(chain=chain).order_by("chain_seq"))
    return TaskPage(
        task=task,
        summary=summary,
        headline=_headline(task, facts),
        outcome_meaning=_outcome_meaning(task.outcome, summary),
        settled_since=task.outcome == "completed_with_unknowns" and not _unsettled(summary),
        steps=_steps(summary, calls),
        facts=facts,
        next_action=NextAction(code=summary["next_action"], text=_next_action_text(summary)),
        budget=_budget(task, summary, now),
        events=events,
        chain=chain,
        report=verify_chain(chain, events=events),
        observation=observation,
    )


def _chains(calls: dict[int, dict], entries: dict[int, list]) -> None:
    """Each call's compensation entries and its effect's story, on its brief (the page's copy of the API's): every
    list of the page that shows the call shows them."""
    for call_id, brief in calls.items():
        own = entries.get(call_id, [])
        story = effect_story(
            call_state=brief["state"],
            forward_tool=brief["tool"],
            target=brief["provider_ref"] or brief["idempotency_key"],
            entries=own,
        )
        brief["story"] = story.headline if story else ""
        brief["story_detail"] = story.detail if story else ""
        brief["compensations"] = [
            {
                "number": e.number,
                "tool": e.tool.name,
                "state": e.state,
                "outcome": e.outcome,
                "idempotency_key": e.idempotency_key,
            }
            for e in own
        ]


def _steps(summary: dict, calls: dict[int, dict]) -> list[dict]:
    by_index = {step["index"]: step for step in summary["steps"]}
    blocked = set(summary["blocked_steps"])
    rows = []
    for step in summary["steps"]:
        rows.append(
            {
                "index": step["index"],
                "name": step["name"],
                "state": step["state"],
                "depends_on": [_dependency(by_index, index) for index in step["depends_on"]],
                "blocked": step["index"] in blocked,
                "blocked_by": [_dependency(by_index, i) for i in step["blocked_by_steps"]]
                if step["index"] in blocked
                else [],
                "calls": [calls[pk] for pk in step["calls"]],
            }
        )
    return rows


def _dependency(by_index: dict[int, dict], index: int) -> dict:
    return {"index": index, "name": by_index[index]["name"], "state": by_index[index]["state"]}


def _headline(task: Task, facts: list[FactGroup]) -> str:
    """The task in one line: its status and a count per group — never one word over a mix (docs/design/tasks.md)."""
    status = {TaskStatus.OPEN: "Open", TaskStatus.SUBMITTED: "Submitted", TaskStatus.ABANDONED: "Abandoned"}
    counts = [f"{len(group.calls)} {group.title.lower()}" for group in facts if group.calls]
    return " · ".join([status.get(task.status, task.status), *(counts or ["no calls yet"])])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _steps_text(indexes: list[int]) -> str:
    return f"step{'' if len(indexes) == 1 else 's'} {', '.join(str(i) for i in indexes)}"


def _next_action_text(summary: dict) -> str:
    code, blocked = summary["next_action"], summary["blocked_steps"]
    unsettled = len(summary["unknown"]) + len(summary["accepted_in_progress"])
    stay = _is(len(blocked), "stays", "stay")
    still_blocked = f" {_steps_text(blocked).capitalize()} {stay} blocked until then." if blocked else ""
    if code == "wait_for_compensation_review":
        n = sum(1 for c in summary["compensated"] if c["state"] in ("COMPENSATION_FAILED", "PARTIAL_COMPENSATED"))
        waiting = f"{_plural(n, 'failed undo')} {_is(n, 'waits', 'wait')}" if n else "its stopped undo waits"
        return (
            f"A person settles the saga: {waiting} in the compensation problems queue; the saga goes on once "
            f"{_is(n, 'it is', 'they are')} settled."
        )
    if code == "wait_for_compensation":
        return "Wait: the saga's committed steps are being undone, one at a time, the last step first."
    if code == "wait_for_human_review":
        n = len(summary["needs_review"])
        waiting = f"{_plural(n, 'call')} {_is(n, 'waits', 'wait')}"
        return f"A reviewer decides: {waiting} in the human-review queue.{still_blocked}"
    if code == "wait_for_reconcile" and summary["status"] != TaskStatus.OPEN:
        n = len(summary["unknown"])
        return f"The task is closed; {_plural(n, 'unknown call')} {_is(n, 'is', 'are')} still being reconciled."
    if code == "wait_for_reconcile":
        return (
            f"Wait for reconciliation: {_plural(unsettled, 'call')} unknown or accepted {_is(unsettled, 'is', 'are')}"
            f" being checked with the provider by idempotency key. Do not retry {_is(unsettled, 'it', 'them')}."
            + still_blocked
        )
    if code == "wait_for_dependencies":
        return f"Wait: {_steps_text(blocked)} {_is(len(blocked), 'is', 'are')} blocked until their dependencies commit."
    if code == "continue":
        n = len(summary["pending"]) + len(summary["in_flight"])
        return f"The agent continues: {_plural(n, 'call')} pending or in flight."
    if code.startswith("submit_or_abandon"):
        return "Past the deadline with no submission: the agent submits what was done, or abandons the task."
    if code == "submit":
        return "The agent submits the task: every call is settled."
    return "Nothing: the task is closed and every call is settled."


def _outcome_meaning(outcome: str, summary: dict) -> str:
    """What the recorded outcome means now: one submitted with unknowns whose calls have all settled since says so,
    rather than stand beside "every call is settled" as if they were still unknown."""
    meaning = _OUTCOME_MEANING.get(outcome, "")
    if outcome == "completed_with_unknowns":
        open_now = _unsettled(summary)
        if not open_now:
            return "submitted while some effects were still unknown; every one has settled since"
        return f"{meaning} (still unsettled: {_plural(open_now, 'call')})"
    return meaning


def _unsettled(summary: dict) -> int:
    return len(summary["unknown"]) + len(summary["accepted_in_progress"]) + len(summary["needs_review"])


def _is(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _budget(task: Task, summary: dict, now: datetime) -> list[Bar]:
    limits = task.budget or {}
    bars = [
        _bar("rounds", "Rounds", task.rounds_used, task.max_rounds, "rounds used"),
        _bar("tokens", "Tokens", task.tokens_used, task.token_budget, "tokens used"),
        _bar("write-retries", "Write retries", task.write_retries_used, limits.get("write_retry"), "retries used"),
    ]
    if limits.get("unknown_budget") is not None:
        unsettled = len(summary["unknown"])
        bars.append(_bar("unknowns", "Unknown budget", unsettled, limits["unknown_budget"], "unsettled"))
    bars.append(_deadline_bar(task, now))
    return bars


def _bar(key: str, label: str, used: int, limit: int | None, unit: str) -> Bar:
    over = limit is not None and used > limit
    return Bar(key=key, label=label, unit=unit, used=used, limit=limit, over=over)


def _deadline_bar(task: Task, now: datetime) -> Bar:
    if task.deadline is None:
        return Bar(key="deadline", label="Time to deadline", unit="s", used=0, limit=None, over=False)
    at = task.closed_at or now
    span = max(1, int((task.deadline - task.created_at).total_seconds()))
    over = at > task.deadline
    elapsed = span if over else min(span, max(0, int((at - task.created_at).total_seconds())))
    return Bar(
        key="deadline",
        label="Time to deadline",
        unit="s",
        used=elapsed,
        limit=span,
        over=over,
        delta=(at - task.deadline) if over else (task.deadline - at),
        closed=task.closed_at is not None,
    )

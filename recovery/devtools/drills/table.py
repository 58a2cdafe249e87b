"""The pinned expectations of the fault drills (docs/drills.md), as data: per drill what is injected, how every call
ends (its states after READY in the audit trail), the business effects per key, the checks its case must report and,
where it applies, its compensation entry's end (`compensation`), each step's own end (`steps`) and the service it
needs (`needs`). drills/judge.py compares a run with them; the drills read their numbers from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.devtools.drills.stage import KEYLESS_REFUND, REPLAYED_REFUND
from recovery.engine.compensation_states import EntryState
from recovery.engine.states import CallState

S, E = CallState, EntryState
ARROW = " → "

# The roles of the refunds in the two probe drills (their key rows' `step`).
UNPROBED = "unprobed"  # status-api-down: refund.create, never probed (replay reconciliation off)
PROBED = "probed"  # the committed refund a duplicate probe replays
REPLAYED = "replayed"  # status-api-down: settled by replay reconciliation
REPLY_LOST = "reply lost"  # provider-ignores-keys: its reply lost, its status API down
LOST_BEFORE_COMMIT = "lost before commit"  # provider-ignores-keys: dropped unexecuted, then a same-key retry

# What the drills inject, as the table's words say it.
RETRY_AFTER_S = 2  # the rate-limit drill's Retry-After
CALLBACK_COPIES = 3  # deliveries of one signed callback
BACKLOG_DEFAULT = 1000  # refunds the queue-backlog drill makes
ROUNDS_DEFAULT = 50  # rounds of the two-approvers drill


@dataclass(frozen=True, kw_only=True)
class End:
    """One acceptable end of a call: the exact states after READY (`path`), or any path ending in `state`; and, when
    `told` is set, what the console last told the runtime about the call — the required_next action of its last
    admission answer or decision card (e.g. `degrade`)."""

    path: tuple[str, ...] | None = None
    state: str = ""
    told: str = ""

    def matches(self, path: tuple[str, ...], told: str) -> bool:
        if self.path is not None and tuple(path) != self.path:
            return False
        if self.path is None and (path[-1] if path else S.READY) != self.state:
            return False
        return not self.told or told == self.told

    def describe(self) -> str:
        text = ARROW.join(self.path) if self.path is not None else f"… {self.state}"
        if self.path == ():
            text = S.READY
        return f"{text}, told: {self.told}" if self.told else text


@dataclass(frozen=True, kw_only=True)
class CompensationEnd:
    """How each call's compensation must end (docs/compensation.md): one ledger entry, whose states after pending are
    exactly `path` (as its audit trail records them), with `effects` business effects under its own key — `what` names
    them (a cancellation)."""

    path: tuple[str, ...]
    effects: int
    what: str

    def describe(self) -> str:
        return f"entry 1: {ARROW.join(self.path)}"

    def describe_effects(self) -> str:
        return f"{self.effects} {self.what}{'s' if self.effects != 1 else ''}"


@dataclass(frozen=True, kw_only=True)
class StepEnd:
    """One step of a drill whose steps end differently (a saga): how the step's call must end, the effects under
    its key, and how its compensation entry must end (None: nothing to undo, and no entry may be made)."""

    step: str  # the step's role, as the drill names its call (order, payment, shipment)
    end: End
    effects: int
    compensation: CompensationEnd | None = None

    def describe(self) -> str:
        undo = f"; {self.compensation.describe()}, {self.compensation.describe_effects()}" if self.compensation else ""
        return f"{self.step}: {self.end.describe()}, {self.effects} effect{'s' if self.effects != 1 else ''}{undo}"


# A saga's committed step, undone by the console's worker (docs/compensation.md): its call's path, and its entry's.
UNDONE = (S.SENT, S.COMMITTED, S.COMPENSATING, S.COMPENSATED)
CANCELLED = CompensationEnd(path=(E.SENT, E.COMMITTED), effects=1, what="cancellation")
REFUNDED = CompensationEnd(path=(E.SENT, E.COMMITTED), effects=1, what="refund")


@dataclass(frozen=True, kw_only=True)
class Drill:
    slug: str  # what `manage.py drill` takes
    name: str  # the row of docs/drills.md
    injected: str
    expected_end: str  # the table's words
    ends: tuple[End, ...]  # how each call may end (any one of them)
    effects: int  # business effects per key in the sandbox ledger (an MCP drill: in its server's own state)
    checks: tuple[str, ...]  # the extra checks its module must report, all holding
    needs: str = ""  # what the drill cannot run without ("redis", "mcp"): skipped with the reason when it is missing
    compensation: CompensationEnd | None = None  # each call's compensation entry, for the drills that undo a call
    steps: tuple[StepEnd, ...] = ()  # for a drill whose steps end differently: each step's own end (`ends` unused)

    def describe_end(self) -> str:
        if self.steps:
            return " | ".join(f"{step.step}: {step.end.describe()}" for step in self.steps)
        return " | ".join(end.describe() for end in self.ends)

    def step(self, name: str) -> StepEnd | None:
        """The table's end for the step of that role (None: the drill pins no such step)."""
        return next((step for step in self.steps if step.step == name), None)

    @property
    def path(self) -> tuple[str, ...]:
        """The one path every call takes (ValueError for a drill whose calls may end more than one way)."""
        (end,) = self.ends
        if end.path is None:
            raise ValueError(f"{self.slug}: its calls end in {end.state} by any path")
        return end.path

    @property
    def sends(self) -> int:
        """How many times each call is sent: the SENTs of its path."""
        return self.path.count(S.SENT)

    def sends_of(self, step: str = "") -> int:
        """How many times a call is sent: the SENTs of its path, or of its step's path in a drill of steps (ValueError
        for a step the table does not pin by its path)."""
        if not step:
            return self.sends
        pinned = self.step(step)
        if pinned is None or pinned.end.path is None:
            raise ValueError(f"{self.slug}: no path pinned for step {step!r}")
        return pinned.end.path.count(S.SENT)

    def expected_summary(self) -> str:
        if self.steps:
            steps = "; ".join(step.describe() for step in self.steps)
            return f"{steps}; {len(self.checks)} check{'s' if len(self.checks) != 1 else ''}"
        effects = f"{self.effects} effect{'s' if self.effects != 1 else ''} per key"
        if self.compensation is not None:
            undo = self.compensation
            effects += f"; {undo.describe()}, {undo.describe_effects()} under its key"
        return f"{self.describe_end()}; {effects}; {len(self.checks)} check{'s' if len(self.checks) != 1 else ''}"


DRILLS: dict[str, Drill] = {
    drill.slug: drill
    for drill in (
        Drill(
            slug="refused-before-send",
            name="refused before send",
            injected="the provider's port closed for the first refund attempt; facts taken from the real exception",
            expected_end="RETRYABLE → SENT → COMMITTED, same key; the sandbox logged no request for the first attempt",
            ends=(End(path=(S.SENT, S.RETRYABLE, S.SENT, S.COMMITTED)),),
            effects=1,
            checks=(
                "the first attempt's facts come from the real exception",
                "the sandbox logged no request for the first attempt",
                "the retry carried the same key",
            ),
        ),
        Drill(
            slug="timeout-after-send",
            name="timeout after send",
            injected="refund committed, reply dropped",
            expected_end="UNKNOWN → COMMITTED by a receipt; no second request",
            ends=(End(path=(S.SENT, S.UNKNOWN, S.COMMITTED)),),
            effects=1,
            checks=("settled by a receipt", "no second request"),
        ),
        Drill(
            slug="deferred-report-lost",
            name="deferred report lost",
            injected="refund committed and answered at once; the runtime dies before its deferred report leaves",
            expected_end="UNKNOWN (swept after the outcome timeout) → COMMITTED by a receipt; no second request",
            ends=(End(path=(S.SENT, S.UNKNOWN, S.COMMITTED)),),
            effects=1,
            checks=("the caller was answered before any report", "settled by a receipt", "no second request"),
        ),
        Drill(
            slug="lost-before-commit",
            name="lost before commit",
            injected="refund request dropped before the provider executed it, client timed out",
            expected_end="UNKNOWN → NOT_COMMITTED → RETRYABLE → SENT → COMMITTED, same key",
            ends=(End(path=(S.SENT, S.UNKNOWN, S.NOT_COMMITTED, S.RETRYABLE, S.SENT, S.COMMITTED)),),
            effects=1,
            checks=(
                "the client timed out",
                "the provider executed nothing for the first request",
                "a receipt proved it not committed before the retry",
                "the retry carried the same key",
            ),
        ),
        Drill(
            slug="duplicate-callbacks",
            name="duplicate callbacks",
            injected=f"the same signed callback delivered {CALLBACK_COPIES} times for an UNKNOWN refund",
            expected_end="COMMITTED; one receipt applied, one transition",
            ends=(End(path=(S.SENT, S.UNKNOWN, S.COMMITTED)),),
            effects=1,
            checks=(f"the provider delivered one event {CALLBACK_COPIES} times", "one receipt applied, one transition"),
        ),
        Drill(
            slug="rate-limit",
            name="rate limit",
            injected=f"429 with Retry-After {RETRY_AFTER_S} s, twice, on a lookup",
            expected_end="COMMITTED; the sandbox's request times show no attempt before its Retry-After",
            ends=(End(path=(S.SENT, S.RETRYABLE, S.SENT, S.RETRYABLE, S.SENT, S.COMMITTED)),),
            effects=0,
            checks=("the decision cards named the Retry-After", "no attempt before its Retry-After"),
        ),
        Drill(
            slug="dependency-5xx",
            name="dependency 5xx",
            injected="503 on every call to one tool",
            expected_end=(
                "failing calls end FAILED_PERMANENT (attempts spent) or are denied at admission with `degrade`; "
                "breaker open; after cooldown exactly one half-open probe reaches the provider"
            ),
            ends=(
                End(path=(S.SENT, S.RETRYABLE, S.SENT, S.RETRYABLE, S.SENT, S.FAILED_PERMANENT)),
                End(state=S.READY, told="degrade"),
                End(state=S.RETRYABLE, told="degrade"),
            ),
            effects=0,
            checks=(
                "the breaker opened",
                "while open, admission refused before anything was sent",
                "after cooldown exactly one half-open probe reaches the provider",
                "once the fault is gone, the next probe closes the breaker",
            ),
        ),
        Drill(
            slug="status-api-down",
            name="status API down",
            injected="refund committed, reply dropped, status endpoint 503: on refund.create (never probed), and on"
            f" {REPLAYED_REFUND} (replay-safe, replay_when_status_down, key_retention_s), whose retry path an"
            " approved duplicate probe of an earlier committed refund proved safe first",
            expected_end="STILL_UNKNOWN → HUMAN_REVIEW at the poll budget; for a tool with a probe-proven retry path"
            " and replay reconciliation on: COMMITTED by one `idempotent_replay` receipt, no person",
            ends=(),
            effects=1,
            steps=(
                StepEnd(step=UNPROBED, end=End(path=(S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW)), effects=1),
                # The refund the probe replays: the provider deduplicates, so the probe leaves one effect.
                StepEnd(step=PROBED, end=End(path=(S.SENT, S.COMMITTED)), effects=1),
                # One failed check (STILL_UNKNOWN), then the one same-key replay settles it.
                StepEnd(step=REPLAYED, end=End(path=(S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.COMMITTED)), effects=1),
            ),
            checks=(
                "no second request",
                "every check failed and counted toward the poll budget",
                "the duplicate probe ran as an approved probe_duplicate",
                "the probe proved the retry path safe for keys as old as the replayed one",
                "COMMITTED by one idempotent_replay receipt, no person",
                "2 write requests for the replayed key: the lost one and the replay",
            ),
        ),
        Drill(
            slug="queue-backlog",
            name="queue backlog",
            injected=f"{BACKLOG_DEFAULT:,} refunds committed with replies dropped",
            expected_end="all COMMITTED by receipts before their deadline; no call checked by two workers at once",
            ends=(End(path=(S.SENT, S.UNKNOWN, S.COMMITTED)),),
            effects=1,
            checks=(
                "all COMMITTED by receipts",
                "before their deadline",
                "no call checked by two workers at once",
            ),
        ),
        Drill(
            slug="worker-killed-mid-replay",
            name="worker killed mid-replay",
            injected=(
                "kill -9 of the RQ worker executing an approved same-key replay while the sandbox holds the replay's "
                "reply"
            ),
            expected_end="call swept to UNKNOWN → COMMITTED by a receipt; never replayed twice",
            # Reconciliation could not settle it (status API down, poll budget), a person replayed it, the worker
            # died with the reply held: the sweeper makes it UNKNOWN and a receipt settles it.
            ends=(
                End(
                    path=(S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW, S.SENT, S.UNKNOWN, S.COMMITTED),
                ),
            ),
            effects=1,
            checks=(
                "the worker was killed while the sandbox held the replay's reply",
                "the request was left EXECUTING, then INTERRUPTED, never re-run",
                "the sweeper moved the call SENT → UNKNOWN",
                "settled by a receipt",
                "one replay request in the sandbox's request log",
            ),
            needs="redis",
        ),
        Drill(
            slug="two-approvers",
            name="two approvers",
            injected=f"{ROUNDS_DEFAULT} rounds of two approvals at once (two approvers, a barrier) of one same-key"
            " replay each",
            expected_end="one execution per round",
            # Each refund is refused 403 `needs_approval` (nothing executed: HUMAN_REVIEW), then replayed once.
            ends=(End(path=(S.SENT, S.HUMAN_REVIEW, S.SENT, S.COMMITTED)),),
            effects=1,
            checks=(
                "two approvers at once in every round",
                "one approval and one refusal per round",
                "one execution per round",
                "one replay request per key",
            ),
        ),
        Drill(
            slug="provider-ignores-keys",
            name="provider ignores keys",
            injected=f"broken mode (ignore_keys) for one key of {KEYLESS_REFUND} (replay-safe, replay_when_status_down,"
            " key_retention_s): the refund commits, then a duplicate probe of it approved by a second person; then, for"
            " the same tool, a refund whose reply is lost while its status endpoint answers 503, and one dropped before"
            " commit, whose retry carries state_verified",
            expected_end="probe says `retry_path_unsafe`; automatic replay off for the tool",
            ends=(),
            effects=2,
            steps=(
                # The probed key holds the first refund and the probe's: the second effect is the evidence.
                StepEnd(step=PROBED, end=End(path=(S.SENT, S.COMMITTED)), effects=2),
                # Never replayed by reconciliation: a person settles it at the poll budget.
                StepEnd(step=REPLY_LOST, end=End(path=(S.SENT, S.UNKNOWN, S.STILL_UNKNOWN, S.HUMAN_REVIEW)), effects=1),
                # Proven not committed, but the same-key retry is denied `retry_path_unsafe`: the runtime is told stop.
                StepEnd(
                    step=LOST_BEFORE_COMMIT,
                    end=End(path=(S.SENT, S.UNKNOWN, S.NOT_COMMITTED, S.RETRYABLE), told="stop"),
                    effects=0,
                ),
            ),
            checks=(
                "the duplicate probe ran as an approved probe_duplicate",
                "the probe says retry_path_unsafe",
                "the probe's second effect is in the provider's ledger",
                "reconciliation never replayed the lost reply",
                "an operator's same-key replay is refused",
                "the runtime's retry after state_verified is denied retry_path_unsafe",
            ),
        ),
        Drill(
            slug="compensation-reply-lost",
            name="compensation reply lost",
            injected="an order created for real, undone by an approved start_compensation; the cancellation commits,"
            " its reply dropped",
            expected_end="original COMPENSATING → COMPENSATED by a receipt on the entry; no second cancel request",
            ends=(End(path=(S.SENT, S.COMMITTED, S.COMPENSATING, S.COMPENSATED)),),
            effects=1,
            compensation=CompensationEnd(path=(E.SENT, E.UNKNOWN, E.COMMITTED), effects=1, what="cancellation"),
            checks=(
                "started by an approved start_compensation",
                "no second cancel request",
                "settled by a receipt on the entry",
                "1 order, 1 cancellation in the sandbox ledger",
            ),
        ),
        Drill(
            slug="compensation-refused",
            name="compensation refused",
            injected="an order created for real, undone by an approved start_compensation; the provider answers the"
            " cancel 409 `not_cancellable` (already shipped)",
            expected_end="entry failed → original COMPENSATION_FAILED, in the Compensation problems queue; the cancel"
            " not retried",
            ends=(End(path=(S.SENT, S.COMMITTED, S.COMPENSATING, S.COMPENSATION_FAILED)),),
            effects=1,
            compensation=CompensationEnd(path=(E.SENT, E.FAILED), effects=0, what="cancellation"),
            checks=(
                "started by an approved start_compensation",
                "the provider refused the cancel: nothing executed",
                "the cancel not retried",
                "1 order, 0 cancellations in the sandbox ledger",
                "the item in the Compensation problems queue",
            ),
        ),
        Drill(
            slug="saga-aborted",
            name="saga aborted",
            injected="order → payment → shipment, each depending on the one before; the shipment refused for good"
            " (422 `address_rejected`); the runtime aborts the saga, the console's worker sends the undos",
            expected_end='steps 2 then 1 compensated in that order; task "created, then cancelled"',
            ends=(),
            effects=1,
            steps=(
                StepEnd(step="order", end=End(path=UNDONE), effects=1, compensation=CANCELLED),
                StepEnd(step="payment", end=End(path=UNDONE), effects=1, compensation=REFUNDED),
                StepEnd(step="shipment", end=End(path=(S.SENT, S.RETRYABLE, S.FAILED_PERMANENT)), effects=0),
            ),
            checks=(
                "the shipment refused for good, the saga aborted in console mode",
                "steps 2 then 1 compensated in that order",
                "one effect and one undo each in the sandbox ledger",
                "the task compensated: created, then cancelled",
            ),
        ),
        Drill(
            slug="saga-aborted-unknown-step",
            name="saga aborted, a step unknown",
            injected="order → payment → shipment; the payment committed, its reply dropped (UNKNOWN), the shipment"
            " refused at admission meanwhile; the runtime aborts the saga, the console's worker sends the undos",
            expected_end="the payment settled first (COMMITTED by a receipt), then steps 2 then 1 compensated in that"
            ' order; task "created, then cancelled"',
            ends=(),
            effects=1,
            steps=(
                StepEnd(step="order", end=End(path=UNDONE), effects=1, compensation=CANCELLED),
                StepEnd(
                    step="payment",
                    end=End(path=(S.SENT, S.UNKNOWN, S.COMMITTED, S.COMPENSATING, S.COMPENSATED)),
                    effects=1,
                    compensation=REFUNDED,
                ),
                StepEnd(step="shipment", end=End(path=(S.FAILED_PERMANENT,)), effects=0),
            ),
            checks=(
                "the payment UNKNOWN at the abort, nothing undone before it settled",
                "the payment settled by a receipt before its undo",
                "steps 2 then 1 compensated in that order",
                "one effect and one undo each in the sandbox ledger",
                "the task compensated: created, then cancelled",
            ),
        ),
        Drill(
            slug="lookup-by-listing",
            name="lookup by listing",
            injected="refund.listed (no lookup by key: its request carries the key in metadata.recovery_key)"
            " committed, reply dropped",
            expected_end="UNKNOWN → COMMITTED by a receipt of the order's refund listing; no second request",
            ends=(End(path=(S.SENT, S.UNKNOWN, S.COMMITTED)),),
            effects=1,
            checks=("settled by a receipt", "found by the marker its request carried", "no second request"),
        ),
        Drill(
            slug="eventually-consistent-search",
            name="eventually consistent search",
            injected="refund.listed committed, reply dropped, and the sandbox lists a new refund only 5 s later"
            " (the tool's lookup declares 8 s)",
            expected_end="UNKNOWN, pending while not listed, → COMMITTED once listed; never NOT_COMMITTED, never"
            " re-sent",
            ends=(End(path=(S.SENT, S.UNKNOWN, S.COMMITTED)),),
            effects=1,
            checks=("not listed at first: pending, nothing concluded", "settled by a receipt", "no second request"),
        ),
        Drill(
            slug="square-wire",
            name="square wire",
            injected="a refund sent on Square's wire format (form-encoded, its key in the body's idempotency_key"
            " field), declined 402 with Square's error body, code CARD_DECLINED",
            expected_end="FAILED_PERMANENT as a refusal (the code read from errors[0].code); never retried",
            ends=(End(path=(S.SENT, S.FAILED_PERMANENT)),),
            effects=0,
            checks=(
                "the key travelled in the body of a form-encoded request",
                "Square's error code read and classified as a refusal",
            ),
        ),
        Drill(
            slug="mcp-reply-lost",
            name="MCP reply lost",
            injected="a git commit through the MCP gateway, its reply dropped after mcp-server-git committed; the"
            " client re-issues it",
            expected_end="UNKNOWN → COMMITTED by the status tool (git_log, the intent key's trailer); the re-issue"
            " absorbed; 1 commit",
            ends=(End(path=(S.SENT, S.UNKNOWN, S.COMMITTED)),),
            effects=1,
            checks=(
                "the reply was lost: the client saw an unknown outcome",
                "the re-issue was absorbed, not sent",
                "settled by the status tool",
                "a later re-issue answers the recorded result",
                "git_commit forwarded once",
            ),
            needs="mcp",
        ),
        Drill(
            slug="mcp-approval-hold",
            name="MCP approval hold",
            injected="a git commit whose tool the registry holds for an approval; the client, held 2 s with progress,"
            " is told it waits; a reviewer and a second person approve it after that wait ended",
            expected_end="READY while held (no attempt) → SENT → COMMITTED by the one approved execution; the"
            " re-issue gets its result; 1 commit",
            ends=(End(path=(S.SENT, S.COMMITTED)),),
            effects=1,
            checks=(
                "the client was held, heard progress, and was told it waits",
                "approved by a second person after the client's wait ended",
                "executed once by a worker",
                "the re-issue received the one execution's result",
                "git_commit forwarded once",
            ),
            needs="mcp",
        ),
        Drill(
            slug="mcp-upstream-killed",
            name="MCP upstream killed",
            injected="mcp-server-git commits, then is killed (SIGKILL) before its answer leaves",
            expected_end="UNKNOWN → COMMITTED by the status tool (git_log, the intent key's trailer); the server"
            " started again for the next call; 1 commit",
            ends=(End(path=(S.SENT, S.UNKNOWN, S.COMMITTED)),),
            effects=1,
            checks=(
                "the server died mid-call: the client saw an unknown outcome",
                "settled by the status tool",
                "the server was started again for the next call",
                "git_commit forwarded once",
            ),
            needs="mcp",
        ),
    )
}

# Rows of docs/drills.md that `manage.py drill` does not run (name → why): none at present.
NOT_HERE: dict[str, str] = {}


def find(name: str) -> Drill:
    """A drill by its slug or its name, in any case, with spaces or hyphens: KeyError names the choices."""
    wanted = name.strip().lower().replace(" ", "-").replace("_", "-")
    for drill in DRILLS.values():
        if wanted in (drill.slug, drill.name.lower().replace(" ", "-")):
            return drill
    raise KeyError(f"no drill {name!r}; the drills are: {', '.join(DRILLS)}")

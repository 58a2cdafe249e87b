"""Reads of the operations pages (docs/breakers.md, docs/replay.md, docs/drills.md): breakers, retry paths and drills.
A fixed number of statements whatever the number of tools, providers, buckets, events, probes or runs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import F, Prefetch, Window
from django.db.models.fields.json import KT
from django.db.models.functions import RowNumber

from recovery.audit.actions import BREAKER_RESET_REQUEST_EVENTS, STATUS_BREAKER_EVENTS, TOOL_BREAKER_EVENTS
from recovery.engine import breaker as rules
from recovery.engine.types import CLOSED, HALF_OPEN, OPEN, WRITE, BreakerPolicy
from recovery.models import (
    AuditEvent,
    BreakerBucket,
    BreakerOperation,
    BreakerOperationStatus,
    DrillRun,
    DuplicateProbe,
    Provider,
    Tool,
)
from recovery.registry.policy import breaker_policy, status_breaker_policy
from recovery.selectors.facts import retry_path_of, status_breaker_state
from recovery.selectors.probes import RetryPathChange, latest_probe_per_tool, retry_path_changes, tool_probes

HISTORY_DAYS = 7  # a breaker's history: its events of the last week ...
HISTORY_PER_BREAKER = 10  # ... the newest ten of them
RUNS_PER_PAGE = 50


@dataclass(frozen=True, kw_only=True)
class BreakerEvent:
    """One state change of a breaker, as the audit trail recorded it (`evidence` names the tool or provider)."""

    seq: int
    at: datetime
    action: str
    from_state: str
    to_state: str
    reason: str
    actor: str


@dataclass(frozen=True, kw_only=True)
class SlidingWindow:
    """A tool's outcome counts over its breaker window, as admission reads it now (engine.breaker.window_totals)."""

    calls: int
    failures: int
    buckets: int  # buckets with counts inside the window
    start: datetime  # the oldest moment a counted outcome may come from

    @property
    def successes(self) -> int:
        return self.calls - self.failures

    @property
    def rate(self) -> float | None:
        return self.failures / self.calls if self.calls else None


@dataclass(frozen=True, kw_only=True)
class RetryPath:
    """What the registry lets recovery do again with a tool, each line in words (docs/design/gate.md, docs/breakers.md,
    docs/replay.md)."""

    safe: bool  # a same-key replay may run automatically: the retry path is safe (a read, or proved by a probe)
    replay: str  # why, in words
    alternates: tuple[str, ...]
    swap: str
    fallback: str
    reconcile: str
    max_attempts: int | None
    write_retry: int | None
    key_retention_s: int
    exhausted: str
    # The tool's retry path (docs/replay.md, recovery.selectors.facts.retry_path_of), and why it is what it is.
    path: str = "unprobed"  # safe, unsafe, unprobed
    reason: str = ""
    changed_at: datetime | None = None
    probe_id: int | None = None  # the probe that decided it (none: an approved action, or voided)
    key_age_s: int | None = None  # a safe path covers keys up to this old
    base_url: str = ""  # the provider's base URL when it was decided
    replay_reconciliation: bool = False  # the registry lets reconciliation replay once when the status query fails


@dataclass(frozen=True, kw_only=True)
class ToolBreaker:
    tool_id: int
    tool: str
    provider: str
    side_effect: str
    risk: str
    stored: str  # the row's state; "closed" when the breaker never opened (no row)
    state: str  # as admission reads it now: open past its cooldown reads half_open
    opened_at: datetime | None
    cooldown_ends_at: datetime | None  # open (or half_open after a cooldown): when probes may go
    probes_reserved: int  # reserved under a lease that has not expired
    probe_lease_until: datetime | None
    probe_available: bool
    policy: BreakerPolicy
    window: SlidingWindow
    history: tuple[BreakerEvent, ...]
    retry: RetryPath
    latest_probe: DuplicateProbe | None = None  # whatever it decided (an inconclusive one decides nothing)
    last_operation: BreakerOperation | None = None  # the latest applied force open or reset: who, when, why
    pending_reset: BreakerOperation | None = None  # a reset requested and not decided yet (it may have expired)
    mcp: dict | None = None  # an MCP tool's entry: its server's name for it, untrusted annotations, `unregistered`

    @property
    def at_threshold(self) -> bool:
        """Closed, and the window already meets the opening rule: the next counted failure opens it."""
        return self.state == CLOSED and rules.should_open(self.window.calls, self.window.failures, self.policy)


@dataclass(frozen=True, kw_only=True)
class StatusEndpointBreaker:
    """A provider's status-endpoint breaker (docs/reconciliation.md): a fixed window of status queries, separate from
    its tools."""

    provider: str
    stored: str
    state: str  # open past its cooldown reads half_open: the next status check is the probe
    opened_at: datetime | None
    cooldown_ends_at: datetime | None
    probe_until: datetime | None
    window_started_at: datetime | None
    calls: int  # in the current window (0 when it has run out: the next check starts a new one)
    failures: int
    policy: dict
    history: tuple[BreakerEvent, ...]


@dataclass(frozen=True, kw_only=True)
class BreakersPage:
    tools: list[ToolBreaker]
    providers: list[StatusEndpointBreaker]
    history_days: int
    history_per_breaker: int


# What the page reads of a tool: not its schemas, request templates or invariants.
_TOOL_FIELDS = (
    "name", "side_effect", "risk", "replay_safe", "mcp", "retry_path", "retry_path_key_age_s", "retry_path_probe",
    "retry_path_reason", "retry_path_changed_at", "retry_path_base_url", "reconcile", "fallback",
    "key_retention_s", "budgets", "breaker", "status_query", "exhausted_to_review", "provider__name",
    "breaker_row__state", "breaker_row__opened_at", "breaker_row__probes_reserved", "breaker_row__probe_lease_until",
)  # fmt: skip
_EVENT_COLUMNS = (
    "seq", "created_at", "action", "from_state", "to_state", "reason", "actor_label", "tool_name", "provider_name",
)  # fmt: skip


def breakers_page(*, now: datetime) -> BreakersPage:
    """Every tool's breaker, retry path, latest probe and operator operations, and every provider's status breaker.
    Seven statements."""
    alternates = Prefetch("alternates", queryset=Tool.objects.only("id", "name").order_by("name"))
    tools = list(
        Tool.objects.select_related("provider", "breaker_row")
        .only(*_TOOL_FIELDS)
        .prefetch_related(alternates)
        .order_by("name")
    )
    policies = {tool.pk: breaker_policy(tool) for tool in tools}
    buckets = _buckets(policies, now)
    history = _history(now)
    probes = latest_probe_per_tool()
    operations = _operations()
    providers = Provider.objects.select_related("status_breaker_row").order_by("name")
    return BreakersPage(
        tools=[
            _tool_breaker(tool, policies[tool.pk], buckets[tool.pk], history, now, probes.get(tool.pk), operations)
            for tool in tools
        ],
        providers=[_status_breaker(provider, history, now) for provider in providers],
        history_days=HISTORY_DAYS,
        history_per_breaker=HISTORY_PER_BREAKER,
    )


def _buckets(policies: dict[int, BreakerPolicy], now: datetime) -> dict[int, list[tuple[int, int, int]]]:
    """Every tool's buckets that may lie in its window, in one statement. The table holds a few rows per tool (the
    breaker prunes what leaves the window), so a range on bucket_start alone reads little."""
    found: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    if not policies:
        return found
    now_s = now.timestamp()
    oldest = min(policy.bucket_of(now_s) - policy.window_s for policy in policies.values())
    rows = BreakerBucket.objects.filter(bucket_start__gt=oldest).values_list(
        "tool_id", "bucket_start", "successes", "failures"
    )
    for tool_id, start, successes, failures in rows:
        found[tool_id].append((start, successes, failures))
    return found


def _history(now: datetime) -> dict[tuple[str, str], tuple[BreakerEvent, ...]]:
    """The newest HISTORY_PER_BREAKER events of every breaker over the last HISTORY_DAYS, keyed ("tool", name) or
    ("provider", name). One statement: audit_action_idx (action, created_at) bounds it to the week's breaker events,
    and ROW_NUMBER() per breaker keeps the newest of each, so a flapping breaker cannot crowd out the others."""
    tool_name, provider_name = KT("evidence__tool"), KT("evidence__provider")
    since = now - timedelta(days=HISTORY_DAYS)
    rows = (
        AuditEvent.objects.filter(action__in=_HISTORY_EVENTS, created_at__gte=since)
        .annotate(
            tool_name=tool_name,
            provider_name=provider_name,
            rank=Window(RowNumber(), partition_by=[tool_name, provider_name], order_by=F("seq").desc()),
        )
        .filter(rank__lte=HISTORY_PER_BREAKER)
        .order_by("-seq")
        .values(*_EVENT_COLUMNS)
    )
    found: dict[tuple[str, str], list[BreakerEvent]] = defaultdict(list)
    for row in rows:
        key = (
            ("provider", row["provider_name"]) if row["action"] in STATUS_BREAKER_EVENTS else ("tool", row["tool_name"])
        )
        found[key].append(
            BreakerEvent(
                seq=row["seq"],
                at=row["created_at"],
                action=row["action"],
                from_state=row["from_state"],
                to_state=row["to_state"],
                reason=row["reason"],
                actor=row["actor_label"],
            )
        )
    return {key: tuple(events) for key, events in found.items()}


# A tool's history holds its state changes and the steps of its reset requests; a provider's its status breaker's.
_HISTORY_EVENTS = TOOL_BREAKER_EVENTS + BREAKER_RESET_REQUEST_EVENTS + STATUS_BREAKER_EVENTS


def _operations() -> dict[tuple[int, str], BreakerOperation]:
    """Every tool's latest applied operation and its pending reset, keyed (tool id, status), in one statement: at
    most one pending reset per tool (breaker_one_pending_reset), the newest applied one ranked per tool."""
    rows = (
        BreakerOperation.objects.filter(status__in=[BreakerOperationStatus.APPLIED, BreakerOperationStatus.REQUESTED])
        .annotate(rank=Window(RowNumber(), partition_by=[F("tool_id"), F("status")], order_by=F("id").desc()))
        .filter(rank=1)
        .select_related("requested_by", "decided_by")
        .defer("preview")
    )
    return {(op.tool_id, op.status): op for op in rows}


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _tool_breaker(
    tool: Tool,
    policy: BreakerPolicy,
    buckets: list,
    history: dict,
    now: datetime,
    probe: DuplicateProbe | None,
    operations: dict[tuple[int, str], BreakerOperation],
) -> ToolBreaker:
    row = getattr(tool, "breaker_row", None)  # no row: the breaker never opened, it reads closed
    stored = row.state if row is not None else CLOSED
    opened_at = row.opened_at if row is not None else None
    lease_until = row.probe_lease_until if row is not None else None
    now_s = now.timestamp()
    live = 0 if row is None or rules.probe_lease_expired(_epoch(lease_until), now_s) else row.probes_reserved
    view = rules.effective_state(stored, _epoch(opened_at), policy, now_s, live_probes=live)
    cooling = stored in (OPEN, HALF_OPEN) and opened_at is not None
    calls, failures = rules.window_totals(buckets, policy, now_s)
    current = policy.bucket_of(now_s)
    return ToolBreaker(
        tool_id=tool.pk,
        tool=tool.name,
        provider=tool.provider.name,
        side_effect=tool.side_effect,
        risk=tool.risk,
        stored=stored,
        state=view.state,
        opened_at=opened_at,
        cooldown_ends_at=opened_at + timedelta(seconds=policy.cooldown_s) if cooling else None,
        probes_reserved=live,
        probe_lease_until=lease_until if live else None,
        probe_available=view.probe_available,
        policy=policy,
        window=SlidingWindow(
            calls=calls,
            failures=failures,
            buckets=rules.window_buckets(buckets, policy, now_s),
            start=datetime.fromtimestamp(current - policy.window_s + policy.bucket_s, tz=UTC),
        ),
        history=history.get(("tool", tool.name), ()),
        retry=retry_path(tool),
        latest_probe=probe,
        last_operation=operations.get((tool.pk, BreakerOperationStatus.APPLIED)),
        pending_reset=operations.get((tool.pk, BreakerOperationStatus.REQUESTED)),
        mcp=tool.mcp or None,
    )


def retry_path(tool: Tool) -> RetryPath:
    """The tool's retry-path safety in words, from its registry entry (alternates must be prefetched)."""
    write = tool.side_effect == WRITE
    budgets = tool.budgets if isinstance(tool.budgets, dict) else {}
    alternates = tuple(other.name for other in tool.alternates.all())
    path = retry_path_of(tool.side_effect, tool.retry_path)
    replay = _replay_words(tool, path)
    if write and tool.risk == "high":
        swap = "never swapped to another tool while degraded (high risk)"
    elif alternates:
        swap = "an accepted alternate may replace it after a failure that proves nothing was executed"
    else:
        swap = ""
    replay_reconciliation = write and bool((tool.reconcile or {}).get("replay_when_status_down"))
    return RetryPath(
        safe=path == "safe",
        replay=replay,
        alternates=alternates,
        swap=swap,
        fallback=tool.fallback,
        reconcile=_reconcile_words(tool, write, replay_reconciliation),
        max_attempts=budgets.get("max_attempts"),
        write_retry=budgets.get("write_retry") if write else None,
        key_retention_s=tool.key_retention_s,
        exhausted="human review" if tool.exhausted_to_review else "FAILED_PERMANENT (retry_exhausted)",
        path=path,
        reason=tool.retry_path_reason,
        changed_at=tool.retry_path_changed_at,
        probe_id=tool.retry_path_probe_id,
        key_age_s=tool.retry_path_key_age_s,
        base_url=tool.retry_path_base_url,
        replay_reconciliation=replay_reconciliation,
    )


def _replay_words(tool: Tool, path: str) -> str:
    """What the retry path `path` means for a same-key replay of the tool, in words."""
    if tool.side_effect != WRITE:
        return "a read: repeating it changes nothing"
    if path == "unsafe":
        return (
            "a duplicate probe saw the provider ignore the key; every same-key replay is refused until a passing probe "
            "or an approved action turns it back on"
        )
    if path == "safe":
        covered = tool.retry_path_key_age_s or 0
        return f"a duplicate probe saw an idempotent replay with one effect (keys up to {covered} s old)"
    if tool.replay_safe:
        return (
            "declared replay-safe by its registry entry, not proved: no duplicate probe has run, so reconciliation "
            "never replays it (a person or the runtime may, with evidence)"
        )
    return (
        "not declared replay-safe: only an attempt that provably was not sent is retried; an unknown outcome is "
        "reconciled, never replayed"
    )


def _reconcile_words(tool: Tool, write: bool, replay_reconciliation: bool) -> str:
    """How an unknown outcome of the tool is settled, in words."""
    query = tool.status_query if isinstance(tool.status_query, dict) else {}
    if not write:
        return "nothing to reconcile"
    if query.get("kind") == "list":
        marker = ", ".join(query.get("match") or {})
        reconcile = f"listing: {query.get('method', 'GET')} {query.get('path')}, matched on {marker}"
    elif query.get("kind") == "replay":
        reconcile = "no status API: the lookup is a same-key replay"
    elif query.get("path"):
        reconcile = f"status API: {query.get('method', 'GET')} {query['path']}"
    else:
        reconcile = "no status API: an unknown outcome goes to human review"
    if replay_reconciliation:
        reconcile += (
            "; when the status query cannot answer, one same-key replay settles it (replay reconciliation, once a "
            "probe proved the retry path)"
        )
    return reconcile


# --- one tool ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ToolPage:
    """One tool as a person checks its retry path (docs/replay.md, docs/console.md): the path and why, its changes, its
    probes."""

    tool: Tool
    retry: RetryPath
    probes: list[DuplicateProbe]  # newest first
    more_probes: bool  # older probes exist beyond those shown
    changes: list[RetryPathChange]  # newest first


def tool_page(tool_id: int) -> ToolPage | None:
    """The tool with its provider and alternates, its newest probes and retry-path changes; None for an unknown id.
    Four statements."""
    alternates = Prefetch("alternates", queryset=Tool.objects.only("id", "name").order_by("name"))
    tool = Tool.objects.select_related("provider").prefetch_related(alternates).filter(pk=tool_id).first()
    if tool is None:
        return None
    probes, more = tool_probes(tool.pk)
    return ToolPage(
        tool=tool, retry=retry_path(tool), probes=probes, more_probes=more, changes=retry_path_changes(tool.name)
    )


def _status_breaker(provider: Provider, history: dict, now: datetime) -> StatusEndpointBreaker:
    policy = status_breaker_policy(provider)
    row = getattr(provider, "status_breaker_row", None)
    stored = row.state if row is not None else CLOSED
    opened_at = row.opened_at if row is not None else None
    cooldown_ends_at = opened_at + timedelta(seconds=policy.cooldown_s) if opened_at and stored != CLOSED else None
    state = status_breaker_state(stored, opened_at, policy.cooldown_s, now)
    window_started_at = row.window_started_at if row is not None else None
    current = window_started_at is not None and window_started_at > now - timedelta(seconds=policy.window_s)
    return StatusEndpointBreaker(
        provider=provider.name,
        stored=stored,
        state=state,
        opened_at=opened_at,
        cooldown_ends_at=cooldown_ends_at,
        probe_until=row.probe_until if row is not None else None,
        window_started_at=window_started_at if current else None,
        calls=row.calls if row is not None and current else 0,
        failures=row.failures if row is not None and current else 0,
        policy=policy,
        history=history.get(("provider", provider.name), ()),
    )


# --- drill runs -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DrillRunsPage:
    rows: list[dict]
    next_before: int | None  # the `before` of the next (older) page


_RUN_COLUMNS = ("id", "drills", "started_at", "finished_at", "passed", "jobs", "options")


def drill_runs(*, before: int | None = None, size: int | None = None) -> DrillRunsPage:
    """Drill runs, newest first, by keyset on the id (the command creates the row as its run starts, so ids follow
    started_at). One statement; the results and the log, which can run to megabytes, are not read."""
    size = size or RUNS_PER_PAGE
    runs = DrillRun.objects.order_by("-id")
    if before is not None:
        runs = runs.filter(id__lt=before)
    rows = list(runs.values(*_RUN_COLUMNS)[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return DrillRunsPage(rows=rows, next_before=rows[-1]["id"] if more else None)


def drill_run(run_id: int) -> DrillRun | None:
    """One run with its results and log. One statement."""
    return DrillRun.objects.filter(pk=run_id).first()


# --- one breaker operation -----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BreakerOperationPage:
    operation: BreakerOperation
    events: list[AuditEvent]  # its audit events, oldest first


def breaker_operation_page(operation_id: int) -> BreakerOperationPage | None:
    """One force open or reset with its tool and people (one statement) and its audit events (one more, bounded by
    audit_action_idx to the breaker operations' events); None for an unknown id."""
    found = BreakerOperation.objects.select_related("tool", "requested_by", "decided_by").filter(pk=operation_id)
    operation = found.first()
    if operation is None:
        return None
    events = list(
        AuditEvent.objects.filter(
            action__in=TOOL_BREAKER_EVENTS + BREAKER_RESET_REQUEST_EVENTS, evidence__breaker_operation=operation.pk
        )
        .only("seq", "action", "actor_label", "from_state", "to_state", "reason", "created_at")
        .order_by("seq")
    )
    return BreakerOperationPage(operation=operation, events=events)

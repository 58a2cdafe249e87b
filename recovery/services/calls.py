"""Calls (docs/design/idempotency.md, docs/design/gate.md): a runtime registers each tool call before its first attempt,
and may abandon one. The same key with the same arguments is the same call; other arguments under that key, or a write
intent the task carries under another key, are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cache

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.engine.classify import preflight_failure
from recovery.engine.fingerprint import fingerprint
from recovery.engine.gate import duplicate_intent
from recovery.engine.states import CallState
from recovery.engine.types import FieldError, RequiredNext
from recovery.engine.validation import validate_args
from recovery.models import Call, Step, Task, TaskStatus, Tool
from recovery.registry import tool_policy
from recovery.selectors.context import AdmissionRead
from recovery.selectors.tasks_calls import allowed_tools, blocking
from recovery.services.answers import public_failure
from recovery.services.errors import Refusal
from recovery.statemachine import hot_path, hot_reads
from recovery.statemachine.transitions import TransitionConflict, transition_call

S = CallState


@dataclass
class CallAdded:
    call: Call
    created: bool
    preflight: tuple[FieldError, ...]
    blocked_by: list[int] = field(default_factory=list)  # calls of the dependencies not COMMITTED yet
    blocked_by_steps: list[int] = field(default_factory=list)  # the dependency steps waited for, by index
    read: AdmissionRead | None = None  # what its first admission reads, read with its insert (call_add's `admitting`)


def _added(
    call: Call,
    *,
    created: bool,
    preflight: tuple[FieldError, ...],
    independent: bool = False,
    read: AdmissionRead | None = None,
) -> CallAdded:
    """The answer's parts; `independent`: the call's step was made by this request with no dependencies, so nothing
    blocks it (no query)."""
    calls, steps = ([], []) if independent else blocking(call)
    return CallAdded(
        call=call, created=created, preflight=preflight, blocked_by=calls, blocked_by_steps=steps, read=read
    )


def call_add(
    *,
    task: Task,
    step_index: int,
    depends_on: list[int],
    tool_name: str,
    arguments: dict,
    idempotency_key: str,
    actor: Actor,
    compensation: dict | None = None,
    evidence: dict | None = None,
    with_call: Callable[[Call], object] | None = None,
    admitting: bool = False,
) -> CallAdded:
    """Register a call of `task`'s step; `compensation` ({tool, args}): the step's own undo, instead of its tool's
    registry default (a saga's abort uses it, docs/compensation.md). `evidence`: more for the `call.added` event;
    `with_call`: run on the new call inside its insert's transaction (the MCP gateway stores the call's origin);
    `admitting`: its first attempt is admitted next, in this transaction (what that reads comes with the insert where
    hot_path.insert_with_step applies)."""
    print_ = fingerprint(tool_name, arguments)
    named, keyed = (None, None)
    if compensation is None:  # the tool and what its key and intent already have, in one read
        named, keyed = hot_reads.allowed_tool_and_key(task, tool_name, idempotency_key, print_)
    # All the tenant's tools only where they are read: a refusal lists them, a step's own undo is checked against them.
    tools = {named.name: named} if named is not None else {t.name: t for t in allowed_tools(task.tenant)}
    tool = _check_admissible(task, tools, tool_name, step_index, depends_on, compensation)
    policy = tool_policy(tool)
    if keyed is None or tool is not named:
        keyed = hot_reads.key_and_intent(task, tool, idempotency_key, print_)
    existing, same_intent = keyed
    if existing is not None:
        return _same_key(existing, task, print_)
    if policy.is_write:
        _check_new_intent(policy.side_effect, print_, same_intent)
    preflight = validate_args(policy.args_schema, arguments)
    try:
        # Where a concurrent add of the same key comes back as no row (hot_path.insert_new), nothing here can fail
        # half-way for that race: no savepoint inside the caller's transaction (API 1.2 registers and admits in one).
        with transaction.atomic(savepoint=not hot_path.skips_conflicts(Call)):
            budget = _max_attempts(policy.budgets.max_attempts, task)
            row = _new_call(task, None, tool, idempotency_key, arguments, print_, budget)
            call, made, read = _insert_in_step(
                row, task, step_index, depends_on, compensation, admitting and not preflight
            )
            if call is not None:
                more = {"preflight_errors": len(preflight), **(evidence or {})}
                _call_added(call, actor, f"{tool.name} step {step_index}", more)
                if with_call is not None:
                    with_call(call)
    except IntegrityError:
        call = None
    if call is None:
        # A concurrent add of the same key won: answer as for a repeated request.
        existing = Call.objects.filter(tenant=task.tenant, tool=tool, idempotency_key=idempotency_key).first()
        if existing is None:
            raise IntegrityError(f"task {task.pk}: the call {idempotency_key!r} conflicted with no call of that key")
        return _same_key(existing, task, print_)
    return _added(call, created=True, preflight=preflight, independent=made and not depends_on, read=read)


def _insert_in_step(
    row: Call, task: Task, step_index: int, depends_on: list[int], compensation: dict | None, admitting: bool
) -> tuple[Call | None, bool, AdmissionRead | None]:
    """`row` inserted in the task's step `step_index`: the call (None: its key is taken), whether this request made
    the step, and what its first admission reads when `admitting` and it came with the insert. A step with nothing
    of its own to record (no dependencies, no undo of its own) is made with the call in one statement where
    hot_path.insert_with_step applies."""
    if compensation is None and not depends_on:
        together = hot_path.insert_with_step(row, step_index, read=admitting)
        if together is not None:
            return together
    row.step, made = _step(task, step_index, depends_on, compensation)
    return hot_path.insert_new(row), made, None


def _check_admissible(
    task: Task, tools: dict[str, Tool], tool_name: str, step_index: int, depends_on: list[int], compensation
) -> Tool:
    """The tenant's tool named `tool_name`; Refusal if it has none, the task is closed, the step's own undo is not
    one, or a dependency is not an earlier step (checked in that order)."""
    tool = tools.get(tool_name)
    if tool is None:
        raise Refusal(
            "capability_missing",
            f"{tool_name!r} is not a capability of this tenant: replan with one of the listed tools.",
            status=422,
            field_errors=[
                FieldError(
                    field="tool",
                    expected="an authorized tool",
                    received=tool_name,
                    suggestion="Choose one of the tenant's capabilities.",
                )
            ],
            detail={"capabilities": sorted(tools)},
        )
    if task.status != TaskStatus.OPEN:
        raise Refusal("task_closed", f"the task is {task.status}: no new calls", status=409)
    if compensation is not None:
        _check_compensation(compensation, tool, tools)
    bad_deps = [d for d in depends_on if d >= step_index]
    if bad_deps:
        raise Refusal(
            "invalid_dependency",
            "a step may depend only on earlier steps",
            status=422,
            field_errors=[
                FieldError(
                    field="depends_on",
                    expected=f"step indexes below {step_index}",
                    received=bad_deps,
                    suggestion="Order the steps so dependencies come first.",
                )
            ],
        )
    return tool


def _check_new_intent(side_effect: str, print_: str, others: list[Call]) -> None:
    """Refusal if another call of the task already carries this write intent (a new key must not launder a replay):
    `others`, the task's calls with this fingerprint."""
    existing = [(str(other.pk), other.fingerprint, other.state) for other in others]
    duplicate = duplicate_intent(side_effect=side_effect, fingerprint=print_, existing=existing)
    if duplicate:
        raise Refusal(
            "duplicate_intent",
            f"call {duplicate} already carries this write intent: a new idempotency key must not launder a "
            "replay. Retry that call under its own key.",
            status=409,
            detail={"existing_call": int(duplicate)},
        )


def _max_attempts(tool_max: int | None, task: Task) -> int | None:
    """The tighter of the tool's and the task's attempt budgets (None: no limit)."""
    task_max = (task.budget or {}).get("max_attempts")
    if task_max is None:
        return tool_max
    return min(tool_max, task_max) if tool_max is not None else task_max


def _step(task: Task, step_index: int, depends_on: list[int], compensation: dict | None) -> tuple[Step, bool]:
    """The task's step `step_index` (made on first use), with its dependencies and its own undo recorded; and
    whether this request made it."""
    step, made = _step_row(task, step_index)
    if compensation is not None and step.compensation != compensation:
        Step.objects.filter(pk=step.pk).update(compensation=compensation)
        step.compensation = compensation
    if depends_on:
        deps = [Step.objects.get_or_create(task=task, index=index)[0] for index in depends_on]
        step.depends_on.add(*deps)
    return step, made


@cache
def _insert_step_sql() -> str:
    quote = connection.ops.quote_name
    columns = ", ".join(quote(Step._meta.get_field(name).column) for name in hot_path.STEP_COLUMNS)
    return (
        f"INSERT INTO {quote(Step._meta.db_table)} ({columns}) VALUES (%s, %s, %s, %s, %s) "
        f"ON CONFLICT ({quote('task_id')}, {quote('index')}) DO NOTHING RETURNING {quote('id')}"
    )


def _step_row(task: Task, index: int) -> tuple[Step, bool]:
    """The step, inserted when missing: raw SQL because INSERT ... ON CONFLICT DO NOTHING RETURNING makes a new step
    in one statement where get_or_create needs four (a SELECT, a savepoint, the INSERT, its release); a step that
    exists (or a concurrent insert that won) is read as before."""
    now = timezone.now()
    values = {"task_id": task.pk, "index": index, "name": "", "compensation": {}, "created_at": now}
    params = [Step._meta.get_field(name).get_db_prep_save(values[name], connection) for name in hot_path.STEP_COLUMNS]
    with connection.cursor() as cursor:
        cursor.execute(_insert_step_sql(), params)
        row = cursor.fetchone()
    if row is None:
        return Step.objects.get(task=task, index=index), False
    step = Step(id=row[0], task=task, **{k: v for k, v in values.items() if k != "task_id"})
    step._state.adding = False
    return step, True


def call_insert(
    *,
    task: Task,
    step: Step,
    tool: Tool,
    idempotency_key: str,
    arguments: dict,
    fingerprint: str,
    max_attempts: int | None,
    actor: Actor,
    reason: str,
    evidence: dict,
    observed: bool = False,
) -> Call | None:
    """Insert a new call (READY) and its `call.added` audit event, inside the caller's transaction, for a trace that
    reported it after the fact (services.observed, `observed`). A runtime's registration (call_add) inserts its row
    with its step; either way the row is _new_call's and the event _call_added's, which always carries the key and
    the fingerprint. None: the tenant already has a call of that tool and key, found by the insert itself where
    hot_path.skips_conflicts(Call) (an IntegrityError otherwise)."""
    row = _new_call(task, step, tool, idempotency_key, arguments, fingerprint, max_attempts, observed=observed)
    call = hot_path.insert_new(row)
    if call is not None:
        _call_added(call, actor, reason, evidence)
    return call


def _new_call(
    task: Task,
    step: Step | None,
    tool: Tool,
    idempotency_key: str,
    arguments: dict,
    print_: str,
    max_attempts: int | None,
    *,
    observed: bool = False,
) -> Call:
    """The new call's row, READY."""
    return Call(
        tenant=task.tenant,
        task=task,
        step=step,
        tool=tool,
        idempotency_key=idempotency_key,
        arguments=arguments,
        fingerprint=print_,
        side_effect=tool.side_effect,
        risk=tool.risk,
        max_attempts=max_attempts,  # None: no limit
        outcome_timeout_s=tool.outcome_timeout_s,
        observed=observed,
    )


def _call_added(call: Call, actor: Actor, reason: str, evidence: dict) -> None:
    """The new call's `call.added` event: its key and fingerprint, and `evidence`."""
    append_event(
        action=AuditAction.CALL_ADDED,
        actor=actor,
        task_id=call.task_id,
        call_id=call.pk,
        to_state=call.state,
        reason=reason,
        evidence={"idempotency_key": call.idempotency_key, "fingerprint": call.fingerprint, **evidence},
    )


def _check_compensation(compensation: dict, tool, tools: dict) -> None:
    """A step's own compensation names a write tool this tenant may call, other than the step's own tool."""
    undo = tools.get(compensation.get("tool"))
    problem = ""
    if tool.side_effect != "write":
        problem = "a read has no effect to undo: declare no compensation for it"
    elif undo is None:
        problem = f"{compensation.get('tool')!r} is not a capability of this tenant"
    elif undo.side_effect != "write":
        problem = f"{undo.name} is a read: a compensation undoes an effect"
    elif undo.pk == tool.pk:
        problem = "a tool cannot compensate itself"
    if problem:
        raise Refusal(
            "invalid_compensation",
            problem,
            status=422,
            field_errors=[
                FieldError(
                    field="compensation.tool",
                    expected="a write tool of this tenant that undoes the step",
                    received=compensation.get("tool"),
                    suggestion="Name the tool that undoes this step (e.g. order.cancel), or omit it for the default.",
                )
            ],
        )


def preflight_answer(call: Call, preflight: tuple[FieldError, ...]) -> tuple[dict | None, dict | None]:
    """The add-call answer's `failure` and `required_next` (both None when the arguments passed): the failure an
    attempt would have carried, so a runtime reads one shape whether the arguments failed early or late."""
    if not preflight:
        return None, None
    failure = preflight_failure(tool_policy(call.tool), call_id=str(call.pk), field_errors=preflight)
    public = public_failure(asdict(failure) | {"side_effect": "not_sent"})
    errors = [{"field": e.field, "expected": e.expected, "suggestion": e.suggestion} for e in preflight]
    return public, asdict(RequiredNext(action="repair_args", detail={"field_errors": errors}))


def _same_key(existing: Call, task: Task, print_: str) -> CallAdded:
    if existing.fingerprint != print_ or existing.task_id != task.pk:
        raise Refusal(
            "idempotency_conflict",
            "this idempotency key was already used with other arguments (or by another task): use a new key for a "
            "new intent, or the same arguments for this one",
            status=422,
            field_errors=[
                FieldError(
                    field="idempotency_key",
                    expected="a key not used for another intent",
                    received=existing.idempotency_key,
                    suggestion="Generate a new key.",
                )
            ],
            detail={"existing_call": existing.pk},
        )
    policy = tool_policy(existing.tool)
    return _added(existing, created=False, preflight=validate_args(policy.args_schema, existing.arguments))


def call_abandon(*, call: Call, actor: Actor, reason: str) -> Call:
    if call.state == S.FAILED_PERMANENT and call.outcome == "abandoned":
        return call  # a repeated abandon (a reply lost on the way back): the call as it stands
    if call.state not in (S.READY, S.RETRYABLE, S.NOT_COMMITTED):
        raise Refusal(
            "not_abandonable",
            f"a {call.state} call cannot be abandoned: only READY, RETRYABLE or NOT_COMMITTED",
            status=409,
        )
    try:
        return transition_call(
            call,
            S.FAILED_PERMANENT,
            actor=actor,
            reason=reason.strip() or "abandoned",
            changes={"outcome": "abandoned"},
        )
    except TransitionConflict as exc:
        raise Refusal("conflict", str(exc), status=409) from None

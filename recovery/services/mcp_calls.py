"""MCP `tools/call`s through the gateway (docs/mcp-gateway.md): each is a call of a task like any other, registered,
admitted and reported through the same services as the JSON API's; a re-issue of a write within the provider's
`reissue_window_s` is answered from the call it repeats, never sent again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event, appends_at_commit
from recovery.engine.fingerprint import fingerprint
from recovery.engine.states import CallState
from recovery.engine.types import Facts
from recovery.models import (
    ApiToken,
    Attempt,
    Call,
    IdentitySource,
    McpCall,
    Provider,
    Step,
    Task,
    TaskStatus,
    Tenant,
    Tool,
)
from recovery.providers.mcp import upstream_request
from recovery.providers.requests import filled_key
from recovery.registry import load_registry
from recovery.registry.mcp import REISSUE_WINDOW_S, hold_seconds, registry_stub
from recovery.selectors.tasks_calls import allowed_tools
from recovery.services import calls, mcp_holds, tasks
from recovery.services.attempts import AttemptRequest, attempt_admit
from recovery.services.errors import Refusal
from recovery.services.outcomes import attempt_report
from recovery.statemachine import hot_path

S = CallState
TASK_META = "io.recoveryconsole/task"
KEY_HINT = "io.recoveryconsole/idempotency_key"
SESSION_TASK = "mcp-session:"  # the external id of a task a legacy MCP session names
IDLE = timedelta(minutes=15)  # a task named by (token, client) is a new one after this long without a call
IN_FLIGHT = {S.READY, S.SENT, S.RETRYABLE}
BEING_CONFIRMED = {S.UNKNOWN, S.STILL_UNKNOWN, S.ACCEPTED, S.HUMAN_REVIEW}


@dataclass(frozen=True)
class Caller:
    """Who calls: the token, its tenant, and what names the task (docs/mcp-gateway.md, "The task")."""

    token: ApiToken
    tenant: Tenant
    client_name: str = ""
    client_version: str = ""
    session_id: str = ""
    traceparent: str = ""


@dataclass
class Answer:
    """What the gateway answers without sending: a re-issue absorbed, or a refusal; `call` when one exists."""

    text: str
    is_error: bool
    recovery: dict
    result: dict | None = None
    waiting: bool = False  # a held call not decided yet: the gateway may hold the client (docs/mcp-gateway.md)
    hold_s: int = 0  # how long, when the client sent a progressToken


@dataclass
class Begun:
    """An admitted write or read, to forward: the call, its attempt, the arguments and _meta to send."""

    call: Call
    attempt: Attempt | None  # read once the admission committed
    tool: Tool
    arguments: dict
    meta: dict = field(default_factory=dict)


def offered_tools(tenant: Tenant) -> list[Tool]:
    """The tenant's MCP tools, by the name their server gives them."""
    return [tool for tool in allowed_tools(tenant) if tool.mcp and tool.provider.mcp]


def exposing_providers(tenant: Tenant) -> list[Provider]:
    """The MCP providers whose tools the registry does not describe are offered too (`expose_unregistered`): to a
    tenant that may use every tool, since no list of its capabilities can name them."""
    if not tenant.all_tools:
        return []
    return [p for p in Provider.objects.exclude(mcp={}) if p.mcp.get("expose_unregistered")]


def register_unregistered(provider: Provider, listed: dict, actor: Actor) -> Tool:
    """A registry tool for a tool the server lists and the registry does not describe: a high-risk, non-replay-safe
    write, its annotations stored as the server's untrusted hints (loaded, and audited, as any registry change)."""
    stub = registry_stub(provider.name, [listed])
    stub["tools"][0]["mcp"]["unregistered"] = True  # shown as such on the console's tool and call pages
    load_registry(stub, actor=actor, source=f"mcp:{provider.name} tools/list")
    return Tool.objects.select_related("provider").get(name=stub["tools"][0]["name"])


def task_name(caller: Caller, meta: dict, actor: Actor) -> tuple[str | Task, IdentitySource]:
    """The task's external id and how it was chosen: named in _meta, else the traceparent's trace, else the MCP
    session, else the (token, client) pair's current task (_pair_task: the task itself when it goes on)."""
    named = meta.get(TASK_META)
    if isinstance(named, str) and named:
        return named[:200], IdentitySource.META
    parts = caller.traceparent.split("-")
    if len(parts) == 4 and len(parts[1]) == 32:
        return f"trace:{parts[1]}", IdentitySource.TRACEPARENT
    if caller.session_id:
        return f"{SESSION_TASK}{caller.session_id[:100]}", IdentitySource.SESSION
    return _pair_task(caller, actor), IdentitySource.PAIR


def _pair_task(caller: Caller, actor: Actor) -> str | Task:
    """The (token, client) pair's open task (the row, read already); one idle for IDLE is closed (submitted) and the
    next one begins (its external id)."""
    base = f"mcp:{caller.token.pk}:{caller.client_name[:60]}:"
    current = Task.objects.filter(tenant=caller.tenant, external_id__startswith=base).order_by("-pk").first()
    if current is None:
        return f"{base}1"
    last = Call.objects.filter(task=current).aggregate(Max("created_at"))["created_at__max"] or current.created_at
    if current.status == TaskStatus.OPEN and timezone.now() - last < IDLE:
        return current
    if current.status == TaskStatus.OPEN:
        tasks.task_complete(task=current, summary="closed: 15 minutes without a call", deliverable=None, actor=actor)
    return f"{base}{int(current.external_id.rsplit(':', 1)[1]) + 1}"


def _task(caller: Caller, meta: dict, actor: Actor) -> tuple[Task, IdentitySource]:
    external_id, source = task_name(caller, meta, actor)
    if isinstance(external_id, Task):  # the pair's task goes on: read already
        return external_id, source
    agent = f"mcp:{caller.client_name[:60]}" if caller.client_name else "mcp"
    existing = Task.objects.filter(tenant=caller.tenant, external_id=external_id).first()
    if existing is not None:
        return existing, source
    task, _ = tasks.task_create(
        tenant=caller.tenant, external_id=external_id, agent=agent, goal="MCP tool calls", budget={}, actor=actor
    )
    return task, source


def intent_key(tool: Tool, arguments: dict, meta: dict, task: Task, caller: Caller | None = None) -> str:
    """A write's intent key: the client's, else the tool's key_template, else the canonical arguments — within the
    task, or, for a task named by a legacy MCP session, within the (token, client): a gateway restart ends the session
    and the client's re-issue comes on a new one (a new task), where its key must still find the call it repeats."""
    sent = meta.get(KEY_HINT)
    if isinstance(sent, str) and sent:
        return sent[:200]
    scope = str(task.pk)
    if caller is not None and task.external_id.startswith(SESSION_TASK):
        scope = f"t{caller.token.pk}-{fingerprint('client', {'name': caller.client_name})[:12]}"
    if tool.key_template:
        return f"{scope}:{filled_key(tool.key_template, arguments)}"[:200]
    return f"mcp-{scope}-{fingerprint(tool.name, arguments)[:40]}"


def _window(tool: Tool) -> int:
    return int(tool.provider.mcp.get("reissue_window_s", REISSUE_WINDOW_S))


def absorbed(call: Call) -> Answer:
    """The answer to a re-issue of `call` within the window: its recorded result, or where it stands (a held call's:
    waiting for approval, or refused)."""
    held = held_answer(call.pk, replayed=True)
    return held if held is not None else absorbed_plain(call)


def absorbed_plain(call: Call) -> Answer:
    """Where a call a re-issue repeats stands, by its state alone."""
    base = {"call_id": call.pk, "call_state": call.state, "replayed_from_call": call.pk}
    if call.state == S.COMMITTED:
        attempt = call.attempts.order_by("-number").first()
        result = (attempt.facts or {}).get("result") if attempt is not None else None
        return Answer(f"Already done as call {call.pk}; not executed again.", False, base, result=result)
    if call.state in BEING_CONFIRMED:
        return Answer(f"Its outcome is still being confirmed (call {call.pk}); do not repeat it.", True, base)
    if call.state in IN_FLIGHT:
        return Answer(f"It is in progress (call {call.pk}); do not repeat it.", True, base)
    return Answer(f"Call {call.pk} ended {call.state}; it was not executed again.", True, base)


_DUPLICATE = (
    "call {} already carries this write intent: a new idempotency key must not launder a replay. Retry that call "
    "under its own key."
)


def held_answer(call_id: int, *, replayed: bool = False, held: mcp_holds.Held | None = None) -> Answer | None:
    """A held call's answer (docs/mcp-gateway.md, "Approval holds"): "waiting for approval: call N" while undecided,
    the kept result of its one execution once approved and done, the refusal once rejected, superseded or expired;
    None when the call was never held. `held`: where its hold stands, when the caller read it already."""
    held = held or mcp_holds.where(call_id)
    if held is None:
        return None
    call = held.call
    base = {"call_id": call.pk, "call_state": call.state, "hold": held.shown()}
    if replayed:
        base["replayed_from_call"] = call.pk
    if held.waiting:
        decision = {"route": "request_approval", "call_id": call.pk, "retry_after_ms": None}
        return Answer(
            f"waiting for approval: call {call.pk}",
            True,
            {**base, "decision": decision},
            waiting=True,
            hold_s=hold_seconds(call.tool),
        )
    if held.refusal:
        decision = {"route": "stop", "call_id": call.pk, "retry_after_ms": None}
        return Answer(f"Refused: {held.refusal}.", True, {**base, "decision": decision})
    if call.state == S.COMMITTED:
        attempt = call.attempts.order_by("-number").first()
        result = (attempt.facts or {}).get("result") if attempt is not None else None
        return Answer(f"Approved and executed once as call {call.pk}; not executed again.", False, base, result=result)
    return None  # approved and executed, its outcome not settled: where the call stands (absorbed)


def _refusal(exc: Refusal, call_id: int | None = None) -> Answer:
    detail = exc.detail or {}
    decision = {"route": exc.code, "call_id": detail.get("existing_call", call_id), "retry_after_ms": None}
    return Answer(exc.message, True, {"decision": decision})


def begin(caller: Caller, tool: Tool, arguments: dict, meta: dict) -> Answer | Begun:
    """Register and admit one call: an Answer when nothing is to be sent, else what to forward."""
    actor = Actor.for_token(caller.token)
    task, source = _task(caller, meta, actor)
    write = tool.side_effect == "write"
    key = intent_key(tool, arguments, meta, task, caller) if write else f"mcp-read-{uuid.uuid4().hex}"
    if write:
        existing = Call.objects.filter(tenant=caller.tenant, tool=tool, idempotency_key=key).first()
        if existing is not None:
            if timezone.now() - existing.created_at <= timedelta(seconds=_window(tool)):
                return reissue_absorbed(existing, Origin(caller, source), actor)
            if existing.task_id != task.pk:  # the gate checks within a task: a new session's repeat is named here
                return _refusal(Refusal("duplicate_intent", _DUPLICATE.format(existing.pk), status=409), existing.pk)
            # After the window a repeat is a new intent under a new key: the gate names the call it repeats.
            key = f"{key}-{uuid.uuid4().hex[:12]}"
    try:
        return _admit(task, tool, arguments, key, actor, Origin(caller, source))
    except Refusal as exc:
        return _refusal(exc)


@dataclass(frozen=True)
class Origin:
    """Who sent a gateway call and how its task was chosen: stored with the call (McpCall) and in its audit events."""

    caller: Caller
    source: IdentitySource

    def evidence(self, tool: Tool) -> dict:
        return {
            "server": tool.provider.name,
            "tool": tool.mcp["tool"],
            "client_name": self.caller.client_name[:200],
            "client_version": self.caller.client_version[:100],
            "identity_source": str(self.source),
        }

    def store(self, call: Call, tool: Tool, request: dict) -> McpCall:
        return McpCall.objects.create(
            call=call,
            tenant_id=call.tenant_id,
            server=tool.provider.name,
            tool=tool.mcp["tool"],
            client_name=self.caller.client_name[:200],
            client_version=self.caller.client_version[:100],
            identity_source=self.source,
            session_id=self.caller.session_id[:100],
            request=request,
        )


def reissue_absorbed(call: Call, origin: Origin, actor: Actor) -> Answer:
    """Answer a re-issue from the call it repeats, and record that it was absorbed: counted on the call's MCP
    origin and told in its audit trail (the metrics' re-issues absorbed)."""
    with transaction.atomic():
        McpCall.objects.filter(call=call).update(
            reissues_absorbed=F("reissues_absorbed") + 1, last_reissue_at=timezone.now()
        )
        append_event(
            action=AuditAction.MCP_REISSUE_ABSORBED,
            actor=actor,
            task_id=call.task_id,
            call_id=call.pk,
            reason=f"re-issue of call {call.pk} answered from it, not sent",
            evidence={**origin.evidence(call.tool), "call_state": call.state},
        )
    return absorbed(call)


def _admit(task: Task, tool: Tool, arguments: dict, key: str, actor: Actor, origin: Origin) -> Answer | Begun:
    """Registered and its first attempt admitted in one transaction, its audit events appended once at its end, as
    the JSON API's registration with `admit` does (docs/api.md); the admission reads the call in one statement."""
    with transaction.atomic(), appends_at_commit():
        answer = _register_and_admit(task, tool, arguments, key, actor, origin)
    if isinstance(answer, Begun) and answer.attempt is None:
        answer.attempt = Attempt.objects.get(call=answer.call, attempt_id="a1")
    return answer


def _register_and_admit(
    task: Task, tool: Tool, arguments: dict, key: str, actor: Actor, origin: Origin
) -> Answer | Begun:
    step = (Step.objects.filter(task=task).aggregate(Max("index"))["index__max"] or 0) + 1
    request = upstream_request(tool, arguments, key)
    added = calls.call_add(
        task=task,
        step_index=step,
        depends_on=[],
        tool_name=tool.name,
        arguments=arguments,
        idempotency_key=key,
        actor=actor,
        evidence={"mcp": origin.evidence(tool)},
        with_call=lambda call: origin.store(call, tool, request),
        admitting=True,
    )
    call = added.call
    if not added.created:  # the same intent registered at the same moment by a re-issue: never sent twice
        return reissue_absorbed(call, origin, actor)
    if added.preflight:
        failure, _ = calls.preflight_answer(call, added.preflight)
        return Answer(
            failure["public_message"], True, {"call_id": call.pk, "call_state": call.state, "failure": failure}
        )
    # What the admission reads, read with the insert (or now): the call as inserted, its tool and task read with it.
    read = added.read or hot_path.first_admission_read(call)
    if read is None:
        found = hot_path.call_for_attempt(call.pk, {call.tenant_id}, attempt_id="a1")
        call, read = found if found is not None else (call, None)
    admission = attempt_admit(call=call, read=read, request=AttemptRequest(attempt_id="a1"), actor=actor, fresh=True)
    if admission.status == 200:  # attempt a1 was admitted already, by the re-issue's twin
        return absorbed(call)
    if admission.status == 409 and admission.response["gate"]["reason"] == "approval_required":
        mcp_holds.hold(call.pk, actor)  # the preview of the exact tools/call, for a reviewer and an approver
        return held_answer(call.pk)
    if admission.status == 409:
        gate = admission.response["gate"]
        required = gate.get("required_next") or {}
        decision = {
            "route": required.get("action", "denied"),
            "retry_after_ms": required.get("after_ms"),
            "call_id": call.pk,
        }
        return Answer(gate["public_message"] or gate["reason"], True, {"call_id": call.pk, "decision": decision})
    # The attempt as the admission wrote it (with its tool): read again only where the admission did not say.
    return Begun(call=call, attempt=admission.attempt, tool=tool, arguments=request["arguments"], meta=request["_meta"])


def finish(begun: Begun, facts: Facts, caller: Caller) -> dict:
    """Report what the forwarded call came back with: the outcome's answer (the call's state, failure, decision).
    The call as its registration read it (its tool, provider and task): the report locks and re-reads its row."""
    call = begun.call
    if not (Call.tool.is_cached(call) and Call.task.is_cached(call)):
        call = Call.objects.select_related("tool__provider", "task").get(pk=call.pk)
    return attempt_report(call=call, attempt=begun.attempt, facts=facts, actor=Actor.for_token(caller.token))

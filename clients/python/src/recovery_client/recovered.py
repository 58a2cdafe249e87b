"""Recovered tools (docs/recovered-tools.md): a plain function that calls a provider over HTTP, made a protected tool.

    from recovery_client import recovered

    @recovered.tool("refund.create", key="refund-{order_id}")
    def refund(order_id: str, amount_cents: int) -> dict:
        \"\"\"Refund part or all of an order's payment.\"\"\"
        reply = recovered.http().post(f"{PROVIDER}/refunds", json={"order_id": order_id, "amount_cents": amount_cents})
        reply.raise_for_status()
        return reply.json()

    with recovered.task(client, tenant="demo", external_id="support-4711", goal="refund order 8848"):
        refund("O-8848", 1250)       # {"status": "committed", "message": "The refund took effect.", "next": None, ...}

The decorated function keeps its name, signature, annotations and docstring, so `function_tool` (OpenAI Agents SDK)
and `@tool` (LangChain) derive the same schema from it; only its return annotation says what it now returns
(RecoveredResult). Each call of it adds (or finds again) one call of the open task, asks the console to admit each
attempt, runs the function with `http()` — a session that retries nothing, puts the call's idempotency key where
the registry says (the admission's `wire`) and records what really happened on the wire; a provider SDK can be handed
it (docs/providers.md) — reports the facts of the last exchange, and obeys `required_next`
(Runtime.drive_call: wait out a Retry-After, wait for reconciliation, degrade, ask a person, stop). It never raises:
what the model sees is described in `tool`'s docstring.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import json
import logging
import re
import secrets
import string
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypedDict
from urllib.parse import parse_qsl, urlencode

import requests
from requests.adapters import HTTPAdapter

from recovery_client import (
    Admission,
    Failure,
    OutcomeAnswer,
    RecoveryClient,
    RecoveryError,
    Task,
    Wire,
    facts_from_exception,
    facts_from_response,
)
from recovery_client.runtime import (
    BLOCKED,
    COMMITTED,
    DEGRADED,
    FAILED,
    HUMAN_REVIEW,
    RETRY_LATER,
    SETTLING,
    UNSETTLED,
    CallResult,
    Runtime,
)

__all__ = ["RecoveredResult", "RecoveredTask", "RequestRefused", "current_task", "http", "task", "tool"]

logger = logging.getLogger(__name__)

REFUSED = "refused"  # called outside an open task, or the task is closed: nothing was sent

# What each status tells the model to do next when the console's answer named nothing (required_next.action values).
_NEXT = {
    DEGRADED: "degrade",
    HUMAN_REVIEW: "request_approval",
    FAILED: "stop",
    UNSETTLED: "wait_for_reconcile",
    BLOCKED: "replan",
    RETRY_LATER: "retry_after",
    REFUSED: "stop",
}
_KEY = re.compile(r"[\x21-\x7e]{1,255}")  # what the API accepts as an idempotency key
_SAFE_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,79}")  # a registry name fit to put in a sentence
# Parameters the agent frameworks fill in themselves (a run context, callbacks): never part of the call's arguments.
_FRAMEWORK_TYPES = re.compile(
    r"\b(RunContextWrapper|ToolContext|ToolRuntime|RunnableConfig|InjectedToolArg|InjectedToolCallId|InjectedState"
    r"|InjectedStore|CallbackManagerForToolRun|AsyncCallbackManagerForToolRun)\b"
)
_FRAMEWORK_NAMES = frozenset({"run_manager", "callbacks"})
MAX_MESSAGE = 1000


class RecoveredResult(TypedDict, total=False):
    """What a recovered tool returns, and so all the model sees of it (docs/recovered-tools.md has each status).

    `message` is the console's public message (fixed text filled from the registry and the tool's schema, with
    field-level repair text for invalid arguments) or a fixed sentence of this module naming the tool's noun: never
    the provider's error text, its headers, credentials, exception text or a stack trace.
    """

    status: str  # committed, degraded, human_review, failed, unsettled, blocked, retry_later, refused
    message: str  # the console's public message, or a fixed sentence of this module: never provider text
    next: str | None  # the required_next action (retry_after, repair_args, wait_for_reconcile, degrade, ...)
    result: Any  # committed only: the function's return value (None when a status check proved the effect)
    fallback: str  # degraded only, when the registry names one: the fallback path to take instead
    # With deferred reports: an earlier call of the task that was answered `committed` before the console's verdict,
    # and the console said otherwise — its call state and public message (fixed text), for the model to take back.
    earlier: list[dict[str, Any]]


class RequestRefused(requests.RequestException):
    """A provider request `http()` did not send: the attempt is over, or an earlier request of it failed (only the
    console decides a retry, docs/design/budgets.md)."""


# --- the open task ----------------------------------------------------------------------------------------------------

_TASK: ContextVar[RecoveredTask | None] = ContextVar("recovered_task", default=None)


class RecoveredTask:
    """The task the recovered tools run in, opened by `task()`: calls get the next step numbers, keys its scope."""

    def __init__(self, agent: Runtime, opened: Task, *, patience_s: float) -> None:
        self.agent, self.task, self.patience_s = agent, opened, patience_s
        self.id, self.external_id = opened.id, opened.external_id
        self._steps = itertools.count(max((step["index"] for step in opened.steps or []), default=0) + 1)
        self._lock = threading.Lock()
        self._side_effects: dict[str, str] | None = None

    def next_step(self) -> int:
        with self._lock:
            return next(self._steps)

    def side_effect(self, tool_name: str) -> str:
        """The tool's side-effect class as the tenant's capabilities say (asked once per task); "write" when unknown,
        which is the careful reading (the console refuses a tool that is not a capability anyway)."""
        with self._lock:
            if self._side_effects is None:
                found = self.agent.client.capabilities(self.agent.tenant)
                self._side_effects = {tool["name"]: tool["side_effect"] for tool in found}
            return self._side_effects.get(tool_name, "write")

    def scoped_key(self, key: str) -> str:
        """The call's idempotency key: the intent's key within this task, so two tasks never share one."""
        scoped = f"{self.external_id}:{key}"
        return scoped if _KEY.fullmatch(scoped) else "k-" + hashlib.sha256(scoped.encode()).hexdigest()

    @contextmanager
    def active(self) -> Iterator[RecoveredTask]:
        """Make this the open task where the context does not follow (a thread you start yourself); asyncio tasks,
        `asyncio.to_thread` and `contextvars.copy_context().run` carry it along by themselves."""
        token = _TASK.set(self)
        try:
            yield self
        finally:
            _TASK.reset(token)

    def submit(self, summary: str, deliverable: dict[str, Any] | None = None) -> Task:
        """Submit the task's deliverable (docs/design/tasks.md): the console then sets its outcome from the calls."""
        return self.agent.submit(self.id, summary, deliverable)

    def abandon(self, reason: str) -> Task:
        return self.agent.abandon(self.id, reason)


@contextmanager
def task(
    client: RecoveryClient,
    *,
    tenant: str,
    external_id: str,
    goal: str,
    agent: str = "recovered-tools",
    budget: dict[str, Any] | None = None,
    deadline: str | None = None,
    patience_s: float = 30.0,
    max_wait_s: float = 30.0,
    max_rounds: int = 12,
    defer_reports: bool = False,
) -> Iterator[RecoveredTask]:
    """Open the task (created, or found again by its external id) for the recovered tools called inside.

    `patience_s` bounds how long one tool call waits for reconciliation (then it answers `unsettled` and the console
    goes on settling it), `max_wait_s` the longest Retry-After it waits out (a longer one answers `retry_later`),
    `max_rounds` the admissions one tool call asks for. The task's own budget (`budget`, `deadline`) is the console's
    to enforce. Errors opening the task (the console unreachable, a bad token) are raised here, to the runtime.
    `defer_reports` (API 1.2): a 2xx that passes the checks its admission handed over is answered at once and
    reported from the background (recovery_client.deferred), every report in before the task's next admission and
    before the block ends; a console verdict that disagrees is told with the task's next tool answer."""
    runtime = Runtime(
        client,
        tenant=tenant,
        name=agent,
        log=lambda line: logger.info("%s", line),
        patience_s=patience_s,
        max_rounds=max_rounds,
        max_wait_s=max_wait_s,
        defer_reports=defer_reports,
    )
    opened = RecoveredTask(
        runtime, runtime.start_task(external_id, goal=goal, deadline=deadline, budget=budget), patience_s=patience_s
    )
    try:
        with opened.active():
            yield opened
    finally:
        runtime.reports.close()


def current_task() -> RecoveredTask | None:
    return _TASK.get()


# --- the provider session -------------------------------------------------------------------------------------------

_EXCHANGE: ContextVar[_Exchange | None] = ContextVar("recovered_exchange", default=None)


def http() -> requests.Session:
    """The session for the provider request(s) of the attempt being made, inside a recovered tool's function only.

    It retries nothing (the console decides every retry), puts the call's idempotency key where the registry says
    (the admission's `wire`: a header such as Idempotency-Key or PayPal-Request-Id, a body field such as Square's
    idempotency_key, or nowhere) and at each of its `key_markers` (a body path such as metadata.recovery_key, which
    a listing lookup matches), replacing one the function or its SDK set, applies the tool's timeout when the
    request names none, records each exchange's real facts (status, headers, a timeout, a refused or reset
    connection) and refuses to send again after a request of the
    attempt failed (no reply, 429 or 5xx): RequestRefused."""
    exchange = _EXCHANGE.get()
    if exchange is None:
        raise RuntimeError("recovered.http() serves a recovered tool's function, while the console admits its attempt")
    return exchange.session


# Where the key goes when the console does not say (API 1.0): a write's Idempotency-Key header, X-Request-Id back.
DEFAULT_WIRE: Wire = {
    "key_header": "Idempotency-Key",
    "key_field": "",
    "key_markers": [],
    "request_id_header": "X-Request-Id",
}


class _Exchange:
    """One admitted attempt's provider requests, as `requests` saw them: the last one is what gets reported."""

    def __init__(self, *, key: str, timeout: Any, provider_ref_header: str, wire: Wire) -> None:
        self.key, self.timeout, self.provider_ref_header, self.wire = key, timeout, provider_ref_header, wire
        self.requests = 0
        self.response: requests.Response | None = None
        self.error: BaseException | None = None
        self.closed = False
        self.session = requests.Session()
        adapter = _RecordingAdapter(self)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def refusal(self) -> str:
        if self.closed:
            return "the attempt is over: the session of a recovered tool serves one admitted attempt"
        failed = self.response is not None and (self.response.status_code == 429 or self.response.status_code >= 500)
        if self.error is not None or failed:
            return "a request of this attempt failed: only the recovery console decides whether to try again"
        return ""

    def facts(self, raised: BaseException | None) -> dict[str, Any]:
        """The outcome facts of docs/design/classification.md for the last exchange (or for none)."""
        if self.error is not None:
            return facts_from_exception(self.error)
        if self.response is not None:
            try:
                facts = facts_from_response(self.response, provider_ref_header=self.provider_ref_header)
            except requests.RequestException as exc:  # a streamed body cut short while the function read it
                return facts_from_exception(exc)
            echoed = (
                self.response.headers.get(self.wire.get("key_header") or "") if self.wire.get("key_header") else None
            )
            if echoed is not None:  # the provider says which key it executed: the console checks it is the call's
                facts["echoed_idempotency_key"] = echoed[:255]
            return facts
        if raised is not None:  # the function failed before any request left: provably not sent
            message = f"{type(raised).__name__}: {raised}"[:2000]
            return {
                "connection_opened": False,
                "sent": False,
                "error": {"kind": "client_exception", "message": message},
            }
        # It returned without a request through http(): whether something reached the provider is unknown.
        message = "the tool function made no request through recovered.http()"
        return {"connection_opened": None, "sent": None, "error": {"kind": "client_exception", "message": message}}


class _RecordingAdapter(HTTPAdapter):
    """The transport of `http()`: no retries underneath, the call's key on every request, and what happened kept."""

    def __init__(self, exchange: _Exchange) -> None:
        super().__init__(max_retries=0)  # one layer retries provider requests: the console's (docs/design/budgets.md)
        self.exchange = exchange

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float, float] | tuple[float, None] | None = None,
        verify: bool | str = True,
        cert: bytes | str | tuple[bytes | str, bytes | str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        exchange = self.exchange
        refused = exchange.refusal()
        if refused:
            raise RequestRefused(refused, request=request)
        _place_key(request, exchange.wire, exchange.key)
        exchange.requests += 1
        exchange.response, exchange.error = None, None
        try:
            response = super().send(
                request,
                stream=stream,
                timeout=exchange.timeout if timeout is None else timeout,
                verify=verify,
                cert=cert,
                proxies=proxies,
            )
            if not stream:
                response.content  # noqa: B018 - the body is part of the exchange: a reply cut short is recorded so
        except Exception as exc:
            exchange.error = exc
            raise
        exchange.response = response
        return response


def _place_key(request: requests.PreparedRequest, wire: Wire, key: str) -> None:
    """The call's key where the registry says: a header, or a field of a JSON or form body (replacing any value),
    and at each marker path of the body (`metadata.recovery_key`), by which a listing finds the call's effect."""
    paths = [path.split(".") for path in wire.get("key_markers") or []]
    if wire.get("key_header"):
        request.headers[wire["key_header"]] = key
    elif wire.get("key_field"):
        paths.append([wire["key_field"]])
    if paths:
        _set_body_fields(request, paths, key)


def _set_body_fields(request: requests.PreparedRequest, paths: list[list[str]], key: str) -> None:
    body = request.body.encode() if isinstance(request.body, str) else request.body
    kind = request.headers.get("Content-Type", "")
    if kind.startswith("application/x-www-form-urlencoded"):
        names = {path[0] + "".join(f"[{part}]" for part in path[1:]) for path in paths}
        pairs = [(k, v) for k, v in parse_qsl((body or b"").decode(), keep_blank_values=True) if k not in names]
        request.body = urlencode([*pairs, *((name, key) for name in sorted(names))], safe="[]")
    elif isinstance(body, bytes) and body:
        try:
            data = json.loads(body)
        except ValueError:
            return  # not JSON: the function's own body is sent as it is
        if not isinstance(data, dict):
            return
        for path in paths:
            node = data
            for part in path[:-1]:
                node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
            node[path[-1]] = key
        request.body = json.dumps(data).encode()
    else:
        return
    request.headers["Content-Length"] = str(len(request.body))


# --- the decorator --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Spec:
    name: str
    function: Callable[..., Any]
    signature: inspect.Signature
    key: str | Callable[[dict[str, Any]], str] | None
    arguments: Callable[[dict[str, Any]], dict[str, Any]] | None
    timeout: Any
    provider_ref_header: str | None
    framework_params: frozenset[str]

    def call_arguments(self, bound: inspect.BoundArguments) -> dict[str, Any]:
        """The call's arguments as the console validates them: the function's own, JSON values."""
        values: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if name in self.framework_params:
                continue
            if self.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                values.update(value)
            else:
                values[name] = value
        if self.arguments is not None:
            values = self.arguments(values)
        as_json: dict[str, Any] = json.loads(json.dumps(values, default=str))
        return as_json

    def intent_key(self, arguments: dict[str, Any]) -> str:
        if self.key is None:  # the same arguments, the same intent
            canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
            return f"{self.name}-{hashlib.sha256(canonical.encode()).hexdigest()[:24]}"
        if callable(self.key):
            return str(self.key(arguments))
        return self.key.format(**arguments)


def tool(
    name: str,
    *,
    key: str | Callable[[dict[str, Any]], str] | None = None,
    arguments: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    timeout: Any = (3.05, 10.0),
    provider_ref_header: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., RecoveredResult]]:
    """Make `function` the recovered tool registered as `name` (e.g. "refund.create").

    `key` names the intent: a template over the arguments ("refund-{order_id}"), a callable given the arguments dict,
    or None (a digest of the arguments: the same arguments, the same intent). It is scoped to the open task
    ("<external id>:<key>"), so two tasks never share one; the same key again within the task finds the same call, and
    with other arguments repairs it while nothing was executed. A read tool's every call is a new observation (its key
    gets a suffix of its own). `arguments` maps the function's arguments to the call's
    (default: all of them, defaults applied, without the frameworks' context parameters). `timeout` applies to a
    provider request that names none; `provider_ref_header` is the reply header carrying the provider's reference
    (default: the registry's request_id_header, as the admission names it). The key goes where the registry says.

    What the model sees is the whole return value, a JSON-serialisable `RecoveredResult`, never an exception; the
    table of its statuses, and what each tells the model to do, is in docs/recovered-tools.md.
    """

    def decorate(function: Callable[..., Any]) -> Callable[..., RecoveredResult]:
        if inspect.iscoroutinefunction(function):
            raise TypeError(f"recovered.tool({name!r}) wraps a plain function; {function.__name__} is async")
        signature = inspect.signature(function)
        spec = _Spec(
            name=name,
            function=function,
            signature=signature,
            key=key,
            arguments=arguments,
            timeout=timeout,
            provider_ref_header=provider_ref_header,
            framework_params=_framework_params(signature),
        )
        if isinstance(key, str) and arguments is None:
            _check_template(key, signature, spec.framework_params, name)

        @functools.wraps(function)
        def recovered_tool(*args: Any, **kwargs: Any) -> RecoveredResult:
            return _invoke(spec, args, kwargs)

        # The same parameters (the schema the frameworks derive); the return says what the model now gets.
        recovered_tool.__signature__ = signature.replace(return_annotation=RecoveredResult)  # type: ignore[attr-defined]
        recovered_tool.__annotations__ = {**function.__annotations__, "return": RecoveredResult}
        recovered_tool.recovered_tool = name  # type: ignore[attr-defined]
        return recovered_tool

    return decorate


def _framework_params(signature: inspect.Signature) -> frozenset[str]:
    found = set()
    for name, parameter in signature.parameters.items():
        annotation = parameter.annotation
        text = annotation if isinstance(annotation, str) else repr(annotation)
        if name in _FRAMEWORK_NAMES or (annotation is not parameter.empty and _FRAMEWORK_TYPES.search(text)):
            found.add(name)
    return frozenset(found)


def _check_template(template: str, signature: inspect.Signature, skipped: frozenset[str], name: str) -> None:
    """A key template may name only the function's own parameters: found wrong at import, not at the model's call."""
    known = set(signature.parameters) - skipped
    for _, field, _, _ in string.Formatter().parse(template):
        if field is not None and re.split(r"[.\[]", field, maxsplit=1)[0] not in known:
            raise TypeError(f"recovered.tool({name!r}): key {template!r} names {field!r}, not a parameter")


# --- one call of a recovered tool --------------------------------------------------------------------------------


def _invoke(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RecoveredResult:
    opened = _TASK.get()
    if opened is None:  # fail closed: no task, no budget, no record, so no request
        return _said(REFUSED, "This tool runs only inside an open task; nothing was sent. Stop and report it.")
    run = _Run(spec, opened)
    try:
        answer = run.go(args, kwargs)
        earlier = opened.agent.reports.disagreed.pop(opened.id, [])
        if earlier:  # verdicts that came in since the earlier answers: told with this one
            answer["earlier"] = [_verdict(verdict) for verdict in earlier]
        return answer
    except Exception:  # the console unreachable past the client's retries, or a bug: the model gets no traceback
        logger.exception("recovered tool %s: the run failed", spec.name)
        return run.broken()


class _Run:
    def __init__(self, spec: _Spec, opened: RecoveredTask) -> None:
        self.spec, self.opened = spec, opened
        self.client = opened.agent.client
        self.noun = _noun(spec.name)
        self.nonce = secrets.token_hex(6)  # attempt ids of this run: never an earlier run's stored admission
        self.exchanges: list[_Exchange] = []
        self.read = False
        self.wire: Wire = DEFAULT_WIRE

    def go(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RecoveredResult:
        try:
            bound = self.spec.signature.bind(*args, **kwargs)
        except TypeError:
            return _said(BLOCKED, "The arguments do not match the tool's parameters; nothing was sent.", "repair_args")
        bound.apply_defaults()
        arguments = self.spec.call_arguments(bound)
        intent = self.spec.intent_key(arguments)
        self.read = self.opened.side_effect(self.spec.name) == "read"
        if self.read:  # each read is a fresh observation: its own call, never an earlier answer found again
            intent = f"{intent}-{self.nonce}"
        key = self.opened.scoped_key(intent)
        self.opened.agent.reports.settle(self.opened.id)  # the task's reports are in before it admits anything more
        # API 1.2: the first attempt admitted with the registration, one round trip before the send.
        first = f"rt-{self.nonce}-a1" if self.client.answers(2) else None
        try:
            ref = self.client.add_call(
                self.opened.id,
                step=self.opened.next_step(),
                tool=self.spec.name,
                arguments=arguments,
                idempotency_key=key,
                admit=first,
            )
        except RecoveryError as refused:
            if refused.code == "idempotency_conflict" and refused.detail.get("existing_call"):
                return self.repair(refused.detail["existing_call"], bound, arguments, key)
            return self.refusal(refused)
        if ref.preflight and not ref.preflight.get("passed", True):
            failure: Failure | dict[str, Any] = ref.failure or {}
            message = failure.get("public_message") or "The arguments do not match the tool's schema."
            return _said(BLOCKED, message, "repair_args")
        if ref.state == "COMMITTED":
            return self.answer(
                CallResult(tool=self.spec.name, key=key, call_id=ref.call_id, outcome=COMMITTED, state=ref.state)
            )
        return self.drive(ref.call_id, ref.state, bound, key, first=ref)

    def repair(
        self, call_id: int, bound: inspect.BoundArguments, arguments: dict[str, Any], key: str
    ) -> RecoveredResult:
        """The intent's key again with other arguments: a repair of the same call while nothing was executed (the
        console's gate decides, `args_changed`), else the intent is refused as a conflict."""
        call = self.client.get_call(call_id)
        if call["task_id"] != self.opened.id or call["state"] not in ("READY", "RETRYABLE"):
            return _said(
                BLOCKED,
                f"This {self.noun} was already requested with other arguments; it is not made again. Do not repeat it.",
                "replan",
            )
        return self.drive(call_id, call["state"], bound, key, arguments=arguments, evidence=("args_changed",))

    def drive(
        self, call_id: int, state: str, bound: inspect.BoundArguments, key: str, **repair: Any
    ) -> RecoveredResult:
        result = self.opened.agent.drive_call(
            self.opened.id,
            call_id,
            state=state,
            tool=self.spec.name,
            key=key,
            send=lambda number: self.send(bound, key),
            patience_s=self.opened.patience_s,
            attempt_id=lambda number: f"rt-{self.nonce}-a{number}",
            admitted=self.admitted,
            **repair,
        )
        return self.answer(result)

    def admitted(self, admission: Admission) -> None:
        """The attempt's wire as the console answered it (an older console names none: the defaults)."""
        self.wire = admission.wire or DEFAULT_WIRE

    def send(self, bound: inspect.BoundArguments, key: str) -> tuple[dict[str, Any], Any]:
        """One admitted attempt: the function, with `http()` recording its exchanges; its facts and its value."""
        header = self.spec.provider_ref_header or self.wire.get("request_id_header") or "X-Request-Id"
        exchange = _Exchange(key=key, timeout=self.spec.timeout, provider_ref_header=header, wire=self.wire)
        self.exchanges.append(exchange)
        token = _EXCHANGE.set(exchange)
        raised, value = None, None
        try:
            value = self.spec.function(*bound.args, **bound.kwargs)
        except Exception as exc:  # reported as what the wire saw; the text stays in the log and the Diagnostic
            raised = exc
            # A transport failure is an outcome, not a bug; so is an SDK's exception for an error reply it received.
            bug = not isinstance(exc, requests.RequestException) and exchange.response is None
            logger.warning("recovered tool %s: its function raised %r", self.spec.name, exc, exc_info=bug)
        finally:
            _EXCHANGE.reset(token)
            exchange.closed = True
        return exchange.facts(raised), value

    def answer(self, result: CallResult) -> RecoveredResult:
        """What the model sees of the call's end: the console's public message, or a fixed sentence where that
        message was said before the end (a wait for reconciliation settled it since)."""
        last = result.attempts[-1] if result.attempts else None
        said = last.public_message if last else ""
        action = (last.required_next or {}).get("action") if last else None
        waited = action == "wait_for_reconcile"
        noun, outcome = self.noun, result.outcome
        if outcome == COMMITTED:
            replied = last is not None and 200 <= (last.facts.get("http_status") or 0) < 300
            if last is not None and replied and last.call_state == "COMMITTED":
                done = f"The {self.spec.name} call succeeded." if _SAFE_WORD.fullmatch(self.spec.name) else "Done."
                return _said(COMMITTED, done if self.read else f"The {noun} took effect.", None, result=last.value)
            if result.sent:  # a status check or the provider's callback settled it: its reply was lost or unusable
                message = f"The {noun} took effect: the provider confirmed it, though its reply did not say so. It "
                return _said(COMMITTED, message + "was made once; do not repeat it.", None, result=None)
            return _said(
                COMMITTED,
                f"The {noun} already took effect earlier in this task; it was not made again.",
                None,
                result=None,
            )
        if outcome == UNSETTLED and (result.sent or result.state in SETTLING):
            said = f"The {noun} may have been executed; its status is still being checked. Do not repeat it."
        elif outcome == HUMAN_REVIEW and (waited or not said):
            said = f"The {noun} needs a person's review; a person will decide. Do not repeat it."
        elif outcome == FAILED and (waited or not said or result.detail.startswith("gave up")):
            said = f"The {noun} did not take effect and will not be tried again; do not repeat it."
        extra = {}
        if outcome == DEGRADED:
            fallback = ((last.required_next or {}).get("detail") or {}).get("fallback") if last else None
            if isinstance(fallback, str) and _SAFE_WORD.fullmatch(fallback):
                extra["fallback"] = fallback
        action = _NEXT.get(outcome) if waited else (action or _NEXT.get(outcome))
        return _said(outcome, said or f"The {noun} cannot go on now; stop and report it.", action, **extra)

    def refusal(self, refused: RecoveryError) -> RecoveredResult:
        """The console refused to add the call (nothing was sent): a fixed sentence per reason, never its text."""
        logger.warning("recovered tool %s: the console refused the call: %s", self.spec.name, refused)
        if refused.code == "capability_missing":
            return _said(BLOCKED, "This tool is not available here; replan with one of the authorized capabilities.")
        if refused.code == "task_closed":
            return _said(REFUSED, "The task is closed; nothing was sent. Stop and report what is done.")
        if refused.code == "duplicate_intent":
            message = f"The same {self.noun} is already another call of this task; it is not made twice."
            return _said(BLOCKED, message + " Do not repeat it.", "stop")
        return _said(FAILED, "The recovery console refused this call; nothing was sent. Stop and report it.")

    def broken(self) -> RecoveredResult:
        if any(exchange.requests for exchange in self.exchanges):
            message = f"The {self.noun} may have been executed and its outcome is not recorded yet. Do not repeat it."
            return _said(UNSETTLED, message)
        return _said(FAILED, "The recovery console could not be asked; nothing was sent. Stop and report it.")


def _verdict(answer: OutcomeAnswer) -> dict[str, Any]:
    """A deferred report's verdict that disagreed with the early `committed`: the call, its state, the public text."""
    said = ""
    if answer.decision is not None:
        said = answer.decision.get("public_message") or ""
    if not said and answer.failure is not None:
        said = answer.failure.get("public_message") or ""
    return {"call_id": answer.call_id, "call_state": answer.call_state, "message": said[:MAX_MESSAGE]}


def _said(status: str, message: str, next_action: str | None = "", **extra: Any) -> RecoveredResult:
    action = _NEXT.get(status) if next_action == "" else next_action
    answer: RecoveredResult = {"status": status, "message": message[:MAX_MESSAGE], "next": action}
    answer.update(extra)  # type: ignore[typeddict-item]
    return answer


def _noun(tool_name: str) -> str:
    """What a tool acts on, for a sentence: the segment before its verb ("refund.create", "x.refund.create" ->
    "refund"), as the console's messages say it."""
    parts = tool_name.split(".")
    noun = parts[-2] if len(parts) > 1 else parts[0]
    return noun.replace("_", " ").replace("-", " ") if noun and _SAFE_WORD.fullmatch(noun) else "call"

"""A small client for agent runtimes, on `requests` (docs/api.md).

    client = RecoveryClient("http://127.0.0.1:8000", token)
    task = client.create_task("demo", "order-8848", agent="support-bot", goal="refund order 8848")
    call = client.add_call(task.id, step=1, tool="refund.create", idempotency_key="refund-order-8848-v1",
                           arguments={"order_id": "O-8848", "amount_cents": 80000})
    admission = client.admit(call.call_id, "a1")               # raises NotAdmitted with required_next if denied
    answer = client.report(call.call_id, "a1", facts_from_response(response))

Only one layer retries *provider requests* (docs/design/budgets.md): the runtime, following the decision cards. This
client does retry its *own* calls to this API, because every one of them is idempotent (tasks by external id, calls by
key, attempts by attempt id, a repeated complete or abandon answers the stored result): after a dropped connection, a
gateway's 502/504 (an HTML page, or the shipped nginx's JSON), or a 503 with Retry-After it sends the same request
again, a few times with backoff, and waits out an `in_flight` answer (the first copy of the request is still being
processed). So a reply lost on the way back never leaves the runtime without its answer. The helpers
`facts_from_response` / `facts_from_exception` turn what `requests` saw into the outcome facts of
docs/design/classification.md, so classification rests on what really happened on the wire.

Which consoles it talks to (docs/api.md#versions): every answer of a console names its API in `Recovery-Api-Version`
(`1.<minor>`). This client speaks SUPPORTED_API (a major, from a minor on: a newer minor only adds what it may
ignore) and raises IncompatibleConsole before reading an answer outside it, or one that names no version at all (not
a console, or one older than the header). It names itself in User-Agent (`recovery-console-client/<version>`), and a
console that no longer serves it answers 426, which raises IncompatibleConsole too. Either way it fails loudly,
before a misread answer can steer a retry.
"""

from __future__ import annotations

__version__ = "0.3.0"  # the distribution's version (pyproject.toml reads it from here)

import dataclasses
import random
import re
import time
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from recovery_client.types import (  # the answers' types, re-exported: `from recovery_client import Task`
    Admission,
    AttemptRecord,
    BudgetView,
    CallBrief,
    CallDetail,
    CallRef,
    Capability,
    Check,
    CompensationAttempt,
    CompensationRecord,
    DecisionCard,
    EarlierVerdict,
    Failure,
    FieldErrorInfo,
    Gate,
    GateRecord,
    NextCompensation,
    NotAdmittedDetail,
    OutcomeAnswer,
    Preflight,
    ReceiptRecord,
    ReconcileAccepted,
    ReportTerms,
    RequiredNext,
    Saga,
    StepSummary,
    Task,
    TaskBudget,
    Wire,
    _answer,
)

# The API versions this client speaks: from the first on, up to (not including) the second. The table of client and
# console versions: docs/recovered-tools.md#install.
SUPPORTED_API = ("1.0", "2.0")
API_VERSION_HEADER = "Recovery-Api-Version"
GATEWAY_HEADER = "Recovery-Gateway"  # on the shipped nginx's own answers (deploy/nginx.conf): not the console's
USER_AGENT = f"recovery-console-client/{__version__} python-requests/{requests.__version__}"
_API_VERSION = re.compile(r"([0-9]+)\.([0-9]+)")


def _version_numbers(version: str) -> tuple[int, int] | None:
    found = _API_VERSION.fullmatch(version.strip())
    return (int(found[1]), int(found[2])) if found else None


def speaks(api_version: str | None) -> bool:
    """Whether this client speaks the API version a console names (None: it named none)."""
    numbers = _version_numbers(api_version) if api_version is not None else None
    low, high = (_version_numbers(v) for v in SUPPORTED_API)
    return numbers is not None and low is not None and high is not None and low <= numbers < high


class IncompatibleConsole(Exception):
    """This client and the console cannot talk: the console answers an API version outside SUPPORTED_API (`console`,
    None when it names none), or it no longer serves this client (426: `oldest_client` is the oldest it serves).
    Nothing of the answer was read; install a client that speaks the console's API (docs/recovered-tools.md#install).
    """

    def __init__(self, client: str, console: str | None, *, oldest_client: str | None = None, url: str = "") -> None:
        self.client, self.console, self.oldest_client, self.url = client, console, oldest_client, url
        at = f"the console at {url}" if url else "the console"
        speaks_range = f"API {SUPPORTED_API[0]} up to (not including) {SUPPORTED_API[1]}"
        if oldest_client is not None:
            said = (
                f"{at} (API {console}) serves recovery-console-client {oldest_client} and later; this one is {client}: "
                f"install recovery-console-client>={oldest_client}"
            )
        elif console is None:
            said = (
                f"recovery-console-client {client} speaks {speaks_range}; {at} names no {API_VERSION_HEADER}: it is "
                "not a Recovery Console, or one older than this client"
            )
        else:
            said = (
                f"recovery-console-client {client} speaks {speaks_range}; {at} answers API {console}: install a "
                "client that speaks it"
            )
        super().__init__(said)


class RecoveryError(Exception):
    """A 4xx/5xx answer: `code`, `message`, `field_errors` and `detail` come from the API's error body."""

    def __init__(self, status: int, body: dict[str, Any]):
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.status = status
        self.code = error.get("code", "http_error")
        self.message = error.get("message", str(body)[:500])
        self.field_errors = error.get("field_errors", [])
        self.detail = error.get("detail", {})
        super().__init__(f"{status} {self.code}: {self.message}")


class NotAdmitted(RecoveryError):
    """Admission denied (409): `gate` is the stored answer, `required_next` what to do instead."""

    @property
    def gate(self) -> Gate | dict[str, Any]:
        gate: Gate | dict[str, Any] = self.detail.get("gate", {})
        return gate

    @property
    def required_next(self) -> RequiredNext | dict[str, Any]:
        return self.gate.get("required_next") or {}


# What a dropped or cut exchange with this API raises: the request may or may not have been processed, and since
# every call of this API is idempotent, sending it again is safe.
_DROPPED = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


@dataclass(frozen=True)
class ApiRetry:
    """How this client resends its own API calls (never a provider's request): `attempts` sends at most, full-jitter
    backoff from `base_s` doubling to `cap_s`; an `in_flight` answer is waited out for at most `in_flight_s`."""

    attempts: int = 5
    base_s: float = 0.1
    cap_s: float = 2.0
    in_flight_s: float = 30.0

    def delay(self, number: int, *, retry_after: str | None = None) -> float:
        if retry_after and retry_after.strip().isdigit():
            return min(float(retry_after.strip()), self.cap_s * 5)
        return random.uniform(0, min(self.cap_s, self.base_s * 2**number))


class RecoveryClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: tuple[float, float] = (3.05, 30.0),
        retry: ApiRetry | None = None,
    ):
        self.base_url = base_url.rstrip("/") + "/api/v1"
        self.timeout = timeout
        self.retry = retry or ApiRetry()
        self.session = requests.Session()
        # urllib3 retries nothing underneath: _send decides, knowing which answers are safe to ask for again.
        no_retries = HTTPAdapter(max_retries=0)
        self.session.mount("http://", no_retries)
        self.session.mount("https://", no_retries)
        self.session.headers.update(
            {"Authorization": f"Bearer {token}", "Accept": "application/json", "User-Agent": USER_AGENT}
        )
        # The environment's proxy and CA bundle for the console (HTTPS_PROXY, NO_PROXY, REQUESTS_CA_BUNDLE...), read
        # once here: requests would scan the whole environment again on every call of the hot path. No ~/.netrc
        # either: its credentials would replace the token.
        found = self.session.merge_environment_settings(self.base_url, {}, None, None, None)
        self.session.proxies, self.session.verify = found["proxies"], found["verify"]
        self.session.trust_env = False
        self.api_version: str | None = None  # the console's, as its last answer named it

    def answers(self, minor: int) -> bool:
        """Whether the console's last answer named API 1.<minor> or later (False before any answer)."""
        numbers = _version_numbers(self.api_version) if self.api_version else None
        return numbers is not None and numbers >= (1, minor)

    def _send(
        self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None, timeout: Any = None
    ) -> tuple[int, dict[str, Any]]:
        response, body = self._exchange(method, path, json=json, params=params, timeout=timeout or self.timeout)
        if response.status_code >= 400:
            if response.status_code == 409 and body.get("error", {}).get("code") == "not_admitted":
                raise NotAdmitted(response.status_code, body)
            raise RecoveryError(response.status_code, body)
        return response.status_code, body

    def _exchange(self, method: str, path: str, **kwargs: Any) -> tuple[requests.Response, dict[str, Any]]:
        """One API call, resent while the answer says it may not have been processed (see the module's text)."""
        started, number = time.monotonic(), 0
        while True:
            try:
                kwargs.setdefault("timeout", self.timeout)
                response = self.session.request(method, self.base_url + path, **kwargs)
            except _DROPPED:
                if number + 1 >= self.retry.attempts:
                    raise
                time.sleep(self.retry.delay(number))
                number += 1
                continue
            _check_console(response, self.base_url.removesuffix("/api/v1"))  # before anything of it is read
            self.api_version = response.headers.get(API_VERSION_HEADER) or self.api_version
            body, is_json = _json_body(response)
            code = body["error"].get("code") if isinstance(body.get("error"), dict) else None
            if code == "in_flight" and time.monotonic() - started < self.retry.in_flight_s:
                time.sleep(self.retry.delay(min(number, 4)))  # the first copy is still running: its answer comes
                number += 1
                continue
            gateway = not is_json or GATEWAY_HEADER in response.headers
            resend = (response.status_code in (502, 504) and gateway) or (
                response.status_code == 503 and "Retry-After" in response.headers
            )
            if resend and number + 1 < self.retry.attempts:
                time.sleep(self.retry.delay(number, retry_after=response.headers.get("Retry-After")))
                number += 1
                continue
            return response, body

    # tasks
    def create_task(
        self, tenant: str, external_id: str, *, agent: str, goal: str, budget: dict[str, Any] | None = None
    ) -> Task:
        """Open a task (or find it again by its external id); `budget` may carry its `deadline` (ISO 8601)."""
        payload: dict[str, Any] = {"tenant": tenant, "external_id": external_id, "agent": agent, "goal": goal}
        if budget:
            payload["budget"] = budget
        return self._task(self._send("POST", "/tasks", json=payload)[1])

    def find_task(self, tenant: str, external_id: str) -> Task:
        return self._task(self._send("GET", "/tasks", params={"tenant": tenant, "external_id": external_id})[1])

    def get_task(self, task_id: int) -> Task:
        return self._task(self._send("GET", f"/tasks/{task_id}")[1])

    def complete_task(self, task_id: int, summary: str, deliverable: dict[str, Any] | None = None) -> Task:
        body = {"summary": summary, "deliverable": deliverable}
        return self._task(self._send("POST", f"/tasks/{task_id}/complete", json=body)[1])

    def abandon_task(self, task_id: int, reason: str = "") -> Task:
        return self._task(self._send("POST", f"/tasks/{task_id}/abandon", json={"reason": reason})[1])

    @staticmethod
    def _task(body: dict[str, Any]) -> Task:
        return _answer(Task, body)

    # sagas (docs/compensation.md)
    def compensate_task(self, task_id: int, *, executor: str = "console", reason: str = "") -> Saga:
        """Abort the task as a saga: its committed steps are undone in reverse dependency order, by the console's
        worker (`console`) or by you (`runtime`: ask `next_compensation`, admit, send, report)."""
        body = {"executor": executor, "reason": reason}
        return self._send("POST", f"/tasks/{task_id}/compensate", json=body)[1]  # type: ignore[return-value]

    def task_compensation(self, task_id: int) -> Saga:
        return self._send("GET", f"/tasks/{task_id}/compensation")[1]  # type: ignore[return-value]

    def admit_compensation(self, compensation_id: str, attempt_id: str) -> CompensationAttempt:
        body = {"attempt_id": attempt_id}
        path = f"/compensations/{compensation_id}/attempts"
        return self._send("POST", path, json=body)[1]  # type: ignore[return-value]

    def report_compensation(
        self, compensation_id: str, attempt_id: str, outcome: dict[str, Any]
    ) -> CompensationAttempt:
        path = f"/compensations/{compensation_id}/attempts/{attempt_id}/outcome"
        return self._send("POST", path, json=outcome)[1]  # type: ignore[return-value]

    # calls
    def add_call(
        self,
        task_id: int,
        *,
        step: int,
        tool: str,
        arguments: dict[str, Any],
        idempotency_key: str,
        depends_on: list[int] | tuple[int, ...] = (),
        compensation: dict[str, Any] | None = None,
        admit: str | None = None,
        evidence: tuple[str, ...] = (),
    ) -> CallRef:
        """Register a call; `compensation` ({tool, args}): the step's own undo instead of its tool's default.
        `admit` (an attempt id; API 1.2): its first attempt admitted in the same request, when the call is new or
        READY — the answer's `admission` (or `not_admitted`). A console before 1.2 refuses the field (422): ask only
        when `answers(2)`."""
        payload: dict[str, Any] = {
            "step": step,
            "tool": tool,
            "arguments": arguments,
            "idempotency_key": idempotency_key,
            "depends_on": list(depends_on),
        }
        if compensation is not None:
            payload["compensation"] = compensation
        if admit is not None:
            payload["admit"] = {"attempt_id": admit, "evidence": list(evidence)}
        ref = _answer(CallRef, self._send("POST", f"/tasks/{task_id}/calls", json=payload)[1])
        if isinstance(ref.admission, dict):
            ref = dataclasses.replace(ref, admission=_answer(Admission, ref.admission))
        return ref

    def get_call(self, call_id: int, *, version: int | None = None, wait_ms: int = 0) -> CallDetail:
        """The call; with `version` and `wait_ms` (up to 20000), answered as soon as its version is another one, or
        after `wait_ms` unchanged (a long poll: one request where polling would take many)."""
        if not wait_ms:
            return self._send("GET", f"/calls/{call_id}")[1]  # type: ignore[return-value]
        params = {"version": version, "wait_ms": wait_ms}
        timeout = (self.timeout[0], max(self.timeout[1], wait_ms / 1000 + self.timeout[1]))
        return self._send("GET", f"/calls/{call_id}", params=params, timeout=timeout)[1]  # type: ignore[return-value]

    def abandon_call(self, call_id: int, reason: str = "") -> CallDetail:
        return self._send("POST", f"/calls/{call_id}/abandon", json={"reason": reason})[1]  # type: ignore[return-value]

    def reconcile(self, call_id: int) -> ReconcileAccepted:
        """Ask for an immediate status check (202): the answer says where to poll for the call's state."""
        return self._send("POST", f"/calls/{call_id}/reconcile")[1]  # type: ignore[return-value]

    def capabilities(self, tenant: str) -> list[Capability]:
        tools: list[Capability] = self._send("GET", "/capabilities", params={"tenant": tenant})[1]["tools"]
        return tools

    # attempts
    @staticmethod
    def _candidate(
        attempt_id: str,
        tool: str | None,
        arguments: dict[str, Any] | None,
        credential_version: int | None,
        evidence: tuple[str, ...],
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"attempt_id": attempt_id, "evidence": list(evidence)}
        if tool is not None:
            body["tool"] = tool
        if arguments is not None:
            body["arguments"] = arguments
        if credential_version is not None:
            body["credential_version"] = credential_version
        return body

    def ask_gate(
        self,
        call_id: int,
        attempt_id: str,
        *,
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        credential_version: int | None = None,
        evidence: tuple[str, ...] = (),
    ) -> Gate:
        body = self._candidate(attempt_id, tool, arguments, credential_version, evidence)
        return self._send("POST", f"/calls/{call_id}/gate", json=body)[1]  # type: ignore[return-value]

    def admit(
        self,
        call_id: int,
        attempt_id: str,
        *,
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        credential_version: int | None = None,
        evidence: tuple[str, ...] = (),
    ) -> Admission:
        body = self._candidate(attempt_id, tool, arguments, credential_version, evidence)
        return _answer(Admission, self._send("POST", f"/calls/{call_id}/attempts", json=body)[1])

    def report(self, call_id: int, attempt_id: str, outcome: dict[str, Any]) -> OutcomeAnswer:
        return self._outcome(self._send("POST", f"/calls/{call_id}/attempts/{attempt_id}/outcome", json=outcome)[1])

    def single_shot(
        self,
        call_id: int,
        attempt_id: str,
        outcome: dict[str, Any],
        *,
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        credential_version: int | None = None,
        evidence: tuple[str, ...] = (),
    ) -> OutcomeAnswer:
        body = self._candidate(attempt_id, tool, arguments, credential_version, evidence) | {"outcome": outcome}
        return self._outcome(self._send("POST", f"/calls/{call_id}/attempts", json=body)[1])

    @staticmethod
    def _outcome(body: dict[str, Any]) -> OutcomeAnswer:
        return _answer(OutcomeAnswer, body)


def _check_console(response: requests.Response, url: str) -> None:
    """IncompatibleConsole unless the answer comes from a console this client speaks to. An answer that names no
    version and is not JSON, or that carries Recovery-Gateway (the shipped nginx's JSON envelope), is a gateway's or
    a proxy's (a 502 while the console restarts): not the console's word on compatibility, it goes on to the resend
    rules. A console's answers are JSON and always name it."""
    console = response.headers.get(API_VERSION_HEADER)
    if console is None and GATEWAY_HEADER in response.headers:
        return
    if console is None and not response.headers.get("Content-Type", "").startswith("application/json"):
        return
    if not speaks(console):
        raise IncompatibleConsole(__version__, console, url=url)
    if response.status_code == 426:
        body, _ = _json_body(response)
        detail = body.get("error", {}).get("detail") if isinstance(body.get("error"), dict) else None
        oldest = detail.get("oldest_client") if isinstance(detail, dict) else None
        raise IncompatibleConsole(__version__, console, oldest_client=str(oldest or "?"), url=url)


def _json_body(response: requests.Response) -> tuple[dict[str, Any], bool]:
    """The answer's JSON object, and whether it was JSON at all (a gateway's error page is not)."""
    try:
        body = response.json()
    except ValueError:
        return {"error": {"code": "invalid_response", "message": response.text[:500]}}, False
    return (body if isinstance(body, dict) else {"value": body}), True


# --- facts from what requests saw ------------------------------------------------------------------------------------


def facts_from_response(response: requests.Response, *, provider_ref_header: str = "X-Request-Id") -> dict[str, Any]:
    """Outcome facts for a reply that arrived: status, Retry-After, provider reference, JSON result."""
    facts: dict[str, Any] = {"connection_opened": True, "sent": True, "http_status": response.status_code}
    retry_after = response.headers.get("Retry-After")
    if retry_after and retry_after.strip().isdigit():
        facts["retry_after_ms"] = int(retry_after.strip()) * 1000
    if response.headers.get(provider_ref_header):
        facts["provider_request_id"] = response.headers[provider_ref_header]
    try:
        facts["result"] = response.json()
    except ValueError:
        if 200 <= response.status_code < 300:
            facts["error"] = {"kind": "invalid_response", "message": response.text[:2000]}
    if isinstance(facts.get("result"), dict) and response.status_code >= 400:
        code = facts["result"].get("code") or (facts["result"].get("error") or {}).get("code")
        if isinstance(code, str):
            facts["error"] = {"code": code[:100]}
    return facts


def facts_from_exception(exc: BaseException) -> dict[str, Any]:
    """Outcome facts for a request that got no reply, from the real exception `requests` raised."""
    message = f"{type(exc).__name__}: {exc}"[:2000]
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return {"connection_opened": False, "sent": False, "error": {"kind": "connect_timeout", "message": message}}
    if isinstance(exc, requests.exceptions.SSLError):
        return {"connection_opened": False, "sent": False, "error": {"kind": "tls", "message": message}}
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return {"connection_opened": True, "sent": True, "error": {"kind": "read_timeout", "message": message}}
    if isinstance(exc, requests.exceptions.ConnectionError):
        text = repr(exc)
        if "NameResolutionError" in text or "Name or service not known" in text:
            return {"connection_opened": False, "sent": False, "error": {"kind": "dns", "message": message}}
        if "NewConnectionError" in text or "Connection refused" in text:
            return {
                "connection_opened": False,
                "sent": False,
                "error": {"kind": "connection_refused", "message": message},
            }
        return {"connection_opened": True, "sent": None, "error": {"kind": "reset", "message": message}}
    if isinstance(exc, (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError)):
        return {"connection_opened": True, "sent": True, "error": {"kind": "invalid_response", "message": message}}
    return {"connection_opened": None, "sent": None, "error": {"kind": "client_exception", "message": message}}


__all__ = [
    "API_VERSION_HEADER",
    "SUPPORTED_API",
    "USER_AGENT",
    "Admission",
    "ApiRetry",
    "AttemptRecord",
    "BudgetView",
    "CallBrief",
    "CallDetail",
    "CallRef",
    "Capability",
    "Check",
    "CompensationAttempt",
    "CompensationRecord",
    "DecisionCard",
    "EarlierVerdict",
    "Failure",
    "FieldErrorInfo",
    "Gate",
    "GateRecord",
    "IncompatibleConsole",
    "NextCompensation",
    "NotAdmitted",
    "NotAdmittedDetail",
    "OutcomeAnswer",
    "Preflight",
    "ReceiptRecord",
    "ReconcileAccepted",
    "RecoveryClient",
    "RecoveryError",
    "ReportTerms",
    "RequiredNext",
    "Saga",
    "StepSummary",
    "Task",
    "TaskBudget",
    "Wire",
    "facts_from_exception",
    "facts_from_response",
    "recovered",
    "runtime",
    "speaks",
]

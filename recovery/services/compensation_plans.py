"""What a compensation ledger entry will be, before it exists (docs/compensation.md): its tool, arguments, own key,
target and expected effect, from the registry template. A template needing a value the call lacks is a field error,
and no entry is made.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from recovery.engine.reconcile import Observation
from recovery.engine.types import FieldError
from recovery.engine.validation import MISSING, resolve
from recovery.models import Attempt, Call, Receipt, Tool
from recovery.providers.requests import ProviderRequest, tool_request
from recovery.registry import tool_policy
from recovery.services.errors import Refusal

# --- the entry's plan -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EntryPlan:
    """What an entry will be: its tool and filled arguments, key, target and expected effect."""

    tool: Tool
    arguments: dict
    idempotency_key: str
    target: str
    expected_effect: str
    max_attempts: int | None
    number: int = 1

    @property
    def side_effect(self) -> str:
        return "write"

    @property
    def provider_ref(self) -> str:
        return ""

    def request(self) -> ProviderRequest:
        """The request the entry will send (its tool's template, its arguments, its own key); TemplateError when
        the tool's template needs an argument the entry lacks."""
        return tool_request(self.tool, self)


def derive_key(original_key: str, number: int) -> str:
    """The entry's own key: stable for (original key, entry number), never regenerated, at most 255 characters."""
    key = f"{original_key}.compensation-{number}"
    if len(key) <= 255:
        return key
    return f"compensation-{hashlib.sha256(original_key.encode()).hexdigest()}-{number}"


def call_result(call: Call) -> Any:
    """The forward effect's result as the provider gave it: the committed attempt's reply, else the body of the
    receipt that confirmed it (a call settled by reconciliation has no reply of its own)."""
    attempt = (
        Attempt.objects.filter(call=call, http_status__gte=200, http_status__lt=300)
        .exclude(facts__isnull=True)
        .order_by("-number")
        .values_list("facts", flat=True)
        .first()
    )
    if isinstance(attempt, dict) and isinstance(attempt.get("result"), dict):
        return attempt["result"]
    response = (
        Receipt.objects.filter(call=call, observed=Observation.COMMITTED)
        .order_by("-checked_at", "-pk")
        .values_list("response", flat=True)
        .first()
    )
    if isinstance(response, dict) and isinstance(response.get("body"), dict):
        return response["body"]
    return None


def _fill(template: Any, values: dict, path: str, missing: list[FieldError]) -> Any:
    if isinstance(template, dict):
        return {key: _fill(value, values, f"{path}.{key}", missing) for key, value in template.items()}
    if isinstance(template, list):
        return [_fill(value, values, f"{path}[{i}]", missing) for i, value in enumerate(template)]
    if not isinstance(template, str) or "{" not in template:
        return template
    names = [part.split("}", 1)[0] for part in template.split("{")[1:]]
    found = {name: resolve(values, name.strip()) for name in names}
    for name, value in found.items():
        if value is MISSING or value is None or value == "":
            missing.append(
                FieldError(
                    field=path.removeprefix("args."),
                    expected=f"{{{name}}} from the committed call",
                    received=None,
                    suggestion=(
                        f"the call has no {name}: settle it with a result or a provider reference first"
                        if name.startswith(("result", "provider_ref"))
                        else f"the call's arguments lack {name}"
                    ),
                )
            )
    if missing:
        return None
    if template.startswith("{") and template.endswith("}") and len(names) == 1 and template == f"{{{names[0]}}}":
        return found[names[0]]  # a template that is one whole field keeps its JSON type ("{amount_cents}": a number)
    text = template
    for name, value in found.items():
        text = text.replace(f"{{{name}}}", str(value))
    return text


_NOUNS = {"cancel": "cancellation", "revoke": "revocation", "delete": "deletion", "reverse": "reversal"}


def _effect_noun(tool_name: str) -> str:
    """What one effect of a compensation tool is called: order.cancel → cancellation, refund.create → refund."""
    service, _, verb = tool_name.rpartition(".")
    return _NOUNS.get(verb) or (service.split(".")[-1] if service else verb).replace("_", " ")


def entry_plan(call: Call, number: int) -> EntryPlan:
    """The entry `number` of `call` would be; Refusal 422 `compensation_unavailable` (field errors) when the
    tool has no compensation or its template needs a value the call does not have — then no entry is made."""
    own = call.step.compensation if isinstance(call.step.compensation, dict) else {}
    template = own or (call.tool.compensation if isinstance(call.tool.compensation, dict) else {})
    if not template.get("tool"):
        raise Refusal(
            "compensation_unavailable",
            f"{call.tool.name} declares no compensation in the registry",
            status=422,
            field_errors=[
                FieldError(
                    field="compensation",
                    expected="a registry compensation {tool, args} for this tool",
                    received=None,
                    suggestion="Add one to the tool's registry entry, or settle the effect by hand.",
                )
            ],
        )
    tool = Tool.objects.select_related("provider").filter(name=template["tool"]).first()
    if tool is None:
        raise Refusal(
            "compensation_unavailable", f"the compensation tool {template['tool']} is not registered", status=422
        )
    result = call_result(call)
    values = {
        **(call.arguments if isinstance(call.arguments, dict) else {}),
        "result": result if isinstance(result, dict) else {},
        "provider_ref": call.provider_ref,
        "idempotency_key": call.idempotency_key,
    }
    missing: list[FieldError] = []
    arguments = _fill(template.get("args") or {}, values, "args", missing)
    if missing:
        raise Refusal(
            "compensation_unavailable",
            f"the compensation of {call.tool.name} needs values this call does not have",
            status=422,
            field_errors=missing,
        )
    if number > 1:
        arguments = _what_is_left(call, arguments)
    ref = call.provider_ref or call.idempotency_key
    noun = _effect_noun(tool.name)
    policy = tool_policy(tool)
    return EntryPlan(
        tool=tool,
        arguments=arguments,
        idempotency_key=derive_key(call.idempotency_key, number),
        target=f"{call.tool.name} {ref}"[:300],
        expected_effect=f"{tool.name} undoes {call.tool.name} {ref}: one {noun} expected"[:300],
        max_attempts=policy.budgets.max_attempts,
        number=number,
    )


def _what_is_left(call: Call, arguments):
    """After a partial undo, the next entry undoes what is left of the amount, never the whole amount again."""
    amount = arguments.get("amount_cents") if isinstance(arguments, dict) else None
    if not isinstance(amount, int) or isinstance(amount, bool):
        return arguments
    done = sum(
        call.compensations.filter(state="committed", undone_amount__isnull=False).values_list(
            "undone_amount", flat=True
        )
    )
    return {**arguments, "amount_cents": max(amount - done, 0)}


def next_entry_plan(call: Call) -> EntryPlan:
    """The plan of the call's next entry (what a dry run shows)."""
    return entry_plan(call, call.compensations.count() + 1)

"""Argument and result validation (docs/design/classification.md rows 4 and 10-11): JSON Schema (Draft 2020-12) turned
into FieldErrors a model can act on: the dotted `field`, what was `expected` in a few words (from the schema, or its
"x-expected"), the value `received` and a `suggestion` ("x-suggestion", else one by type). jsonschema's own messages
are never used: they quote the received value, and a received value can be hostile text.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import jsonschema
import referencing.exceptions

from recovery.engine.canonical import normalize
from recovery.engine.types import Facts, FieldError, ToolPolicy

MISSING = object()  # a path that leads nowhere, distinct from a present null

ARGUMENTS_ROOT, RESULT_ROOT = "arguments", "result"
RESULT_SUGGESTION = "Do not use this result: it failed validation."


# --- schema handling -----------------------------------------------------------------------------------------------

_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
_SCHEMA_VALUES = (
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "not",
    "unevaluatedItems",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")


def _without_false_properties(schema: Any) -> Any:
    """`{"x": false}` under properties, written as the equivalent `{"x": {"not": {}}}`.

    jsonschema reports a false subschema's error without its path (it is yielded before the path is added), so
    a forbidden field would be reported at its parent; `not {}` rejects the same values with the path kept.
    """
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {
                name: {"not": {}} if sub is False else _without_false_properties(sub)
                for name, sub in schema[key].items()
            }
    for key in _SCHEMA_VALUES:
        if isinstance(schema.get(key), dict):
            out[key] = _without_false_properties(schema[key])
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [_without_false_properties(sub) for sub in schema[key]]
    return out


def _is_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True  # formats apply to strings only
    return parse_time(value) is not None


_FORMATS = jsonschema.FormatChecker(formats=jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
if "date-time" not in _FORMATS.checkers:
    # jsonschema checks date-time only when rfc3339-validator is installed; the engine checks it always
    _FORMATS.checks("date-time")(_is_datetime)


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_json)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"invalid JSON Schema at {'/'.join(map(str, exc.absolute_path)) or '(root)'}") from exc
    return jsonschema.Draft202012Validator(_without_false_properties(schema), format_checker=_FORMATS)


def property_schema(schema: Any, field: str) -> dict:
    """The subschema that describes a dotted field ("items.0.sku"), or {} when the schema does not say."""
    node = schema
    for part in field.split(".") if field else ():
        node = _resolve_ref(schema, node)
        if not isinstance(node, dict):
            return {}
        properties = node.get("properties")
        if isinstance(properties, dict) and part in properties:
            node = properties[part]
        elif part.isdigit() and isinstance(node.get("prefixItems"), list) and int(part) < len(node["prefixItems"]):
            node = node["prefixItems"][int(part)]
        elif part.isdigit() and isinstance(node.get("items"), dict):
            node = node["items"]
        else:
            return {}
    node = _resolve_ref(schema, node)
    return node if isinstance(node, dict) else {}


def _resolve_ref(root: Any, node: Any) -> Any:
    for _ in range(8):  # local references only, and never a loop
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/")):
            return node
        target = root
        for token in node["$ref"][2:].split("/"):
            token = token.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or token not in target:
                return node
            target = target[token]
        node = target
    return node


# --- describing a schema in a few words ----------------------------------------------------------------------------


def show(value: Any) -> str:
    """A value as a person reads it in a sentence: strings bare, numbers normalized, JSON for the rest."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(normalize(value))
    try:
        return json.dumps(normalize(value), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return str(value)


def _types(schema: dict) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    return [t for t in declared if isinstance(t, str)] if isinstance(declared, list) else []


def describe(schema: Any) -> str:
    """What a value must be, in a few words: "positive integer", "string matching ^O-\\d+$", "one of: a, b"."""
    if schema is False or schema == {"not": {}}:
        return "no such field"
    if not isinstance(schema, dict) or not schema:
        return "valid value"
    if isinstance(schema.get("x-expected"), str) and schema["x-expected"]:
        return schema["x-expected"]
    if "const" in schema:
        return f"exactly {show(schema['const'])}"
    if isinstance(schema.get("enum"), list):
        return "one of: " + ", ".join(show(value) for value in schema["enum"])
    for combinator in ("anyOf", "oneOf"):
        if isinstance(schema.get(combinator), list) and schema[combinator]:
            return " or ".join(dict.fromkeys(describe(sub) for sub in schema[combinator]))
    types = _types(schema)
    if len(types) > 1:
        return " or ".join(_describe_type(schema, t) for t in types)
    qualifiers = _bounds(schema)
    if types:
        return ", ".join([_describe_type(schema, types[0]), *qualifiers])
    return ", ".join(qualifiers) or "valid value"


def _describe_type(schema: dict, type_name: str) -> str:
    if type_name in ("integer", "number"):
        low, exclusive_low = schema.get("minimum"), schema.get("exclusiveMinimum")
        if exclusive_low == 0 or (low == 1 and type_name == "integer"):
            return f"positive {type_name}"
        if low == 0:
            return f"non-negative {type_name}"
        return type_name
    if type_name == "string":
        if isinstance(schema.get("pattern"), str):
            return f"string matching {schema['pattern']}"
        if isinstance(schema.get("format"), str):
            return f"{schema['format']} string"
        if schema.get("minLength") == 1 and "maxLength" not in schema:
            return "non-empty string"
        return "string"
    if type_name == "array" and isinstance(schema.get("items"), dict) and schema["items"]:
        return f"array of {describe(schema['items'])}"
    return type_name


def _bounds(schema: dict) -> list[str]:
    out = []
    types = _types(schema)
    numeric = len(types) == 1 and types[0] in ("integer", "number")
    low, high = schema.get("minimum"), schema.get("maximum")
    exclusive_low, exclusive_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    # "positive integer" / "non-negative number" already say these bounds (see _describe_type)
    said_low = numeric and (low == 0 or (low == 1 and types[0] == "integer"))
    said_exclusive_low = numeric and exclusive_low == 0
    if isinstance(low, (int, float)) and not said_low:
        out.append(f"at least {show(low)}")
    if isinstance(exclusive_low, (int, float)) and not said_exclusive_low:
        out.append(f"greater than {show(exclusive_low)}")
    if isinstance(high, (int, float)):
        out.append(f"at most {show(high)}")
    if isinstance(exclusive_high, (int, float)):
        out.append(f"less than {show(exclusive_high)}")
    if isinstance(schema.get("multipleOf"), (int, float)):
        out.append(f"a multiple of {show(schema['multipleOf'])}")
    for key, unit in (("minLength", "character"), ("minItems", "item"), ("minProperties", "field")):
        if isinstance(schema.get(key), int) and not (key == "minLength" and schema[key] == 1):
            out.append(f"at least {_count(schema[key], unit)}")
    for key, unit in (("maxLength", "character"), ("maxItems", "item"), ("maxProperties", "field")):
        if isinstance(schema.get(key), int):
            out.append(f"at most {_count(schema[key], unit)}")
    return out


def _count(number: int, unit: str) -> str:
    return f"{number} {unit}" if number == 1 else f"{number} {unit}s"


# --- suggestions ---------------------------------------------------------------------------------------------------


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _matches_type(value: Any, type_name: str) -> bool:
    checks = {
        "integer": lambda v: isinstance(v, int) or (isinstance(v, float) and v.is_integer()),
        "number": lambda v: isinstance(v, (int, float)),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }
    check = checks.get(type_name)
    if check is None:
        return True
    return check(value) and (type_name in ("boolean", "null") or not isinstance(value, bool))


def _example_number(schema: dict, received: Any, integer: bool) -> str:
    number = _as_number(received)
    low = schema.get("minimum")
    if number is None:
        number = float(low) if isinstance(low, (int, float)) else 1.0
    if integer:
        number = float(math.trunc(number))
    if isinstance(low, (int, float)) and number < low:
        number = float(low)
    high = schema.get("maximum")
    if isinstance(high, (int, float)) and number > high:
        number = float(high)
    return show(int(number) if integer or number.is_integer() else number)


def _value_suggestion(schema: dict, received: Any, expected: str) -> str:
    types = _types(schema)
    if "enum" in schema or "const" in schema:
        return f"Use {expected}."
    mismatch = [t for t in types if not _matches_type(received, t)]
    if types and len(mismatch) == len(types):
        wanted = types[0]
        if wanted == "integer":
            return f"Send an integer without quotes or decimals, e.g. {_example_number(schema, received, True)}."
        if wanted == "number":
            return f"Send a number without quotes, e.g. {_example_number(schema, received, False)}."
        if wanted == "string":
            return "Send a string in quotes."
        if wanted == "boolean":
            return "Send true or false without quotes."
        if wanted == "array":
            return "Send a JSON array."
        if wanted == "object":
            return "Send a JSON object."
        if wanted == "null":
            return "Send null."
    return f"Send {article(expected)}{expected}."


def article(expected: str) -> str:
    """'a ' / 'an ' before a noun phrase, '' before a phrase that needs none ("one of: ...", "at most 100")."""
    bare = ("one of", "at ", "exactly", "present", "no such", "not ", "equal", "greater", "less", "between", "null")
    if not expected or expected.startswith(bare):
        return ""
    return "an " if expected[0].lower() in "aeio" else "a "


# --- validation ----------------------------------------------------------------------------------------------------


def _join(root: str, prefix: str, parts: list[Any]) -> str:
    path = ".".join(str(part) for part in parts)
    if prefix:
        return f"{prefix}.{path}" if path else prefix
    return path or root


def _errors(schema: dict, instance: Any, *, root: str, prefix: str, for_result: bool) -> list[FieldError]:
    if not schema:
        return []
    try:
        schema_json = json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the schema is not JSON: {exc}") from exc
    validator = _validator(schema_json)
    out: list[FieldError] = []
    try:
        errors = list(validator.iter_errors(instance))
    except referencing.exceptions.Unresolvable as exc:
        raise ValueError(f"invalid JSON Schema: unresolvable reference {exc}") from exc
    for error in errors:
        path = list(error.absolute_path)
        if error.validator == "required" and isinstance(error.instance, dict):
            missing = [name for name in error.validator_value if name not in error.instance]
            out.extend(_missing(error.schema, path, name, root, prefix, for_result) for name in missing)
        elif error.validator == "dependentRequired" and isinstance(error.instance, dict):
            for present, needed in error.validator_value.items():
                if present in error.instance:
                    missing = [name for name in needed if name not in error.instance]
                    out.extend(_missing(error.schema, path, name, root, prefix, for_result) for name in missing)
        elif error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(error.instance, dict):
            out.extend(_extras(error.schema, error.instance, path, root, prefix, for_result))
        else:
            out.append(_invalid(error.schema, error.instance, path, root, prefix, for_result))
    unique = {(e.field, e.expected): e for e in out}
    return [unique[key] for key in sorted(unique)]


def _missing(parent: Any, path: list, name: str, root: str, prefix: str, for_result: bool) -> FieldError:
    sub = property_schema(parent, name) if isinstance(parent, dict) else {}
    field = _join(root, prefix, [*path, name])
    if for_result:
        suggestion = RESULT_SUGGESTION
    elif isinstance(sub.get("x-suggestion"), str):
        suggestion = sub["x-suggestion"]
    else:
        wanted = describe(sub)
        suggestion = f"Add {name}" + (f" ({article(wanted)}{wanted})." if wanted != "valid value" else ".")
    return FieldError(field=field, expected="present", received=None, suggestion=suggestion)


def _extras(parent: Any, instance: dict, path: list, root: str, prefix: str, for_result: bool) -> list[FieldError]:
    parent = parent if isinstance(parent, dict) else {}
    known = parent.get("properties") if isinstance(parent.get("properties"), dict) else {}
    patterns = list(parent.get("patternProperties") or {})
    extras = [
        name for name in instance if name not in known and not any(re.search(pattern, name) for pattern in patterns)
    ]
    accepted = ", ".join(sorted(name for name, sub in known.items() if sub is not False))
    out = []
    for name in extras:
        if for_result:
            suggestion = RESULT_SUGGESTION
        else:
            suggestion = f"Remove {name}; accepted fields: {accepted}." if accepted else f"Remove {name}."
        out.append(
            FieldError(
                field=_join(root, prefix, [*path, name]),
                expected="no such field",
                received=instance[name],
                suggestion=suggestion,
            )
        )
    return out


def _invalid(schema: Any, instance: Any, path: list, root: str, prefix: str, for_result: bool) -> FieldError:
    expected = describe(schema)
    if for_result:
        suggestion = RESULT_SUGGESTION
    elif isinstance(schema, dict) and isinstance(schema.get("x-suggestion"), str):
        suggestion = schema["x-suggestion"]
    elif expected == "no such field":
        suggestion = f"Remove {path[-1]}." if path else "Send no value."
    else:
        suggestion = _value_suggestion(schema if isinstance(schema, dict) else {}, instance, expected)
    return FieldError(field=_join(root, prefix, path), expected=expected, received=instance, suggestion=suggestion)


def validate_args(schema: dict, args: dict) -> tuple[FieldError, ...]:
    """One FieldError per problem of `args` against `schema` (Draft 2020-12), sorted by field.

    An empty schema accepts anything; an invalid schema raises ValueError.
    """
    return tuple(_errors(schema, args, root=ARGUMENTS_ROOT, prefix="", for_result=False))


# --- results (row 11) ----------------------------------------------------------------------------------------------


def resolve(value: Any, path: str) -> Any:
    """The value at a dotted path ("refund.items.0.sku"), or MISSING."""
    node = value
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 date-time with a time part ("2026-08-20T18:50:00Z"); a naive one is taken as UTC."""
    if not isinstance(value, str) or len(value) < 16 or value[10:11] not in ("T", "t", " "):
        return None
    text = value[:-1] + "+00:00" if value[-1:] in ("Z", "z") else value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _same(a: Any, b: Any) -> bool:
    try:
        return normalize(a) == normalize(b) and type(normalize(a)) is type(normalize(b))
    except ValueError:
        return False


def _result_error(field: str, expected: str, received: Any) -> FieldError:
    return FieldError(
        field=f"{RESULT_ROOT}.{field}",
        expected=expected,
        received=None if received is MISSING else received,
        suggestion=RESULT_SUGGESTION,
    )


def _freshness(tool: ToolPolicy, result: Any, now: datetime | None) -> list[FieldError]:
    if not tool.result_time_field or tool.max_result_age_s is None:
        return []
    expected = f"ISO 8601 time at most {tool.max_result_age_s} s old"
    value = resolve(result, tool.result_time_field)
    stamp = parse_time(value)
    if stamp is None:
        return [_result_error(tool.result_time_field, expected, value)]
    if now is None:
        return []  # nothing to compare with: the engine never reads the clock itself
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    if (now - stamp).total_seconds() > tool.max_result_age_s:
        return [_result_error(tool.result_time_field, expected, value)]
    return []


def _invariants(tool: ToolPolicy, result: Any, arguments: dict) -> list[FieldError]:
    out = []
    for invariant in tool.invariants:
        actual = resolve(result, invariant.result)
        if invariant.equals_arg is not None:
            wanted = resolve(arguments, invariant.equals_arg)
            # an absent argument leaves nothing to compare with
            if wanted is not MISSING and (actual is MISSING or not _same(actual, wanted)):
                out.append(_result_error(invariant.result, f"equal to argument {invariant.equals_arg}", actual))
        if invariant.one_of is not None and (
            actual is MISSING or not any(_same(actual, allowed) for allowed in invariant.one_of)
        ):
            out.append(_result_error(invariant.result, "one of: " + ", ".join(map(show, invariant.one_of)), actual))
        if invariant.minimum is not None:
            number = actual if isinstance(actual, (int, float)) and not isinstance(actual, bool) else None
            if number is None or number < invariant.minimum:
                out.append(_result_error(invariant.result, f"at least {show(invariant.minimum)}", actual))
    return out


def validate_result(tool: ToolPolicy, result: Any, *, arguments: dict, now: datetime | None) -> tuple[FieldError, ...]:
    """The row-11 checks of docs/design/classification.md on a 2xx result: schema, required fields, freshness,
    invariants.

    Fields are prefixed "result.". Freshness needs `now` (the caller's clock, e.g. the attempt's finished_at):
    without it only the presence and the format of the time field are checked.
    """
    out = _errors(tool.result_schema, result, root=RESULT_ROOT, prefix=RESULT_ROOT, for_result=True)
    for path in tool.required_result_fields:
        value = resolve(result, path)
        if value is MISSING or value is None:
            out.append(_result_error(path, "present", None))
    out.extend(_freshness(tool, result, now))
    out.extend(_invariants(tool, result, arguments))
    unique = {(e.field, e.expected): e for e in out}
    return tuple(unique[key] for key in sorted(unique))


def provider_ref(tool: ToolPolicy, facts: Facts) -> str:
    """The provider's reference for the effect: its request id, else the result field the registry names."""
    if facts.provider_request_id:
        return facts.provider_request_id
    if not tool.provider_ref_field:
        return ""
    value = resolve(facts.result, tool.provider_ref_field)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return ""
    return str(value).strip()

"""The tool registry as configuration: the file format, load_registry, tool_policy, load_tools and the admin."""

from __future__ import annotations

import copy
import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from recovery.audit.chain import Actor, verify_all
from recovery.engine.types import BackoffPolicy, BreakerPolicy, Budgets, Invariant
from recovery.models import AuditEvent, Provider, Tenant, Tool
from recovery.registry import (
    RegistryInvalid,
    load_registry,
    policy_tools,
    registry_sha256,
    tool_policy,
    validate_registry,
    with_alternates,
)
from recovery.services.users import user_save_with_roles

EXAMPLE = Path(__file__).resolve().parent.parent / "recovery" / "fixtures" / "registry.example.json"
EXAMPLE_DATA = json.loads(EXAMPLE.read_text())
PASSWORD = "correct-horse-battery-9"


def example() -> dict:
    return copy.deepcopy(EXAMPLE_DATA)


def index(data: dict, name: str) -> int:
    return next(i for i, tool in enumerate(data["tools"]) if tool["name"] == name)


def tool_of(data: dict, name: str) -> dict:
    return data["tools"][index(data, name)]


def snapshot() -> dict:
    """Every registry row and link, to show that something wrote nothing."""
    return {
        "tenants": list(Tenant.objects.order_by("name").values()),
        "tenant_tools": sorted(Tenant.tools.through.objects.values_list("tenant_id", "tool_id")),
        "providers": list(Provider.objects.order_by("name").values()),
        "tools": list(Tool.objects.order_by("name").values()),
        "alternates": sorted(Tool.alternates.through.objects.values_list("from_tool_id", "to_tool_id")),
        "audit": AuditEvent.objects.count(),
    }


def paths(errors) -> list[str]:
    return [error.path for error in errors]


def minimal_tool(**fields) -> dict:
    return {
        "name": "note.read",
        "provider": "sandbox",
        "side_effect": "read",
        "request": {"method": "GET", "path": "/notes/{note_id}"},
        "args_schema": {"type": "object", "properties": {"note_id": {"type": "string"}}},
        **fields,
    }


@pytest.fixture
def loaded(db, actor):
    return load_registry(example(), actor=actor)


# --- loading --------------------------------------------------------------------------------------------------------


def test_it_loads_the_example_file(db, actor):
    report = load_registry(example(), actor=actor)

    assert report.counts() == {
        "tenants": {"created": 1, "updated": 0, "unchanged": 0},
        "providers": {"created": 1, "updated": 0, "unchanged": 0},
        "tools": {"created": len(EXAMPLE_DATA["tools"]), "updated": 0, "unchanged": 0},
    }
    demo = Tenant.objects.get(name="demo")
    assert (demo.sandbox, demo.all_tools, demo.tools.count()) == (True, True, 0)
    sandbox = Provider.objects.get(name="sandbox")
    assert sandbox.base_url == "http://127.0.0.1:8001"
    assert sandbox.auth == {"kind": "bearer", "secret_env": "SANDBOX_API_KEY"}
    assert sandbox.callback_secret_env == "SANDBOX_CALLBACK_SECRET"
    assert sandbox.idempotency_conflict_codes == ["idempotency_key_reused"]
    refund = Tool.objects.get(name="refund.create")
    assert (refund.side_effect, refund.risk, refund.provider_ref_field) == ("write", "high", "refund_id")
    assert refund.status_query["path"] == "/refunds/by-key/{idempotency_key}"
    assert refund.args_schema["properties"]["amount_cents"]["x-unit"] == "cents"
    assert Tool.objects.get(name="access.grant").budgets["unknown_budget"] == 0
    assert [t.name for t in Tool.objects.get(name="order.lookup").alternates.all()] == ["order.lookup_replica"]

    event = AuditEvent.objects.get(action="registry.loaded")
    assert event.pk == report.audit_event_id
    assert (event.chain, event.actor_label) == ("system", "system:tests")
    assert event.evidence["sha256"] == registry_sha256(EXAMPLE_DATA) == report.sha256
    assert event.evidence["counts"] == report.counts()
    assert verify_all().ok


def test_loading_the_same_file_twice_changes_nothing(loaded, actor):
    before = snapshot()
    with CaptureQueriesContext(connection) as queries:
        report = load_registry(example(), actor=actor)

    assert not report.changed
    assert report.audit_event_id is None
    assert report.counts()["tools"] == {"created": 0, "updated": 0, "unchanged": len(EXAMPLE_DATA["tools"])}
    assert report.counts()["tenants"] == report.counts()["providers"] == {"created": 0, "updated": 0, "unchanged": 1}
    assert snapshot() == before
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].split()[0].upper() in {"INSERT", "UPDATE"}]
    assert writes == []
    assert AuditEvent.objects.filter(action="registry.loaded").count() == 1


def test_key_order_and_number_spelling_are_not_changes(loaded, actor):
    data = example()
    data["providers"][0]["connect_timeout_s"] = 2.0  # the file said 2
    refund = tool_of(data, "refund.create")
    refund["budgets"] = dict(reversed(list(refund["budgets"].items())))
    refund["breaker"]["failure_rate"] = 0.50

    assert not load_registry(data, actor=actor).changed


def test_an_update_changes_only_what_changed_and_records_one_event(loaded, actor):
    before = {t.name: t.updated_at for t in Tool.objects.all()}
    data = example()
    tool_of(data, "refund.create")["budgets"]["max_attempts"] = 5
    tool_of(data, "refund.create")["description"] = "Refund an order, in cents."

    report = load_registry(data, actor=actor)

    assert report.tools.updated == {"refund.create": ("description", "budgets")}
    assert set(report.tools.unchanged) == set(before) - {"refund.create"}
    assert report.tenants.unchanged == ("demo",) and report.providers.unchanged == ("sandbox",)
    refund = Tool.objects.get(name="refund.create")
    assert refund.budgets == {"max_attempts": 5, "write_retry": 1, "unknown_budget": 1, "max_business_effects": 1}
    assert refund.updated_at > before["refund.create"]
    assert {t.name: t.updated_at for t in Tool.objects.exclude(name="refund.create")} == {
        name: at for name, at in before.items() if name != "refund.create"
    }
    events = AuditEvent.objects.filter(action="registry.loaded").order_by("seq")
    assert events.count() == 2
    assert events.last().evidence["updated"] == {"tools": {"refund.create": ["description", "budgets"]}}
    assert events.last().evidence["counts"]["tools"]["updated"] == 1


def test_a_setting_removed_from_the_file_returns_to_its_default(loaded, actor):
    data = example()
    for key in ("fallback", "breaker", "exhausted_to_review", "outcome_timeout_s"):
        del tool_of(data, "refund.create")[key]
    del data["providers"][0]["status_breaker"]

    report = load_registry(data, actor=actor)

    assert set(report.tools.updated["refund.create"]) == {"fallback", "breaker", "exhausted_to_review"}
    refund = Tool.objects.get(name="refund.create")
    assert (refund.fallback, refund.breaker, refund.exhausted_to_review) == ("", {}, False)
    assert refund.outcome_timeout_s == 30  # refund.create said 30 too: unchanged value, but no longer from the file
    assert Provider.objects.get(name="sandbox").status_breaker == {}
    assert not load_registry(data, actor=actor).changed


def test_a_reload_never_turns_a_tools_retry_path_back_on(loaded, actor):
    Tool.objects.filter(name="refund.create").update(retry_path="unsafe")  # a duplicate probe saw two effects
    data = example()
    tool_of(data, "refund.create")["budgets"]["max_attempts"] = 4

    load_registry(data, actor=actor)

    assert Tool.objects.get(name="refund.create").retry_path == "unsafe"


def test_a_new_provider_base_url_voids_its_tools_probes_and_nothing_else(loaded, actor):
    Tool.objects.filter(name="refund.create").update(retry_path="safe", retry_path_key_age_s=60)
    Tool.objects.filter(name="order.create").update(retry_path="unsafe")
    data = example()
    load_registry(data, actor=actor)  # the same file: nothing changes
    assert Tool.objects.get(name="refund.create").retry_path == "safe"

    data["providers"][0]["base_url"] = "http://127.0.0.1:9999"
    load_registry(data, actor=actor)

    refund, order = Tool.objects.get(name="refund.create"), Tool.objects.get(name="order.create")
    assert (refund.retry_path, refund.retry_path_key_age_s) == ("unprobed", None)
    assert order.retry_path == "unprobed"
    assert "base URL changed from http://127.0.0.1:8001 to http://127.0.0.1:9999" in refund.retry_path_reason


def test_tenant_tool_lists_and_alternates_follow_the_file(loaded, actor):
    data = example()
    data["tenants"].append({"name": "acme", "tools": ["order.lookup", "refund.create"]})
    tool_of(data, "order.lookup")["alternates"] = []
    report = load_registry(data, actor=actor)

    assert report.tenants.created == ("acme",)
    assert report.tools.updated == {"order.lookup": ("alternates",)}
    acme = Tenant.objects.get(name="acme")
    assert (acme.sandbox, acme.all_tools) == (False, False)
    assert sorted(acme.tools.values_list("name", flat=True)) == ["order.lookup", "refund.create"]
    assert not Tool.objects.get(name="order.lookup").alternates.exists()

    data["tenants"][1]["tools"] = "*"
    report = load_registry(data, actor=actor)
    assert report.tenants.updated == {"acme": ("all_tools", "tools")}
    acme.refresh_from_db()
    assert acme.all_tools and not acme.tools.exists()


def test_a_file_may_refer_to_rows_already_in_the_database(loaded, actor):
    data = {"tools": [minimal_tool(alternates=[]), minimal_tool(name="note.read_cache", alternates=["note.read"])]}
    data["tenants"] = [{"name": "notes", "tools": ["note.read", "order.lookup"]}]

    report = load_registry(data, actor=actor)

    assert report.tools.created == ("note.read", "note.read_cache")
    assert Tool.objects.get(name="note.read").provider.name == "sandbox"


def test_an_invalid_file_is_rejected_whole_naming_every_bad_field(loaded, actor):
    data = example()
    refund, lookup, shipment = index(data, "refund.create"), index(data, "order.lookup"), index(data, "shipment.create")
    data["tenants"][0]["tools"] = ["refund.create", "refund.createe"]
    data["providers"][0]["base_url"] = "ftp://127.0.0.1:8001"
    data["providers"][0]["read_timeout_s"] = 0
    data["tools"][refund]["budgets"]["max_attempts"] = 0
    data["tools"][refund]["backoff"] = {"base_ms": 5000, "cap_ms": 1000}
    data["tools"][refund]["description"] = "a valid change that must not be written either"
    data["tools"][lookup]["breaker"]["bucket_s"] = 7
    data["tools"][lookup]["args_schema"]["properties"]["order_id"]["type"] = "strin"
    data["tools"][shipment]["status_query"]["status_map"]["booked"] = "done"
    data["tools"][shipment]["side_effect"] = "wirte"
    data["tools"].append(minimal_tool(name="Note.Read", provider="nowhere"))
    before = snapshot()

    errors = validate_registry(data)

    new = len(data["tools"]) - 1
    assert sorted(paths(errors)) == sorted(
        [
            "$.tenants[0].tools[1]",
            "$.providers[0].base_url",
            "$.providers[0].read_timeout_s",
            f"$.tools[{refund}].budgets.max_attempts",
            f"$.tools[{refund}].backoff.cap_ms",
            f"$.tools[{lookup}].breaker.bucket_s",
            f"$.tools[{lookup}].args_schema.properties.order_id.type",
            f"$.tools[{shipment}].status_query.status_map.booked",
            f"$.tools[{shipment}].side_effect",
            f"$.tools[{new}].name",
            f"$.tools[{new}].provider",
        ]
    )
    messages = {error.path: error.message for error in errors}
    assert "no tool 'refund.createe'" in messages["$.tenants[0].tools[1]"]
    assert "at least 1" in messages[f"$.tools[{refund}].budgets.max_attempts"]
    assert "cap_ms (1000) must be at least base_ms (5000)" in messages[f"$.tools[{refund}].backoff.cap_ms"]
    assert "no provider 'nowhere'" in messages[f"$.tools[{new}].provider"]
    with pytest.raises(RegistryInvalid) as raised:
        load_registry(data, actor=actor)
    assert list(raised.value.errors) == errors
    assert snapshot() == before


def test_unknown_keys_are_reported_by_name(db):
    data = example()
    data["version"] = 2
    data["providers"][0]["timeout_s"] = 3
    refund = index(data, "refund.create")
    data["tools"][refund]["retries"] = 2
    data["tools"][refund]["budgets"]["max_attempt"] = 3
    data["tools"][refund]["invariants"][0]["equal_arg"] = "amount_cents"

    errors = {error.path: error.message for error in validate_registry(data)}

    assert "unknown key 'version'" in errors["$.version"]
    assert "unknown key 'timeout_s'" in errors["$.providers[0].timeout_s"]
    assert "unknown key 'retries'" in errors[f"$.tools[{refund}].retries"]
    assert "did you mean 'max_attempts'?" in errors[f"$.tools[{refund}].budgets.max_attempt"]
    assert "did you mean 'equals_arg'?" in errors[f"$.tools[{refund}].invariants[0].equal_arg"]


def test_secrets_in_the_file_are_refused_without_repeating_them(db):
    data = example()
    provider = data["providers"][0]
    provider["auth"]["token"] = "sk_live_abc123"
    provider["api_key"] = "sk_live_def456"
    provider["callback_secret_env"] = "whsec_1234567890"
    provider["base_url"] = "https://user:hunter2@payments.example.com"
    refund = index(data, "refund.create")
    data["tools"][refund]["request"]["body"]["api_key"] = "sk_live_ghi789"
    data["tools"][refund]["request"]["path"] = "/refunds?access_token=sk_live_jkl"

    errors = validate_registry(data)

    assert sorted(paths(errors)) == sorted(
        [
            "$.providers[0].base_url",
            "$.providers[0].auth.token",
            "$.providers[0].callback_secret_env",
            "$.providers[0].api_key",
            f"$.tools[{refund}].request.path",
            f"$.tools[{refund}].request.body.api_key",
        ]
    )
    assert "environment variable" in errors[1].message
    text = "\n".join(str(error) for error in errors)
    for secret in ("sk_live", "whsec", "hunter2"):
        assert secret not in text


def test_outbound_auth_names_an_environment_variable(db):
    def auth_errors(auth: dict) -> dict[str, str]:
        data = {"providers": [{"name": "p", "base_url": "https://p.example.com", "auth": auth}]}
        return {e.path.removeprefix("$.providers[0].auth"): e.message for e in validate_registry(data)}

    assert auth_errors({"kind": "none"}) == {}
    assert auth_errors({"kind": "header", "header": "X-Api-Key", "secret_env": "P_KEY"}) == {}
    assert set(auth_errors({"kind": "bearer"})) == {".secret_env"}
    assert set(auth_errors({"kind": "header", "secret_env": "P_KEY"})) == {".header"}
    assert set(auth_errors({"kind": "basic", "secret_env": "P_KEY", "header": "X-Key"})) == {".header"}
    assert set(auth_errors({"kind": "none", "secret_env": "P_KEY"})) == {".secret_env"}
    assert set(auth_errors({"kind": "oauth"})) == {".kind"}


def test_a_write_tool_needs_a_status_query(db):
    data = example()
    refund = index(data, "refund.create")
    del data["tools"][refund]["status_query"]

    [error] = validate_registry(data)

    assert error.path == f"$.tools[{refund}].status_query"
    assert "required for a write tool" in error.message


def test_reconciliation_settings_belong_to_write_tools(db):
    data = example()
    lookup = tool_of(data, "order.lookup")
    lookup["reconcile"] = {"first_check_s": 5}
    lookup["budgets"]["unknown_budget"] = 1
    i = index(data, "order.lookup")

    assert paths(validate_registry(data)) == [f"$.tools[{i}].reconcile", f"$.tools[{i}].budgets.unknown_budget"]


def test_templates_use_only_the_tools_arguments(db):
    data = example()
    refund = index(data, "refund.create")
    data["tools"][refund]["request"]["path"] = "/orders/{order}/refunds"
    data["tools"][refund]["status_query"]["path"] = "/refunds/{order_id}"
    data["tools"][refund]["invariants"][1]["equals_arg"] = "order"
    pay = index(data, "payment.capture")
    data["tools"][pay]["compensation"]["args"] = {"order_id": "{order_id}", "amount": "{result.amount_cents}"}

    errors: dict[str, str] = {}
    for error in validate_registry(data):
        errors[error.path] = errors.get(error.path, "") + error.message + "\n"

    assert "{order} is not an argument" in errors[f"$.tools[{refund}].request.path"]
    status_path = errors[f"$.tools[{refund}].status_query.path"]
    assert "must contain {idempotency_key} or {provider_ref}" in status_path
    assert "{order_id} is not available to a status query" in status_path
    assert "'order' is not an argument" in errors[f"$.tools[{refund}].invariants[1].equals_arg"]
    assert "requires the argument 'amount_cents'" in errors[f"$.tools[{pay}].compensation.args"]
    assert "takes no argument 'amount'" in errors[f"$.tools[{pay}].compensation.args.amount"]


def test_a_key_template_names_the_tools_arguments_and_at_least_one(db):
    data = example()
    refund, lookup = index(data, "refund.create"), index(data, "order.lookup")
    data["tools"][refund]["key_template"] = "refund-{order}"
    data["tools"][lookup]["key_template"] = "lookup"

    errors = {error.path: error.message for error in validate_registry(data)}

    assert "{order} is not an argument of this tool" in errors[f"$.tools[{refund}].key_template"]
    assert "names no argument" in errors[f"$.tools[{lookup}].key_template"]
    assert len(errors) == 2

    data["tools"][refund]["key_template"] = "refund-{order_id}"
    del data["tools"][lookup]["key_template"]
    assert validate_registry(data) == []
    load_registry(data, actor=Actor.system("tests"))
    assert Tool.objects.get(name="refund.create").key_template == "refund-{order_id}"


def test_alternates_must_be_other_tools_with_the_same_side_effect(db):
    data = example()
    lookup = index(data, "order.lookup")
    data["tools"][lookup]["alternates"] = ["order.lookup", "order.create", "order.find"]

    errors = {error.path: error.message for error in validate_registry(data)}

    assert errors == {
        f"$.tools[{lookup}].alternates[0]": "a tool is not its own alternate",
        f"$.tools[{lookup}].alternates[1]": "'order.create' is a write tool: an alternate has the same side effect",
        f"$.tools[{lookup}].alternates[2]": "no tool 'order.find' in this file or the database",
    }


def test_a_name_defined_twice_is_an_error(db):
    data = example()
    data["tools"].append(copy.deepcopy(data["tools"][0]))

    [error] = validate_registry(data)

    assert error.path == f"$.tools[{len(data['tools']) - 1}].name"
    assert "already defined at $.tools[0]" in error.message


def test_validating_a_complete_file_reads_nothing_from_the_database(db, django_assert_num_queries):
    with django_assert_num_queries(0):
        assert validate_registry(example()) == []


def test_a_registry_that_is_not_an_object_is_one_error(db):
    assert paths(validate_registry([])) == ["$"]
    assert paths(validate_registry({"tools": {}})) == ["$.tools"]


# --- the engine's view ------------------------------------------------------------------------------------------------


def test_tool_policy_returns_the_values_from_the_file(loaded, django_assert_num_queries):
    tools = {tool.name: tool for tool in policy_tools()}
    with django_assert_num_queries(0):  # provider and alternates came with policy_tools()
        refund = tool_policy(tools["refund.create"])
        lookup = tool_policy(tools["order.lookup"])

    assert refund.is_write and refund.risk == "high" and refund.replay_safe
    assert refund.budgets == Budgets(max_attempts=3, write_retry=1, unknown_budget=1, max_business_effects=1)
    assert refund.backoff == BackoffPolicy(base_ms=500, cap_ms=8000, jitter="proportional")
    assert refund.breaker == BreakerPolicy(
        window_s=60, bucket_s=10, min_calls=10, failure_rate=0.5, cooldown_s=30, half_open_probes=1, probe_lease_s=60
    )
    assert refund.invariants == (
        Invariant(result="amount_cents", equals_arg="amount_cents"),
        Invariant(result="order_id", equals_arg="order_id"),
    )
    assert refund.idempotency_conflict_codes == frozenset({"idempotency_key_reused"})
    assert refund.approvable_codes == frozenset({"needs_approval"})
    assert (refund.provider_ref_field, refund.reconcile.first_check_s) == (
        "refund_id",
        0,
    )  # the shipped refund.create checks at once
    assert (refund.exhausted_to_review, refund.fallback, refund.key_retention_s) == (True, "read_only_summary", 86400)
    assert refund.args_schema["required"] == ["amount_cents", "order_id"]

    assert lookup.alternates == frozenset({"order.lookup_replica"})
    assert (lookup.result_time_field, lookup.max_result_age_s) == ("as_of", 300)
    assert lookup.required_result_fields == ("order_id", "status")
    assert lookup.invariants[1] == Invariant(
        result="status", one_of=("open", "paid", "shipped", "cancelled", "refunded")
    )
    assert lookup.budgets == Budgets(max_attempts=3)
    assert lookup.outcome_timeout_s == 10


def test_tool_policy_takes_the_engines_defaults_for_absent_settings(loaded, actor, django_assert_num_queries):
    load_registry({"tools": [minimal_tool()]}, actor=actor)
    tool = Tool.objects.get(name="note.read")

    with django_assert_num_queries(2):  # without policy_tools(): the provider, then the alternates
        policy = tool_policy(tool)

    assert (policy.budgets, policy.backoff, policy.breaker) == (Budgets(), BackoffPolicy(), BreakerPolicy())
    assert (policy.invariants, policy.alternates, policy.reconcile.first_check_s) == ((), frozenset(), 5)
    assert (policy.risk, policy.replay_safe, policy.exhausted_to_review) == ("low", False, False)
    assert policy.idempotency_conflict_codes == frozenset({"idempotency_key_reused"})


def test_with_alternates_reads_them_once_for_the_instance_or_not_at_all_when_there_are_none(
    loaded, django_assert_num_queries
):
    lookup = Tool.objects.select_related("provider").get(name="order.lookup")
    with django_assert_num_queries(1):
        with_alternates(lookup)
    with django_assert_num_queries(0):  # every policy of this instance: no more reads
        assert tool_policy(lookup).alternates == tool_policy(lookup).alternates == frozenset({"order.lookup_replica"})

    refund = Tool.objects.select_related("provider").get(name="refund.create")
    with django_assert_num_queries(0):  # the caller's own read said it has none
        assert tool_policy(with_alternates(refund, none=True)).alternates == frozenset()

    listed = policy_tools().get(name="order.lookup")  # prefetched with the tool: read from there
    with django_assert_num_queries(0):
        assert tool_policy(listed).alternates == frozenset({"order.lookup_replica"})


# --- manage.py load_tools -------------------------------------------------------------------------------------------


def test_load_tools_prints_a_summary_and_is_idempotent(db):
    out = StringIO()
    call_command("load_tools", str(EXAMPLE), stdout=out)
    assert "loaded" in out.getvalue()
    assert f"tools:     {len(EXAMPLE_DATA['tools'])} created, 0 updated, 0 unchanged" in out.getvalue()

    out = StringIO()
    call_command("load_tools", str(EXAMPLE), stdout=out)
    assert "nothing changed" in out.getvalue()
    assert "tenants:   0 created, 0 updated, 1 unchanged" in out.getvalue()
    event = AuditEvent.objects.get(action="registry.loaded")
    assert event.actor_label == "system:load_tools"
    assert event.evidence["source"] == str(EXAMPLE)


def test_load_tools_prints_every_error_and_writes_nothing(db, tmp_path):
    data = example()
    data["tools"][0]["budgets"]["max_attempts"] = 0
    data["providers"][0]["auth"]["password"] = "hunter2"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    err = StringIO()

    with pytest.raises(CommandError, match="2 error"):
        call_command("load_tools", str(bad), stderr=err)

    assert "$.tools[0].budgets.max_attempts: must be an integer of at least 1" in err.getvalue()
    assert "$.providers[0].auth.password: secrets never go in the registry file" in err.getvalue()
    assert "hunter2" not in err.getvalue()
    assert (Tenant.objects.count(), Provider.objects.count(), Tool.objects.count()) == (0, 0, 0)
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{tools: []}", "is not JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ('{"tools": [], "tools": []}', "the key 'tools' appears twice"),
        ('{"providers": [{"name": "p", "connect_timeout_s": NaN}]}', "NaN is not a JSON number"),
    ],
)
def test_load_tools_refuses_a_file_that_is_not_json(db, tmp_path, content, message):
    path = tmp_path / "registry.json"
    path.write_text(content)
    with pytest.raises(CommandError, match=message):
        call_command("load_tools", str(path))
    assert not Tool.objects.exists()


def test_load_tools_check_validates_without_writing(db):
    out = StringIO()
    call_command("load_tools", str(EXAMPLE), "--check", stdout=out)
    assert "valid" in out.getvalue()
    assert not Tool.objects.exists()


# --- the Django admin -----------------------------------------------------------------------------------------------


@pytest.fixture
def admin_client(client, db):
    user_save_with_roles(username="root", roles=["admin"], password=PASSWORD, actor=Actor.system("tests"))
    assert client.login(username="root", password=PASSWORD)
    return client


def _change_url(obj) -> str:
    return reverse(f"admin:recovery_{obj._meta.model_name}_change", args=[obj.pk])


def _form_data(client, obj) -> dict:
    """The change form as the browser would post it back, unchanged (with the hidden initial-* inputs)."""
    form = client.get(_change_url(obj)).context["adminform"].form
    data = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if isinstance(value, bool):
            if value:
                data[name] = "on"
        else:
            data[name] = "" if value is None else value
        if field.show_hidden_initial:  # JSON fields with a callable default
            data[f"initial-{name}"] = data.get(name, "")
    return data


def test_the_admin_rejects_an_invalid_tool_edit_with_a_field_error(admin_client, loaded):
    refund = Tool.objects.get(name="refund.create")
    before = snapshot()
    data = _form_data(admin_client, refund)
    data["budgets"] = json.dumps({"max_attempts": 0, "write_retry": 1})
    data["backoff"] = json.dumps({"base_ms": 500, "cap_ms": 100})
    data["status_query"] = "{}"

    response = admin_client.post(_change_url(refund), data)

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["budgets"] == ["max_attempts: must be an integer of at least 1 (got 0)"]
    assert errors["backoff"] == ["cap_ms: cap_ms (100) must be at least base_ms (500)"]
    assert "required for a write tool" in errors["status_query"][0]
    assert snapshot() == before


def test_the_admin_refuses_a_secret_in_a_provider(admin_client, loaded):
    sandbox = Provider.objects.get(name="sandbox")
    data = _form_data(admin_client, sandbox)
    data["auth"] = json.dumps({"kind": "bearer", "secret_env": "SANDBOX_API_KEY", "token": "sk_live_x"})

    response = admin_client.post(_change_url(sandbox), data)

    assert response.status_code == 200
    assert "token: secrets never go in the registry file" in response.context["adminform"].form.errors["auth"][0]
    assert Provider.objects.get(name="sandbox").auth == {"kind": "bearer", "secret_env": "SANDBOX_API_KEY"}


def test_the_admin_accepts_a_valid_tool_edit_and_records_it(admin_client, loaded, actor):
    refund = Tool.objects.get(name="refund.create")
    data = _form_data(admin_client, refund)
    data["budgets"] = json.dumps({"max_attempts": 4, "write_retry": 1, "unknown_budget": 1})
    data["fallback"] = ""

    response = admin_client.post(_change_url(refund), data)

    assert response.status_code == 302, response.context["adminform"].form.errors
    refund.refresh_from_db()
    assert refund.budgets == {"max_attempts": 4, "write_retry": 1, "unknown_budget": 1}
    assert refund.fallback == ""
    event = AuditEvent.objects.get(action="registry.edited")
    assert event.actor_label == "user:root"
    assert event.evidence == {
        "kind": "tool",
        "name": "refund.create",
        "op": "changed",
        "fields": ["budgets", "fallback"],
    }
    # What the admin stored is what a file would load: the tool policy reads it as usual.
    assert tool_policy(refund).budgets == Budgets(max_attempts=4, write_retry=1, unknown_budget=1)


def test_the_admin_keeps_a_tenant_to_one_way_of_listing_tools(admin_client, loaded):
    demo = Tenant.objects.get(name="demo")
    data = _form_data(admin_client, demo)
    data["tools"] = [Tool.objects.get(name="order.lookup").pk]

    response = admin_client.post(_change_url(demo), data)

    assert response.status_code == 200
    assert "'All tools' is ticked" in response.context["adminform"].form.errors["tools"][0]
    del data["all_tools"]
    assert admin_client.post(_change_url(demo), data).status_code == 302
    demo.refresh_from_db()
    assert not demo.all_tools and list(demo.tools.values_list("name", flat=True)) == ["order.lookup"]


def test_the_docs_registry_example_is_a_valid_registry(db):
    guide = (Path(__file__).resolve().parent.parent / "docs" / "registry.md").read_text()
    section = guide.split("## An example file", 1)[1].split("\n## ", 1)[0]
    block = section.split("```json\n", 1)[1].split("```", 1)[0]

    assert validate_registry(json.loads(block)) == []

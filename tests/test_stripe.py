"""A real provider's wire format, end to end (docs/providers.md): the official `stripe` library, handed a recovered
tool's session, against localstripe — a stateful fake of Stripe's HTTP API nobody here wrote (PyPI, pinned in
requirements-localstripe.txt, its own virtualenv: `make localstripe`) — through the console served by `live_server`
with the shipped Stripe registry (recovery/fixtures/stripe.registry.json), a TCP proxy in front of the fake.

Without localstripe the tests skip with the reason (REQUIRE_SERVICES=1 makes it a failure).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests
from recovery_client import RecoveryClient, recovered

from recovery.audit.chain import Actor
from recovery.models import Attempt, Call, Tool
from recovery.registry import load_registry
from recovery.services.probes import probe_call
from recovery.services.reconcile import reconcile_call
from recovery.services.tokens import token_create
from tests.conftest import missing_service
from tests.servers import ROOT, TcpProxy, free_port

try:
    import stripe
except ImportError:  # the fixture says so
    stripe = None  # type: ignore[assignment]

pytestmark = pytest.mark.django_db(transaction=True)

LOCALSTRIPE = ROOT / ".venv-localstripe" / "bin" / "localstripe"
REGISTRY = ROOT / "recovery" / "fixtures" / "stripe.registry.json"
API_KEY = "sk_test_recovery"
VISIBLE_AFTER_S = 1


@pytest.fixture(scope="module")
def localstripe():
    """localstripe on a free port, from scratch; its URL."""
    if stripe is None:
        missing_service("needs the stripe library: pip install -r requirements-dev.txt")
    if not LOCALSTRIPE.exists():
        missing_service(f"needs localstripe in {LOCALSTRIPE.parent.parent.name}: make localstripe")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="localstripe-") as workdir:
        log = (Path(workdir) / "localstripe.log").open("w")
        process = subprocess.Popen(
            [str(LOCALSTRIPE), "--port", str(port), "--from-scratch"], cwd=workdir, stdout=log, stderr=log
        )
        try:
            if not _ready(url, process):
                log.flush()
                missing_service(f"localstripe did not start: {(Path(workdir) / 'localstripe.log').read_text()[-500:]}")
            yield url
        finally:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            if process.poll() is None:
                process.kill()
            log.close()


def _ready(url: str, process: subprocess.Popen, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/v1/customers", auth=(API_KEY, ""), timeout=1).status_code == 200:
                return True
        time.sleep(0.1)
    return False


@pytest.fixture
def proxy(localstripe):
    host, port = localstripe.removeprefix("http://").split(":")
    with TcpProxy(host, int(port)) as proxy:
        yield proxy


@pytest.fixture
def console(live_server, proxy, monkeypatch):
    """The shipped Stripe registry pointed at the proxy, and a client of the console for its tenant."""
    monkeypatch.setenv("STRIPE_SECRET_KEY", API_KEY)
    registry = json.loads(REGISTRY.read_text())
    registry["providers"][0]["base_url"] = f"http://127.0.0.1:{proxy.port}"
    # Stripe lists a new refund at once; its Search may take a minute: the window is short here to keep CI fast.
    registry["tools"][0]["status_query"]["visible_after_s"] = VISIBLE_AFTER_S
    load_registry(registry, actor=Actor.system("tests"))
    _, token = token_create(name="stripe-tests", tenants=["payments"], actor=Actor.system("tests"))
    client = RecoveryClient(live_server.url, token)
    yield client
    client.session.close()


@pytest.fixture
def sent_keys(monkeypatch, proxy) -> list[str | None]:
    """The Idempotency-Key of every request to Stripe through the proxy, as the transport was handed it (after the
    recovered session put the key in), whether or not it connected."""
    keys: list[str | None] = []
    send = requests.adapters.HTTPAdapter.send

    def recording(self, request, *args, **kwargs):
        if request.url.startswith(f"http://127.0.0.1:{proxy.port}/"):
            keys.append(request.headers.get("Idempotency-Key"))
        return send(self, request, *args, **kwargs)

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", recording)
    return keys


def stripe_through(base_url: str, session: requests.Session | None = None):
    """The official client; with a recovered tool's session, its requests go through the console's runtime (and
    only the console retries: max_network_retries=0)."""
    http_client = stripe.RequestsClient(session=session) if session is not None else None
    return stripe.StripeClient(
        API_KEY, base_addresses={"api": base_url}, http_client=http_client, max_network_retries=0
    )


def payment(localstripe: str, payment_method: str = "pm_card_visa", amount: int = 5000) -> str:
    """A succeeded PaymentIntent made directly on localstripe (not a call of the console)."""
    intent = stripe_through(localstripe).v1.payment_intents.create(
        params={"amount": amount, "currency": "eur", "payment_method": payment_method, "confirm": True}
    )
    assert intent.status == "succeeded"
    return intent.id


def refund_tool(base_url: str, before=lambda: None):
    @recovered.tool("stripe.refund.create", key="refund-{order_id}")
    def refund(payment_intent: str, amount: int, order_id: str) -> dict:
        """Refund part of a payment."""
        before()
        client = stripe_through(base_url, recovered.http())
        params = {"payment_intent": payment_intent, "amount": amount, "metadata": {"order_id": order_id}}
        return client.v1.refunds.create(params=params).to_dict()

    return refund


def refunds_of(localstripe: str, intent: str) -> list:
    return list(stripe_through(localstripe).v1.refunds.list(params={"payment_intent": intent}).data)


def test_a_refund_through_the_stripe_library_commits_once(localstripe, proxy, console, sent_keys):
    intent = payment(localstripe)
    refund = refund_tool(f"http://127.0.0.1:{proxy.port}")

    with recovered.task(console, tenant="payments", external_id="order-8848", goal="refund order 8848"):
        answer = refund(intent, 1250, "O-8848")

    assert (answer["status"], answer["message"]) == ("committed", "The refund took effect.")
    assert answer["result"]["object"] == "refund" and answer["result"]["amount"] == 1250
    call = Call.objects.get(idempotency_key="order-8848:refund-O-8848")
    attempt = Attempt.objects.get(call=call)
    assert (call.state, attempt.http_status) == ("COMMITTED", 200)
    assert sent_keys == [call.idempotency_key]  # the call's key replaced the one the library made up
    made = refunds_of(localstripe, intent)
    assert [(r.id, r.amount, r.metadata["order_id"]) for r in made] == [(answer["result"]["id"], 1250, "O-8848")]


def test_a_card_error_is_read_from_stripes_error_shape_and_classified_as_a_refusal(localstripe, proxy, console):
    base_url = f"http://127.0.0.1:{proxy.port}"

    @recovered.tool("stripe.payment_intent.create", key="pay-{order_id}")
    def pay(amount: int, currency: str, payment_method: str, order_id: str) -> dict:
        """Charge a saved card."""
        params = {
            "amount": amount,
            "currency": currency,
            "payment_method": payment_method,
            "confirm": True,
            "metadata": {"order_id": order_id},
        }
        return stripe_through(base_url, recovered.http()).v1.payment_intents.create(params=params).to_dict()

    with recovered.task(console, tenant="payments", external_id="order-9001", goal="charge order 9001"):
        answer = pay(2000, "eur", "pm_card_chargeCustomerFail", "O-9001")

    assert (answer["status"], answer["next"]) == ("failed", "stop")
    assert "Your card was declined" not in json.dumps(answer)  # the console's words, never Stripe's own text
    call = Call.objects.get(idempotency_key="order-9001:pay-O-9001")
    attempt = Attempt.objects.get(call=call)
    assert (attempt.http_status, attempt.error_code) == (402, "card_declined")  # error.code: no decline_code here
    assert (attempt.failure["row"], call.state) == ("refusal", "FAILED_PERMANENT")


def test_a_refund_refused_at_the_connection_is_retried_once_with_the_same_key(localstripe, proxy, console, sent_keys):
    intent = payment(localstripe)
    tries = []

    def first_refused() -> None:
        tries.append(1)
        if len(tries) == 1:
            proxy.refuse()  # nothing listens: the request provably never reached Stripe
        else:
            proxy.listen()

    refund = refund_tool(f"http://127.0.0.1:{proxy.port}", before=first_refused)
    with recovered.task(console, tenant="payments", external_id="order-7002", goal="refund order 7002"):
        answer = refund(intent, 700, "O-7002")

    assert answer["status"] == "committed"
    call = Call.objects.get(idempotency_key="order-7002:refund-O-7002")
    attempts = list(Attempt.objects.filter(call=call).order_by("number"))
    assert [(a.error_kind, a.sent, a.http_status) for a in attempts] == [
        ("connection_refused", False, None),
        ("", True, 200),
    ]
    assert sent_keys == [call.idempotency_key, call.idempotency_key]  # one key, two attempts
    assert len(refunds_of(localstripe, intent)) == 1


# --- finding a lost outcome by listing the charge's refunds (docs/providers.md) ------------------------------------


def refund_key(external_id: str, order_id: str) -> str:
    return f"{external_id}:refund-{order_id}"


def lost(console, refund, external_id: str, *args) -> tuple[dict, Call]:
    """The refund called once in its task, the runtime not waiting for reconciliation; its answer and call."""
    with recovered.task(console, tenant="payments", external_id=external_id, goal=external_id, patience_s=0):
        answer = refund(*args)
    return answer, Call.objects.get(idempotency_key=refund_key(external_id, args[2]))


def test_a_refund_whose_reply_is_lost_is_settled_committed_by_the_listing_with_stripes_refund_id(
    localstripe, proxy, console, sent_keys
):
    intent = payment(localstripe)
    refund = refund_tool(f"http://127.0.0.1:{proxy.port}")
    proxy.drop_replies(1)  # localstripe makes the refund; its reply never reaches the tool

    answer, call = lost(console, refund, "order-7101", intent, 900, "O-7101")

    assert answer["status"] != "committed" and call.state == "UNKNOWN"
    made = refunds_of(localstripe, intent)
    assert [r.metadata["recovery_key"] for r in made] == [call.idempotency_key]  # the marker the wire asked for
    receipt = reconcile_call(call.pk, worker="tests")
    call.refresh_from_db()
    assert (receipt.observed, receipt.effects_observed, receipt.provider_ref) == ("committed", 1, made[0].id)
    assert receipt.response["matched"] == [made[0].id]
    assert receipt.request["url"].endswith(f"/v1/refunds?limit=100&payment_intent={intent}")  # the charge's refunds
    assert (call.state, call.provider_ref) == ("COMMITTED", made[0].id)
    assert [k for k in sent_keys if k] == [call.idempotency_key]  # settled by a listing (no key), not sent again


def test_a_refund_that_never_arrived_is_not_committed_only_after_the_window_and_is_retried_once(
    localstripe, proxy, console, sent_keys
):
    intent = payment(localstripe)
    refund = refund_tool(f"http://127.0.0.1:{proxy.port}")
    proxy.cut()  # the connection closes as it opens: whether the request arrived is unknown to the tool

    _, call = lost(console, refund, "order-7102", intent, 800, "O-7102")
    proxy.restore()

    assert call.state == "UNKNOWN" and refunds_of(localstripe, intent) == []
    early = reconcile_call(call.pk, worker="tests")
    assert (early.observed, early.provider_status) == ("pending", "not_listed_yet")  # Stripe may not list it yet
    assert Call.objects.get(pk=call.pk).state == "UNKNOWN"
    time.sleep(VISIBLE_AFTER_S + 0.2)
    late = reconcile_call(call.pk, worker="tests")
    assert (late.observed, late.provider_status, late.local_state_after) == ("not_committed", "not_listed", "RETRYABLE")

    with recovered.task(console, tenant="payments", external_id="order-7102", goal="order-7102", patience_s=0):
        again = refund(intent, 800, "O-7102")

    assert again["status"] == "committed"
    assert [k for k in sent_keys if k] == [call.idempotency_key] * 2  # one key, sent twice (listings carry none)
    assert [r.metadata["recovery_key"] for r in refunds_of(localstripe, intent)] == [call.idempotency_key]
    assert Call.objects.get(pk=call.pk).state == "COMMITTED"


def test_a_duplicate_probe_finds_two_refunds_listed_for_one_key_and_retries_are_refused_after(
    localstripe, proxy, console
):
    intent = payment(localstripe)
    refund = refund_tool(f"http://127.0.0.1:{proxy.port}")
    with recovered.task(console, tenant="payments", external_id="order-7103", goal="order-7103"):
        assert refund(intent, 500, "O-7103")["status"] == "committed"
    call = Call.objects.get(idempotency_key=refund_key("order-7103", "O-7103"))

    probe = probe_call(call, actor=Actor.system("tests"))

    # localstripe ignores Idempotency-Key: the replay made a second refund, and the listing shows both for the key.
    listed = [r for r in refunds_of(localstripe, intent) if r.metadata["recovery_key"] == call.idempotency_key]
    assert len(listed) == 2
    assert (probe.decision, probe.observed_effects, probe.downstream_audit) == ("retry_path_unsafe", 2, "second_effect")
    assert Tool.objects.get(name="stripe.refund.create").retry_path == "unsafe"

    # Afterwards a lost refund of that tool, found not committed, is never sent again by the runtime.
    proxy.cut()
    _, other = lost(console, refund, "order-7104", intent, 400, "O-7104")
    proxy.restore()
    time.sleep(VISIBLE_AFTER_S + 0.2)
    assert reconcile_call(other.pk, worker="tests").local_state_after == "RETRYABLE"
    with recovered.task(console, tenant="payments", external_id="order-7104", goal="order-7104", patience_s=0):
        refused = refund(intent, 400, "O-7104")
    assert refused["status"] != "committed"
    assert Attempt.objects.filter(call=other).count() == 1
    denial = Call.objects.get(pk=other.pk).gate_decisions.order_by("-pk").first()
    assert denial is not None and denial.reason == "retry_path_unsafe"
    markers = [r.metadata.to_dict().get("recovery_key") for r in refunds_of(localstripe, intent)]
    assert other.idempotency_key not in markers

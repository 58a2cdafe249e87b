"""Versions that say whether a client and a console can talk (docs/api.md#versions), both directions, for real: the
console served by `live_server`, the installed recovery_client over real sockets, and Debian's nginx in front.

- every answer under /api/ names the API version (Recovery-Api-Version), the OpenAPI document states it and
  declares the header on every answer of every operation;
- a recovery-console-client older than the oldest the console serves gets 426, naming both versions, and nothing
  is processed; any other User-Agent is served;
- the client raises IncompatibleConsole before reading an answer of an API it does not speak (another major, an
  older minor, none at all), and on a 426; a newer minor of its major is spoken. To answer as another console, the
  live server reads the versions from settings (recovery/api/versions.py);
- a gateway's own error page (nginx with no console behind it) is not the console's word on compatibility: the
  client resends as before and ends with the gateway's error, not IncompatibleConsole.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import recovery_client
import requests
from recovery_client import IncompatibleConsole, RecoveryClient, RecoveryError

from recovery.api.versions import API_VERSION, OLDEST_CLIENT, client_version
from recovery.audit.chain import Actor
from recovery.models import Task
from recovery.registry import load_registry
from recovery.services.tokens import token_create
from tests.conftest import missing_service
from tests.servers import Nginx, free_port

pytestmark = pytest.mark.django_db(transaction=True)

REGISTRY = {
    "tenants": [{"name": "acme", "tools": "*"}],
    "providers": [{"name": "shop", "base_url": "http://127.0.0.1:9"}],
    "tools": [
        {
            "name": "order.lookup",
            "provider": "shop",
            "side_effect": "read",
            "request": {"method": "GET", "path": "/orders"},
            "args_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        }
    ],
}
HEADER = "Recovery-Api-Version"


@pytest.fixture
def world(live_server):
    load_registry(REGISTRY, actor=Actor.system("tests"))
    _, token = token_create(name="runtime", tenants=["acme"], actor=Actor.system("tests"))
    return {"url": live_server.url, "token": token}


def _get(world, path: str, **headers) -> requests.Response:
    headers = {"Authorization": f"Bearer {world['token']}", **headers}
    return requests.get(f"{world['url']}/api/v1{path}", headers=headers, timeout=10)


def _post_task(world, external_id: str, **headers) -> requests.Response:
    body = {"tenant": "acme", "external_id": external_id, "agent": "a", "goal": "g"}
    headers = {"Authorization": f"Bearer {world['token']}", **headers}
    return requests.post(f"{world['url']}/api/v1/tasks", json=body, headers=headers, timeout=10)


# --- the console names its version ---------------------------------------------------------------------------------


def test_the_versions_are_what_the_client_speaks():
    # The shipped pair talks: the console's API is in the client's range, and the client is not older than the oldest.
    assert recovery_client.speaks(API_VERSION)
    assert client_version(recovery_client.USER_AGENT) == recovery_client.__version__
    as_numbers = [tuple(int(n) for n in v.split(".")) for v in (recovery_client.__version__, OLDEST_CLIENT)]
    assert as_numbers[0] >= as_numbers[1]


def test_every_api_answer_names_the_api_version(world):
    answers = {
        "created": _post_task(world, "named"),
        "found": _get(world, "/tasks?tenant=acme&external_id=named"),
        "not found": _get(world, "/tasks/999999"),
        "no such URL": _get(world, "/no/such/route"),
        "unauthenticated": _get(world, "/capabilities?tenant=acme", Authorization="Bearer wrong"),
        "invalid": _get(world, "/tasks?tenant=acme"),
        "the document": requests.get(f"{world['url']}/api/v1/openapi.json", timeout=10),
    }
    assert {name: (r.status_code, r.headers.get(HEADER)) for name, r in answers.items()} == {
        "created": (201, API_VERSION),
        "found": (200, API_VERSION),
        "not found": (404, API_VERSION),
        "no such URL": (404, API_VERSION),
        "unauthenticated": (401, API_VERSION),
        "invalid": (422, API_VERSION),
        "the document": (200, API_VERSION),
    }
    # Only the API's answers: the console's pages are not the API.
    assert HEADER not in requests.get(f"{world['url']}/sign-in/", timeout=10).headers


def test_the_document_states_the_version_and_declares_the_header_and_the_426_on_every_answer(world):
    document = requests.get(f"{world['url']}/api/v1/openapi.json", timeout=10).json()
    info = document["info"]
    stated = (info["version"], info["x-api-version"], info["x-oldest-client"])
    assert stated == (API_VERSION, API_VERSION, OLDEST_CLIENT)
    assert document["components"]["headers"][HEADER]["required"] is True
    answers = [
        (f"{method.upper()} {path} {status}", answer)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
        for status, answer in operation["responses"].items()
    ]
    assert len(answers) > 150
    undeclared = [name for name, answer in answers if answer.get("headers", {}).get(HEADER) is None]
    assert undeclared == []
    operations = [(path, method) for path, methods in document["paths"].items() for method in methods]
    refused = [
        (path, method)
        for path, method in operations
        if document["paths"][path][method]["responses"]["426"]["content"]["application/json"]["schema"]["$ref"]
        == "#/components/schemas/ErrorOut"
    ]
    assert refused == operations


# --- a client older than the oldest served: 426 --------------------------------------------------------------------


def test_a_client_older_than_the_oldest_served_gets_426_naming_both_versions_and_nothing_is_processed(world):
    old = _post_task(world, "too-old", **{"User-Agent": "recovery-console-client/0.0.9 python-requests/2.31.0"})

    assert old.status_code == 426, old.text
    assert old.headers[HEADER] == API_VERSION and len(old.headers["X-Request-Id"]) == 32
    error = old.json()["error"]
    assert error["code"] == "client_too_old"
    assert error["detail"] == {"client_version": "0.0.9", "oldest_client": OLDEST_CLIENT, "api_version": API_VERSION}
    assert "0.0.9" in error["message"] and OLDEST_CLIENT in error["message"]
    assert not Task.objects.filter(external_id="too-old").exists()
    # The oldest served itself, this client, and anything that is not this client are served.
    for agent in (f"recovery-console-client/{OLDEST_CLIENT}", recovery_client.USER_AGENT, "curl/8.5.0", ""):
        assert _post_task(world, f"served-{agent}", **{"User-Agent": agent}).status_code == 201, agent


def test_the_client_raises_incompatible_console_when_the_console_no_longer_serves_it(world, settings):
    settings.RECOVERY_OLDEST_CLIENT = "9.0.0"  # the live server answers as a console that dropped this client
    client = RecoveryClient(world["url"], world["token"])

    with pytest.raises(IncompatibleConsole) as refused:
        client.create_task("acme", "dropped", agent="a", goal="g")

    said = refused.value
    assert (said.client, said.console, said.oldest_client) == (recovery_client.__version__, API_VERSION, "9.0.0")
    assert said.url == world["url"]
    assert "9.0.0" in str(said) and recovery_client.__version__ in str(said)
    assert not Task.objects.filter(external_id="dropped").exists()


# --- a console of an API the client does not speak ----------------------------------------------------------------


@pytest.mark.parametrize("version", ["2.0", "0.9", "1", "one"])
def test_the_client_raises_before_reading_an_answer_of_an_api_it_does_not_speak(world, settings, version):
    settings.RECOVERY_API_VERSION = version
    client = RecoveryClient(world["url"], world["token"])

    # A 404 would be a RecoveryError once read: the version is checked first, so the answer is never read.
    with pytest.raises(IncompatibleConsole) as refused:
        client.get_task(999999)

    assert (refused.value.client, refused.value.console) == (recovery_client.__version__, version)
    assert f"answers API {version}" in str(refused.value)


def test_a_newer_minor_of_its_major_is_spoken(world, settings):
    settings.RECOVERY_API_VERSION = "1.7"
    client = RecoveryClient(world["url"], world["token"])

    assert client.create_task("acme", "newer-minor", agent="a", goal="g").status == "open"
    with pytest.raises(RecoveryError) as missing:  # its answers are read as usual
        client.get_task(999999)
    assert missing.value.status == 404


def test_a_server_that_names_no_version_is_not_a_console_it_talks_to(sandbox):
    # The sandbox provider answers JSON, as any web API does, without the header.
    client = RecoveryClient(sandbox.url, "no-token")

    with pytest.raises(IncompatibleConsole) as refused:
        client.create_task("acme", "not-a-console", agent="a", goal="g")

    assert (refused.value.client, refused.value.console) == (recovery_client.__version__, None)
    assert "names no Recovery-Api-Version" in str(refused.value)


# --- a gateway between them ---------------------------------------------------------------------------------------


@pytest.fixture
def nginx_binary():
    if not Path(Nginx.BINARY).exists():
        missing_service("needs Debian's nginx (apt-get install nginx): the front is tested for real")


def test_through_nginx_the_version_passes_and_nginxs_own_502_is_resent_not_taken_for_a_console(
    world, nginx_binary, tmp_path
):
    console = world["url"].removeprefix("http://")
    nothing = f"127.0.0.1:{free_port()}"  # no console behind it: nginx answers its own 502 page
    for upstream, name in ((console, "up"), (nothing, "down")):
        nginx = Nginx([upstream], static_root=tmp_path, workdir=tmp_path / name)
        with nginx:
            client = RecoveryClient(
                nginx.tls_url, world["token"], retry=recovery_client.ApiRetry(attempts=2, base_s=0.01)
            )
            client.session.verify = str(nginx.workdir / "cert.pem")  # the test's own certificate, not the
            client.session.trust_env = False  # environment's CA bundle (requests lets REQUESTS_CA_BUNDLE win)
            if name == "up":
                assert client.create_task("acme", "through-nginx", agent="a", goal="g").status == "open"
                continue
            with pytest.raises(RecoveryError) as failed:
                client.create_task("acme", "through-nginx-down", agent="a", goal="g")
            # nginx's own 502 is the JSON envelope (deploy/nginx.conf), marked as the gateway's, not the console's
            assert failed.value.status == 502 and failed.value.code == "bad_gateway"
        log = (nginx.workdir / "access.log").read_text().splitlines()
        sent = [line for line in log if "POST /api/v1/tasks" in line]
        assert len(sent) == (1 if name == "up" else 2)  # the gateway's 502 was resent, as a dropped exchange is

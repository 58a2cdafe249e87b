"""The client as the distribution agents install (clients/python, docs/recovered-tools.md#install), for real:

- the wheel and the sdist build (as `make dist` builds them) and hold the package, its type marker and its tests;
- the wheel installs into a fresh virtualenv holding only it and requests (and what requests pulls in): Django is not
  there, and the client's own tests (clients/python/tests, standard library only) pass from it against a live
  console and sandbox provider — none of them skipped;
- the development virtualenv holds the same code, installed (not the source tree on sys.path), and the two framework
  examples of docs/examples run from it against a live console, the sandbox and the background jobs, with no
  checkout on their path;
- `recovery.client` is still importable for this release, as a re-export of `recovery_client` that warns.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import recovery_client

from recovery.audit.chain import Actor
from recovery.devtools.drills.stage import background_jobs, drill_stage
from recovery.registry import load_registry
from recovery.services.tokens import token_create
from tests.conftest import missing_service
from tests.sandbox import sandbox_registry
from tests.servers import ROOT

CLIENT = ROOT / "clients" / "python"
SOURCE = CLIENT / "src" / "recovery_client"
# What may be in the fresh virtualenv: the client, and requests with what it pulls in.
DISTRIBUTIONS = {"recovery-console-client", "requests", "urllib3", "idna", "certifi", "charset-normalizer"}


def _pins(path: Path, names: set[str]) -> dict[str, str]:
    """name -> version of the requirements file's `name==version` lines for these names."""
    found = {}
    for line in path.read_text().splitlines():
        matched = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s#]+)\s*(#.*)?", line.strip())
        if matched and matched[1].lower().replace("_", "-") in names:
            found[matched[1].lower().replace("_", "-")] = matched[2]
    return found


def _run(command: list[str], **options) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, **options)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> Path:
    """The wheel and the sdist, built once per session the way `make dist` builds them."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(CLIENT)])
    return out


@pytest.fixture(scope="session")
def fresh(dist, tmp_path_factory) -> Path:
    """A virtualenv with nothing in it (not even pip) but the wheel and requests at the pinned versions."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    [wheel] = dist.glob("*.whl")
    pins = _pins(ROOT / "requirements.txt", DISTRIBUTIONS - {"recovery-console-client"})
    assert set(pins) == DISTRIBUTIONS - {"recovery-console-client"}, pins
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--disable-pip-version-check"]
        + [str(wheel)]
        + [f"{name}=={version}" for name, version in sorted(pins.items())]
    )
    return python


# --- the distribution -----------------------------------------------------------------------------------------------


def test_the_distribution_declares_its_name_python_one_dependency_and_a_pinned_backend():
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())
    assert project["project"]["name"] == "recovery-console-client"
    assert project["project"]["requires-python"] == ">=3.11"
    assert [re.split(r"[<>=!~ ]", d, maxsplit=1)[0] for d in project["project"]["dependencies"]] == ["requests"]
    # The backend the build declares is the one the development virtualenv holds (`make dist` builds without
    # isolation, with it): a bump of one without the other fails here.
    [backend] = project["build-system"]["requires"]
    assert backend == f"hatchling=={_pins(ROOT / 'requirements-dev.txt', {'hatchling'})['hatchling']}"


def test_the_wheel_and_the_sdist_hold_the_package_its_type_marker_and_its_tests(dist):
    [wheel], [sdist] = dist.glob("*.whl"), dist.glob("*.tar.gz")
    version = recovery_client.__version__
    assert wheel.name == f"recovery_console_client-{version}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    package = {name for name in names if not name.startswith("recovery_console_client-")}
    assert package == {f"recovery_client/{path.name}" for path in SOURCE.iterdir() if path.name != "__pycache__"}
    assert "recovery_client/py.typed" in package
    metadata = zipfile.ZipFile(wheel).read(f"recovery_console_client-{version}.dist-info/METADATA").decode()
    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")] == [
        "Requires-Dist: requests<3,>=2.31"
    ]
    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "src/recovery_client/py.typed", "tests/test_console.py"} <= members


def test_the_wheel_installs_into_an_empty_virtualenv_with_requests_as_its_only_dependency(fresh):
    listed = _run([str(fresh), "-c", "import importlib.metadata as m; print(*(d.name for d in m.distributions()))"])
    assert {name.lower() for name in listed.stdout.split()} == DISTRIBUTIONS
    django = subprocess.run([str(fresh), "-c", "import django"], capture_output=True, text=True, timeout=60)
    assert django.returncode != 0 and "No module named 'django'" in django.stderr
    where = _run([str(fresh), "-I", "-c", "import recovery_client; print(recovery_client.__file__)"], cwd=ROOT)
    assert Path(where.stdout.strip()).is_relative_to(fresh.parent.parent)  # the installed copy, not the checkout


def test_the_wheel_declares_and_installs_the_stdio_bridge_as_a_console_script(dist, fresh):
    """recovery-mcp-stdio (docs/mcp-gateway.md) ships in the distribution: an entry point of the wheel, and a command
    of the fresh virtualenv that runs with nothing but the client and requests installed."""
    [wheel] = dist.glob("*.whl")
    version = recovery_client.__version__
    entry = zipfile.ZipFile(wheel).read(f"recovery_console_client-{version}.dist-info/entry_points.txt").decode()
    assert "recovery-mcp-stdio = recovery_client.mcp_stdio:main" in entry
    bridge = fresh.parent / "recovery-mcp-stdio"
    helped = _run([str(bridge), "--help"])
    assert "--token-env" in helped.stdout and "--url" in helped.stdout
    assert "recovery-mcp-stdio" in (CLIENT / "README.md").read_text()


@pytest.mark.django_db(transaction=True)
def test_the_clients_own_tests_pass_from_the_fresh_virtualenv_against_a_live_console(fresh, live_server, tmp_path):
    with drill_stage(api_url=live_server.url) as stage:
        env = {
            "PATH": os.environ["PATH"],
            "RECOVERY_API_URL": stage.api_url,
            "RECOVERY_TOKEN": stage.token,
            "RECOVERY_TENANT": stage.tenant,
            "RECOVERY_TOOL_PREFIX": stage.prefix,
            "SANDBOX_URL": stage.sandbox.url,
            "SANDBOX_API_KEY": os.environ["SANDBOX_API_KEY"],
        }
        done = subprocess.run(
            [str(fresh), "-I", "-m", "unittest", "discover", "-v", "-s", str(CLIENT / "tests")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    ran = re.search(r"^Ran (\d+) tests?", report, re.M)
    assert ran and int(ran[1]) >= 15, report
    assert re.search(r"^OK$", report, re.M) and "skipped" not in report, report  # every test ran, none skipped


# --- the development virtualenv and the examples --------------------------------------------------------------------


def test_the_development_virtualenv_holds_the_client_installed_from_its_current_source():
    """What the console, its tests and the examples import is the installed distribution, and the very code of
    clients/python (after a change, `make install` installs it again)."""
    installed = Path(recovery_client.__file__).parent
    assert not installed.is_relative_to(ROOT / "clients")
    stale = sorted(
        path.name
        for path in SOURCE.glob("*.py")
        if not (installed / path.name).is_file()
        or hashlib.sha256((installed / path.name).read_bytes()).digest() != hashlib.sha256(path.read_bytes()).digest()
    )
    assert stale == [], f"the installed recovery_client differs from clients/python in {stale}: run `make install`"


@pytest.fixture
def demo_console(sandbox, live_server, monkeypatch):
    """A console serving the shipped registry (tenant demo, refund.create) against the sandbox process, with its
    background jobs, as `make run` serves them: what the examples expect."""
    monkeypatch.setenv("SANDBOX_API_KEY", sandbox.api_key)
    load_registry(sandbox_registry(sandbox.url), actor=Actor.system("tests"))
    _, token = token_create(name="examples", tenants=["demo"], actor=Actor.system("tests"))
    with background_jobs():
        yield {"url": live_server.url, "token": token, "sandbox": sandbox}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("example", "framework"),
    [("openai_agents_tool.py", "agents"), ("langchain_tool.py", "langchain_core")],
)
def test_the_framework_examples_run_against_the_installed_client(demo_console, example, framework, tmp_path):
    probe = subprocess.run([sys.executable, "-c", f"import {framework}"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        missing_service(f"needs {framework}: pip install -r requirements-adoption.txt")
    sandbox = demo_console["sandbox"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTHONPATH", "DJANGO_"))}
    env |= {
        "RECOVERY_API_URL": demo_console["url"],
        "RECOVERY_TOKEN": demo_console["token"],
        "RECOVERY_TENANT": "demo",
        "SANDBOX_URL": sandbox.url,
        "SANDBOX_API_KEY": sandbox.api_key,
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "examples" / example), "--lose-reply", "--order", "O-4242"],
        cwd=tmp_path,  # no checkout on its path: only what the virtualenv installed
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    ledger = re.search(r"the sandbox's ledger for (\S+): (\d+) effect\(s\)", output)
    assert ledger and ledger[2] == "1", output  # the reply was lost, and the refund was still made once
    assert '"status": "committed"' in output, output
    refunds = [r for r in sandbox.requests(path_prefix="/refunds") if r["method"] == "POST"]
    assert [r["key"] for r in refunds] == [ledger[1]], refunds  # one request: nothing sent again


# --- the deprecated package -----------------------------------------------------------------------------------------


def test_recovery_client_is_still_importable_as_a_deprecated_re_export():
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import recovery.client as old, recovery.client.recovered as old_recovered\n"
        "    from recovery.client.runtime import Runtime\n"
        "    from recovery.client.types import Task\n"
        "import sys, recovery_client as new, recovery_client.runtime\n"
        "assert [w.category for w in seen] == [DeprecationWarning], seen\n"
        "assert 'import recovery_client' in str(seen[0].message), seen[0].message\n"
        "assert old.__all__ == new.__all__ and all(getattr(old, n) is getattr(new, n) for n in new.__all__)\n"
        "assert old_recovered is new.recovered and Runtime is recovery_client.runtime.Runtime and Task is new.Task\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'ninja', 'pydantic')]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

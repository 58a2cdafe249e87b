"""Static files in production: DEBUG off, `collectstatic` into a folder, the console under gunicorn — every stylesheet,
script and image that any console page (and the admin) references answers 200, from WhiteNoise, with its type.

With DEBUG off Django serves no static files at all: before WhiteNoise the console ran without its CSS and scripts.
"""

from __future__ import annotations

import re
import subprocess
import sys
from urllib.parse import urljoin, urlsplit

import pytest
import requests
from django.apps import apps as django_apps
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from recovery.audit.chain import Actor
from recovery.devtools.drills.stage import database_url
from recovery.models.roles import ADMIN, APPROVER, REVIEWER, sync_roles
from recovery.services.users import user_save_with_roles
from tests.servers import ROOT, WebServer, production_env

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "static-test-password-31"
ASSET = re.compile(r"""<(?:link|script|img)\b[^>]*?\b(?:href|src)="([^"]+)\"""", re.IGNORECASE)
LINK = re.compile(r"""<a\b[^>]*?\bhref="(/[^"#?]*)""", re.IGNORECASE)
TYPES = {".css": "text/css", ".js": "javascript", ".svg": "image/svg", ".png": "image/png", ".ico": "image/"}


def _keep_cookies(session: requests.Session):
    """Production cookies are Secure, and requests sends those over https only; this test speaks plain HTTP to
    127.0.0.1 as the TLS proxy in front would, so it carries them in the Cookie header itself."""
    kept: dict[str, str] = {}

    def hook(response, *args, **kwargs):
        kept.update(response.cookies.get_dict())
        session.headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in kept.items())

    session.hooks["response"].append(hook)


def _signed_in(url: str, username: str) -> requests.Session:
    session = requests.Session()
    _keep_cookies(session)
    # Behind a TLS proxy: the request is https as far as Django knows (TRUST_X_FORWARDED_PROTO=1).
    session.headers.update({"X-Forwarded-Proto": "https", "Referer": f"https://{urlsplit(url).netloc}/sign-in/"})
    form = session.get(f"{url}/sign-in/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    answer = session.post(
        f"{url}/sign-in/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
        allow_redirects=False,
        timeout=10,
    )
    assert answer.status_code == 302, re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", answer.text))[-800:]
    return session


def _pages(session: requests.Session, url: str, start: str) -> dict[str, str]:
    """`start` and every console page it links to, one level deep: path -> HTML."""
    first = session.get(url + start, timeout=10)
    assert first.status_code == 200, (start, first.status_code)
    pages = {start: first.text}
    for path in sorted(set(LINK.findall(first.text))):
        if path in pages or path.startswith(("/sign-out", "/static/")) or "export" in path:
            continue
        page = session.get(url + path, timeout=10)
        if page.status_code == 200 and "text/html" in page.headers.get("Content-Type", ""):
            pages[path] = page.text
    return pages


def test_with_debug_off_every_page_gets_every_asset_it_references(tmp_path):
    sync_roles(django_apps)  # a transactional test before this one may have flushed the role groups
    for username, roles in (("static-reviewer", [REVIEWER, APPROVER]), ("static-admin", [ADMIN])):
        user, _ = user_save_with_roles(username=username, roles=roles, password=PASSWORD, actor=Actor.system("tests"))
        # The server runs the production settings, whose hasher is PBKDF2 (the suite's is a fast MD5).
        user.password = PBKDF2PasswordHasher().encode(PASSWORD, "static-test-salt")
        user.save(update_fields=["password"])
    env = production_env(
        DATABASE_URL=database_url(),
        RECOVERY_STATIC_ROOT=str(tmp_path / "static"),
        RECOVERY_TOKEN_PEPPER="static-test-pepper",
        TRUST_X_FORWARDED_PROTO="1",
    )
    built = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "static" / "staticfiles.json").exists()  # the manifest: hashed names, compressed copies

    with WebServer(env, log_path=tmp_path / "gunicorn.log") as web:
        pages = _pages(_signed_in(web.url, "static-reviewer"), web.url, "/overview/")
        pages |= _pages(_signed_in(web.url, "static-admin"), web.url, "/admin/")
        pages["/sign-in/"] = requests.get(web.url + "/sign-in/", timeout=10).text
        assets = {urljoin("/", src) for html in pages.values() for src in ASSET.findall(html)}
        assets = {a for a in assets if a.startswith("/static/")}
        assert len(pages) >= 8 and len(assets) >= 5, (sorted(pages), sorted(assets))
        assert any(re.search(r"\.[0-9a-f]{12}\.css$", a) for a in assets)  # hashed names, so cached forever

        for asset in sorted(assets):
            answer = requests.get(web.url + asset, headers={"Accept-Encoding": "gzip"}, timeout=10)
            assert answer.status_code == 200, (asset, answer.status_code, web.log()[-2000:])
            wanted = next((t for ext, t in TYPES.items() if asset.endswith(ext)), "")
            assert wanted in answer.headers["Content-Type"], (asset, answer.headers["Content-Type"])
            assert "max-age=315360000" in answer.headers.get("Cache-Control", ""), asset
        css = next(a for a in sorted(assets) if a.endswith(".css"))
        compressed = requests.get(web.url + css, headers={"Accept-Encoding": "gzip"}, timeout=10)
        assert compressed.headers.get("Content-Encoding") == "gzip"  # the precompressed copy collectstatic made

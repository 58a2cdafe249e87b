"""The console's pages and the API's calls go through different middleware (console/middleware.py, _pages_only):
sessions, signed-in users, messages, CSP and htmx serve the pages and are skipped for a bearer token's JSON calls;
the pages keep every one of them, and so does the API's one page, its docs."""

from __future__ import annotations

import pytest
from django.test import Client

from recovery.audit.chain import Actor
from recovery.services.tokens import token_create

pytestmark = pytest.mark.django_db


def test_an_api_call_gets_json_without_the_pages_headers_or_cookies(registry, task):
    _, raw = token_create(name="runtime", tenants=["acme"], actor=Actor.system("t"))
    answer = Client().get(f"/api/v1/tasks/{task.pk}", headers={"authorization": f"Bearer {raw}"})
    assert answer.status_code == 200 and answer.json()["id"] == task.pk
    assert "Content-Security-Policy" not in answer.headers  # no page to protect: JSON
    assert "Cookie" not in answer.headers.get("Vary", "")  # no session was read
    assert not answer.cookies
    assert answer.headers["X-Request-Id"] and answer.headers["X-Content-Type-Options"] == "nosniff"  # the API's own
    assert answer.headers["X-Frame-Options"] == "DENY" and answer.headers["Referrer-Policy"]


def test_the_pages_keep_their_middleware(registry):
    client = Client(enforce_csrf_checks=True)
    page = client.get("/sign-in/")
    assert page.status_code == 200 and "default-src" in page.headers["Content-Security-Policy"]
    assert "csrftoken" in page.cookies
    refused = client.post("/sign-in/", {"username": "x", "password": "y"})  # no CSRF token: refused as before
    assert refused.status_code == 403
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200 and "Content-Security-Policy" in docs.headers  # the API's one page is a page

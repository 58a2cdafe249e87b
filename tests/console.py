"""Scaffolding shared by the console's tests (tests/test_console_*.py, and tests/browser.py): the people who use the
console, one per role, a test client signed in as any of them, the hostile text every page must show as text, and
two readers of a page (the SQL statements it ran, the text it shows).

Registered in tests/conftest.py, so the `people` fixture is found by every test module; the constants and helpers
are imported from here by the modules that use them.
"""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext

from recovery.audit.chain import Actor
from recovery.models.roles import REVIEWER, ROLES
from recovery.services.users import user_save_with_roles

__all__ = [
    "HOSTILE_IMG", "HOSTILE_SCRIPT", "NO_ROLE", "PASSWORD", "SIGNED_OUT",
    "page_text", "people", "signed_in", "statements",
]  # fmt: skip

PASSWORD = "a-long-test-password-42"
# Two visitors who are not a role: one with no session at all, and a signed-in user ("nobody") with no role.
SIGNED_OUT, NO_ROLE = "signed-out", "no-role"
HOSTILE_SCRIPT = "<script>window.__pwned=1</script>"
HOSTILE_IMG = "<img src=x onerror=window.__pwned=1>"


def make_people() -> dict:
    """One user per role, named after it; under NO_ROLE a user "nobody" with no role; and "reviewer2", a second
    reviewer. Each signs in with PASSWORD. (The role groups must exist: see tests/browser.py's console_people.)"""
    made = {}
    for role in ROLES:
        made[role], _ = user_save_with_roles(username=role, roles=[role], password=PASSWORD, actor=Actor.system("t"))
    made[NO_ROLE] = get_user_model().objects.create_user(username="nobody", password=PASSWORD)
    made["reviewer2"], _ = user_save_with_roles(
        username="reviewer2", roles=[REVIEWER], password=PASSWORD, actor=Actor.system("t")
    )
    return made


@pytest.fixture
def people(db) -> dict:
    return make_people()


def signed_in(people: dict, who: str, **client_kwargs) -> Client:
    """A test client signed in as `people[who]`; for SIGNED_OUT, one with no session."""
    client = Client(**client_kwargs)
    if who != SIGNED_OUT:
        client.force_login(people[who])
    return client


def statements(client: Client, url: str, **extra) -> tuple[int, HttpResponse]:
    """How many SQL statements one GET of `url` runs (it must answer 200), and its response."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, **extra)
    assert response.status_code == 200, (url, response.status_code)
    return len(captured), response


def page_text(html: str) -> str:
    """The page's text as a reader gets it: tags dropped, entities decoded, white space collapsed."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html))).strip()

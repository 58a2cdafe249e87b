"""The console's 403, 404 and 500 pages (docs/console.md; console/views/errors.py): in the layout with the navigation,
saying what happened — the 403 naming the role the page needs — under `make run`'s DEBUG too, where Django's technical
pages appear only with RECOVERY_TECHNICAL_ERRORS; a favicon; the API's expected refusals logged at INFO."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from django.contrib.staticfiles import finders
from django.test import Client
from django.urls import path

from console import urls as console_urls
from console.templatetags import console_tags
from recovery.models.roles import APPROVER, REVIEWER, VIEWER
from tests.console import NO_ROLE, page_text, signed_in
from tests.servers import ROOT

pytestmark = pytest.mark.django_db


def _boom(request):
    raise RuntimeError("a bug in a view")


# This module as the URLconf: the console's, its error handlers, and a page that fails.
urlpatterns = [path("boom/", _boom), *console_urls.urlpatterns]
handler403, handler404, handler500 = console_urls.handler403, console_urls.handler404, console_urls.handler500


def test_a_reviewer_opening_approvals_gets_a_styled_403_naming_the_approver_role(people):
    response = signed_in(people, REVIEWER).get("/approvals/")

    assert response.status_code == 403
    html = response.content.decode()
    assert 'aria-label="Console"' in html and "console.css" in html  # the layout, with its navigation
    text = page_text(html)
    assert "This page needs the approver role." in text
    assert "signed in as reviewer with the role reviewer" in text
    assert "403 Forbidden" not in text


def test_an_account_without_a_role_is_told_so(people):
    text = page_text(signed_in(people, NO_ROLE).get("/queues/unknown/").content.decode())
    assert "This page needs the viewer, reviewer, approver or admin role." in text
    assert "has no console role" in text


@pytest.mark.parametrize("debug", [False, True])
def test_a_mistyped_url_gets_the_console_404_not_django_s_url_list(people, settings, debug):
    settings.DEBUG = debug

    response = signed_in(people, VIEWER).get("/queues/unknwon/x/")

    assert response.status_code == 404
    html = response.content.decode()
    assert "Page not found" in html and "There is no page at" in html and 'aria-label="Console"' in html
    assert "URLconf" not in html and "console:queue" not in html


def test_the_technical_404_is_there_for_a_developer_who_asks_for_it(people, settings):
    settings.DEBUG, settings.RECOVERY_TECHNICAL_ERRORS = True, True

    html = signed_in(people, VIEWER).get("/no-such-page/").content.decode()

    assert "URLconf" in html


def test_a_signed_out_visitor_gets_the_404_with_a_way_to_sign_in(db, settings):
    settings.DEBUG = True
    text = page_text(Client().get("/no-such-page/").content.decode())
    assert "Page not found" in text and "Sign in" in text


@pytest.mark.parametrize("debug", [False, True])
def test_a_failing_page_gets_the_console_500_without_a_traceback(people, settings, debug):
    settings.DEBUG, settings.ROOT_URLCONF = debug, __name__
    client = signed_in(people, VIEWER)
    client.raise_request_exception = False

    response = client.get("/boom/")

    assert response.status_code == 500
    html = response.content.decode()
    assert "Something went wrong" in html and "a bug in a view" not in html and "Traceback" not in html


def test_every_page_names_a_favicon_and_favicon_ico_leads_to_it(people):
    html = signed_in(people, APPROVER).get("/overview/").content.decode()
    assert 'rel="icon"' in html and "favicon.svg" in html
    redirected = Client().get("/favicon.ico")
    assert redirected.status_code == 301 and redirected["Location"].endswith(".svg")
    assert finders.find("console/favicon.svg")  # collectstatic ships it (served as every static file is)


def test_an_expected_refusal_is_logged_at_info_and_a_real_warning_stays_a_warning(caplog):
    logger = logging.getLogger("django.request")
    with caplog.at_level(logging.INFO, logger="django.request"):
        logger.warning("Conflict: /api/v1/calls/1/attempts", extra={"status_code": 409})
        logger.warning("Not Found: /api/v1/nothing", extra={"status_code": 404})
    levels = {record.getMessage().split(":")[0]: record.levelname for record in caplog.records}
    assert levels == {"Conflict": "INFO", "Not Found": "WARNING"}


def test_under_make_run_s_debug_a_refusal_is_printed_once_at_info(tmp_path):
    script = (
        "import django, logging; django.setup();"
        "logging.getLogger('django.request').warning('Conflict: /api/v1/calls/7/attempts', extra={'status_code': 409})"
    )
    env = {**os.environ, "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "console.settings", "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True)

    printed = [line for line in done.stderr.splitlines() if "Conflict: /api/v1/calls/7/attempts" in line]
    assert len(printed) == 1 and " INFO django.request " in printed[0], done.stderr


@pytest.mark.parametrize(
    "seconds, words", [(86400, "1 d"), (90, "1 min 30 s"), (5400, "1 h 30 min"), (45, "45 s"), (0, "0 s")]
)
def test_durations_read_as_people_write_them(seconds, words):
    assert console_tags.duration(seconds) == words


def test_a_worker_is_named_by_its_machine_and_process():
    assert console_tags.worker("vm:11097:139762824357568") == "vm, process 11097"
    assert console_tags.worker("doomed") == "doomed"

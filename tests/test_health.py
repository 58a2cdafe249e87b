"""Health probes (console/health.py, docs/deploy.md): /healthz says the process is up, /readyz that it can serve —
the database answers and every migration is applied; Redis and the scheduler's holder are reported, never failing
it. Probes come by IP over plain HTTP: no host check, no HTTPS redirect, no sign-in, no data."""

from __future__ import annotations

import pytest
import requests
from django.db.migrations.recorder import MigrationRecorder

from recovery.devtools.drills.stage import database_url
from recovery.jobs.cron import Scheduler
from tests.servers import WebServer, free_port, production_env


@pytest.fixture(autouse=True)
def uncached(settings):
    settings.RECOVERY_READY_CACHE_S = 0


def test_healthz_answers_without_reading_anything(client):
    # No database fixture: a query would raise. By IP, a host ALLOWED_HOSTS does not name.
    reply = client.get("/healthz", HTTP_HOST="10.0.3.7")

    assert reply.status_code == 200 and reply.json() == {"status": "up"}
    assert reply["Cache-Control"] == "no-store"


def test_readyz_is_ready_with_the_database_answering_and_every_migration_applied(db, client, settings):
    settings.REDIS_URL = ""

    reply = client.get("/readyz/", HTTP_HOST="10.0.3.7")

    assert reply.status_code == 200
    body = reply.json()
    assert body["status"] == "ready" and body["database"]["ok"] is True
    assert body["database"]["pending_migrations"] == 0
    assert body["redis"] == {"configured": False} and body["scheduler"] == {"mode": "in-process"}
    assert set(body) == {"status", "database", "redis", "scheduler"}  # no data: no counts, no names, no ids


def test_a_pending_migration_makes_it_not_ready_and_names_it(db, client, settings):
    settings.REDIS_URL = ""
    latest = MigrationRecorder.Migration.objects.filter(app="recovery").order_by("-name").first()
    latest.delete()  # rolled back with the test's transaction: as if the code were newer than the schema

    reply = client.get("/readyz")

    assert reply.status_code == 503
    body = reply.json()
    assert body["status"] == "not_ready" and body["database"]["pending_migrations"] == 1
    assert body["database"]["pending"] == [f"recovery.{latest.name}"]


def test_redis_down_is_reported_and_never_fails_readiness(db, client, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there

    reply = client.get("/readyz")

    assert reply.status_code == 200
    body = reply.json()
    assert body["status"] == "ready"
    assert body["redis"]["configured"] is True and body["redis"]["ok"] is False
    assert body["scheduler"] == {"holder": None}


def test_it_names_the_scheduler_holder_and_its_lease(db, client, rq_queue):
    rq_queue.connection.set(Scheduler.LOCK_KEY, "host-a:4242:ab12cd34", px=9000)

    body = client.get("/readyz").json()

    assert body["redis"] == {"configured": True, "ok": True}
    assert body["scheduler"]["holder"] == "host-a:4242:ab12cd34"
    assert 0 < body["scheduler"]["lease_ms"] <= 9000


@pytest.mark.postgres  # the dead database is a PostgreSQL address nothing listens on; the live one is the suite's
@pytest.mark.django_db(transaction=True)
def test_in_production_settings_probes_by_ip_get_no_redirect_and_a_dead_database_is_not_ready(tmp_path):
    secure = dict(ALLOWED_HOSTS="console.example.com", SECURE_SSL_REDIRECT="1", RECOVERY_READY_CACHE_S="0")
    env = production_env(DATABASE_URL=database_url(), RECOVERY_TOKEN_PEPPER="health-pepper", **secure)
    with WebServer(env, log_path=tmp_path / "live.log") as web:
        for path in ("/healthz", "/readyz"):
            reply = requests.get(web.url + path, timeout=10, allow_redirects=False)
            assert reply.status_code == 200, (path, reply.status_code, reply.text[:300])
        # Everything else still gets the production checks: a host it does not serve is refused.
        assert requests.get(web.url + "/sign-in/", timeout=10, allow_redirects=False).status_code == 400

    dead = production_env(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{free_port()}/nothing", RECOVERY_TOKEN_PEPPER="p", **secure
    )
    with WebServer(dead, log_path=tmp_path / "dead.log") as web:
        assert requests.get(web.url + "/healthz", timeout=10).status_code == 200
        reply = requests.get(web.url + "/readyz", timeout=10)
        assert reply.status_code == 503
        assert reply.json()["status"] == "not_ready" and reply.json()["database"] == {
            "ok": False,
            "error": "OperationalError",
        }

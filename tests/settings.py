"""Settings for the test suite: the project's own, with the development defaults (dev SECRET_KEY, local hosts)
unless the environment says otherwise. pytest-django still runs each test with DEBUG off."""

import os

os.environ.setdefault("DEBUG", "1")

from console.settings import *  # noqa: F403

# Plain static storage whatever DEBUG says: template tests need no collectstatic manifest (tests/test_static.py
# checks the production storage for real, in a server of its own).
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405

# Every answer the hot endpoints write as built is checked against its schema (recovery/api/answering.py).
RECOVERY_CHECK_ANSWERS = True

# Hashing passwords with PBKDF2's production cost dominates tests that create users; the algorithm is not under test.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# On SQLite, a test database in a file (WAL, busy timeout) rather than Django's shared-cache in-memory one, whose
# table locks fail at once instead of waiting: background jobs and reconciliation run checks on threads, as they do
# on the embedded default.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}  # noqa: F405

# PostgreSQL: a test database of this run's own (pytest-django creates and drops it), so a run never meets another
# run's rows, nor a `make run` on the database DATABASE_URL names.
if DATABASES["default"]["ENGINE"].endswith("postgresql"):  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}  # noqa: F405

# Jobs the tests enqueue go to a Redis database this run claimed (tests/isolation.py), never to the queues a real
# worker reads; processes the tests start inherit the claim. Each pytest-xdist worker is a run of its own (its own
# test database too): it inherits the environment of the process that started it, so a claim counts as inherited
# only when it was made for the same worker — the processes its tests start share it, the other workers do not.
if REDIS_URL:  # noqa: F405
    from tests.isolation import CLAIMED_FOR, INHERITED, claim_redis_database

    run = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if not os.environ.get(INHERITED) or os.environ.get(CLAIMED_FOR) != run:
        os.environ[INHERITED] = claim_redis_database(REDIS_URL)  # noqa: F405
        os.environ[CLAIMED_FOR] = run
    REDIS_URL = os.environ["REDIS_URL"] = os.environ[INHERITED]
    RQ_QUEUES = {"default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 300}}

"""Settings for the test suite: the project's own, with the development defaults (dev SECRET_KEY, local hosts)
unless the environment says otherwise. pytest-django still runs each test with DEBUG off."""

import os

os.environ.setdefault("DEBUG", "1")

from console.settings import *  # noqa: F403

# Hashing passwords with PBKDF2's production cost dominates tests that create users; the algorithm is not under test.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# On SQLite, a test database in a file (WAL, busy timeout) rather than Django's shared-cache in-memory one, whose
# table locks fail at once instead of waiting: background jobs and reconciliation run checks on threads, as they do
# on the embedded default.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}  # noqa: F405

# Jobs the tests enqueue go to their own Redis database, never to the queues a real worker reads.
if REDIS_URL:  # noqa: F405
    REDIS_URL = REDIS_URL.rsplit("/", 1)[0] + "/14"  # noqa: F405
    RQ_QUEUES = {"default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 300}}

"""Settings for the test suite: the project's own, with the development defaults (dev SECRET_KEY, local hosts)
unless the environment says otherwise. pytest-django still runs each test with DEBUG off."""

import os

os.environ.setdefault("DEBUG", "1")

from console.settings import *  # noqa: F403

# Hashing passwords with PBKDF2's production cost dominates tests that create users; the algorithm is not under test.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

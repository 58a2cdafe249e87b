"""Strict readers for settings that come from the environment.

Every helper fails loudly (ImproperlyConfigured naming the variable and what it expected) instead of silently
falling back to a default when a value is present but malformed: a typo in production must stop the process, not
turn DEBUG on or point the console at an empty database.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ImproperlyConfigured(f"{name} must be set")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean: use one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be at least {minimum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    items = [item.strip() for item in value.split(",")]
    if any(not item for item in items):
        raise ImproperlyConfigured(f"{name}={value!r} has an empty item: use a comma-separated list")
    return items


def env_host_port(name: str, default: str) -> str:
    """A listening address "host:port" (port 1-65535; an IPv6 host in brackets), as `manage.py run --addr` takes."""
    value = os.environ.get(name, default).strip()
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ImproperlyConfigured(f"{name}={value!r}: use host:port with a port from 1 to 65535, e.g. 127.0.0.1:8001")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ImproperlyConfigured(f"{name}={value!r}: write an IPv6 host in brackets, e.g. [::1]:8001")
    return value


_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,32}")


def env_keyring(name: str, default: list[tuple[str, str]] | None) -> list[tuple[str, str]]:
    """A keyring "id:secret,id:secret" — the first key signs, every one verifies (rotation adds a key in front and
    keeps the old ones). Ids are 1-32 of [A-Za-z0-9_.-], each once; secrets at least 32 characters."""
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ImproperlyConfigured(f"{name} must be set: id:secret[,id:secret...] (the first one signs)")
        return list(default)
    keys: list[tuple[str, str]] = []
    for item in value.split(","):
        key_id, sep, secret = item.strip().partition(":")
        if not sep or not _KEY_ID.fullmatch(key_id):
            raise ImproperlyConfigured(f"{name}: write id:secret pairs, ids of 1-32 letters, digits, '_', '.' or '-'")
        if len(secret) < 32:
            raise ImproperlyConfigured(f"{name}: the secret of key {key_id!r} must be at least 32 characters")
        if any(key_id == known for known, _ in keys):
            raise ImproperlyConfigured(f"{name}: key {key_id!r} is given twice")
        keys.append((key_id, secret))
    return keys


def keyring_text(keys: list[tuple[str, str]]) -> str:
    """The RECOVERY_AUDIT_KEYS value of a keyring (to hand this process's keys to a child process)."""
    return ",".join(f"{key_id}:{secret}" for key_id, secret in keys)


def database_from_env(name: str, *, sqlite_default: Path) -> dict:
    """DATABASES['default'] from a URL; an unset variable means the embedded SQLite file."""
    url = os.environ.get(name, "").strip()
    if not url:
        sqlite_default.parent.mkdir(parents=True, exist_ok=True)
        return sqlite_config(sqlite_default)
    scheme = urlsplit(url).scheme
    if scheme in {"postgres", "postgresql", "pgsql"}:
        config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
        config["ENGINE"] = "console.postgresql"  # Django's, its health check without a round trip
        # Behind PgBouncer in transaction mode (docs/deploy.md) a server connection serves another client between
        # two transactions: nothing may outlive one — no prepared statement, no cursor held open between queries.
        pooled = env_bool("DATABASE_TRANSACTION_POOLING", False)
        if pooled:
            config["DISABLE_SERVER_SIDE_CURSORS"] = True
        if env_bool("DATABASE_PREPARED_STATEMENTS", not pooled):
            # Parameters bound by the server and statements prepared after 5 runs (psycopg's own defaults, which
            # Django turns off for the sake of transaction-pooling proxies): the hot path's statements are parsed
            # and planned once per connection instead of on every request. Off behind PgBouncer.
            config.setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=5)
        if env_bool("DATABASE_POOL", False):
            # Django's psycopg pool, for web processes (docs/deploy.md): a process keeps DATABASE_POOL_MAX connections
            # open and lends one per request (no persistent connection per thread). Never in forked work horses:
            # `runjobs` turns it off for itself.
            config["CONN_MAX_AGE"] = 0
            config.setdefault("OPTIONS", {})["pool"] = {
                "min_size": env_int("DATABASE_POOL_MIN", 2, minimum=0),
                "max_size": env_int("DATABASE_POOL_MAX", 8, minimum=1),
                "timeout": 10,
            }
        if not config.get("NAME"):
            raise ImproperlyConfigured(f"{name} must name a database: postgres://user@host:5432/dbname")
        return config
    if scheme == "sqlite":
        path = url.removeprefix("sqlite:///").removeprefix("sqlite://")
        if not path:
            raise ImproperlyConfigured(f"{name}={url!r}: use sqlite:////absolute/path.sqlite3")
        return sqlite_config(Path(path))
    raise ImproperlyConfigured(f"{name}={url!r}: only postgres:// and sqlite:/// URLs are supported")


def sqlite_config(path: Path) -> dict:
    # WAL lets the console read while a job writes; IMMEDIATE takes the write lock at BEGIN so two writers queue
    # on the busy timeout instead of failing half-way with "database is locked".
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
    }


def redis_url_from_env(name: str) -> str | None:
    url = os.environ.get(name, "").strip()
    if not url:
        return None
    if urlsplit(url).scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"{name}={url!r}: use redis://host:6379/0 (or rediss://, unix://)")
    return url


def env_seconds_by_key(
    name: str, default: dict[str, int], *, keys: tuple[str, ...], scopes: tuple[str, ...] = ()
) -> dict[str, int]:
    """A table of durations in seconds, one per key, from "key=seconds,key=seconds" (e.g. "high=900,low=14400").

    The value is the whole table: every key once, each a whole number of seconds above zero. A key missing, repeated
    or unknown stops the process, so a typo cannot leave one risk without its SLA. With `scopes`, "scope.key" may
    also be given (e.g. "human-review.high=120"): that key's value within that scope, over the key's own.
    """
    value = os.environ.get(name)
    if value is None:
        return dict(default)
    table: dict[str, int] = {}
    for item in value.split(","):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise ImproperlyConfigured(f"{name}={value!r}: write key=seconds pairs separated by commas")
        if refusal := _key_refusal(key, keys, scopes):
            raise ImproperlyConfigured(f"{name}={value!r}: {refusal}")
        if key in table:
            raise ImproperlyConfigured(f"{name}={value!r}: {key!r} is given twice")
        if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
            raise ImproperlyConfigured(f"{name}={value!r}: {key}={raw!r} is not a whole number of seconds above 0")
        table[key] = int(raw)
    if missing := [key for key in keys if key not in table]:
        raise ImproperlyConfigured(f"{name}={value!r}: {', '.join(missing)} missing (every one of {', '.join(keys)})")
    return table


def _key_refusal(key: str, keys: tuple[str, ...], scopes: tuple[str, ...]) -> str:
    scope, dot, bare = key.rpartition(".")
    if not dot:
        return "" if key in keys else f"{key!r} is not one of {', '.join(keys)}"
    if scopes and scope in scopes and bare in keys:
        return ""
    if not scopes:
        return f"{key!r} is not one of {', '.join(keys)}"
    return f"{key!r} is not <queue>.<risk> (queue one of {', '.join(scopes)}; risk one of {', '.join(keys)})"

"""API tokens for agent runtimes (docs/api.md): `rc_` + 43 URL-safe characters, issued once, scoped to tenants and to
`runtime` or `metrics` use, revocable. The row keeps the first 12 characters (`prefix`, to find it) and only
HMAC-SHA256(RECOVERY_TOKEN_PEPPER, token), so a copy of the table alone can neither be replayed nor brute-forced.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from recovery.audit.actions import AuditAction
from recovery.audit.chain import Actor, append_event
from recovery.models import ApiToken, Tenant, TokenScope
from recovery.services.errors import Refusal
from recovery.statemachine.hot_path import token_links

TOKEN_SCHEME = "rc_"
PREFIX_LENGTH = 12
# What token_create issues: the scheme and URL-safe base64. Anything else (a NUL, say, which PostgreSQL refuses in a
# query) is malformed and never reaches the database.
TOKEN_SHAPE = re.compile(re.escape(TOKEN_SCHEME) + r"[A-Za-z0-9_-]+")
# last_used_at is written at most once a minute per token, so authenticating is a read on the hot path.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def token_digest(raw: str) -> str:
    pepper = settings.RECOVERY_TOKEN_PEPPER
    if not pepper:
        raise RuntimeError("RECOVERY_TOKEN_PEPPER is not set: API tokens cannot be issued or checked")
    return hmac.new(pepper.encode(), raw.encode(), hashlib.sha256).hexdigest()


def token_create(
    *, name: str, tenants: list[str], actor: Actor, scope: str = TokenScope.RUNTIME, created_by=None
) -> tuple[ApiToken, str]:
    """Issue a token of `scope` (runtime or metrics) for `tenants` (names, each of which must exist); returns the row
    and the plaintext, once.

    Raises ValueError, storing nothing, for a blank or taken name, an unknown scope, no tenants, or a tenant that
    does not exist.
    """
    name = name.strip()
    if not name or len(name) > ApiToken._meta.get_field("name").max_length:
        raise ValueError("a token name must be 1 to 100 characters")
    if scope not in TokenScope.values:
        raise ValueError(f"unknown token scope {scope!r}: use one of {', '.join(TokenScope.values)}")
    wanted = sorted(set(tenants))
    if not wanted:
        raise ValueError("a token must be scoped to at least one tenant")
    raw = TOKEN_SCHEME + secrets.token_urlsafe(32)
    with transaction.atomic():
        found = list(Tenant.objects.filter(name__in=wanted))
        if unknown := sorted(set(wanted) - {tenant.name for tenant in found}):
            raise ValueError(f"unknown tenant {', '.join(map(repr, unknown))}: declare it in the registry first")
        if ApiToken.objects.filter(name=name).exists():
            raise ValueError(f"an API token named {name!r} already exists: revoke it or choose another name")
        try:
            with transaction.atomic():  # a concurrent create of the same name loses here, not in the outer block
                token = ApiToken.objects.create(
                    name=name, scope=scope, prefix=raw[:PREFIX_LENGTH], digest=token_digest(raw), created_by=created_by
                )
        except IntegrityError:
            raise ValueError(f"an API token named {name!r} already exists: revoke it or choose another name") from None
        token.tenants.set(found)
        append_event(
            action=AuditAction.API_TOKEN_CREATED,
            actor=actor,
            reason=f"{scope} token for {', '.join(wanted)}",
            evidence={"name": name, "prefix": token.prefix, "scope": scope, "tenants": wanted},
        )
    return token, raw


def token_authenticate(raw: str, *, now: datetime | None = None, task_id: int | None = None) -> ApiToken | None:
    """The live token `raw` names, with `tenant_list` (its tenants by name, read with it in the one statement every
    API request runs: recovery.statemachine.hot_path.token_links) and `tenant_ids` set; None for anything else.
    `task_id`: the task the request's path names, read in the same statement: `tasks_read` maps it to the task (with
    its tenant) if one of the token's tenants has it, to None otherwise.

    A token always has at least one tenant (token_create refuses none), so its tenant links are the token. Unknown,
    malformed and revoked tokens and wrong secrets all answer None, so a caller cannot tell them apart.
    """
    if len(raw) <= PREFIX_LENGTH or len(raw) > 200 or not TOKEN_SHAPE.fullmatch(raw):
        return None
    digest = token_digest(raw)
    links, named = token_links(raw[:PREFIX_LENGTH], task_id)
    token = links[0][0] if links else None
    if token is None or not hmac.compare_digest(token.digest, digest):
        return None
    now = now or timezone.now()
    stale_before = now - LAST_USED_RESOLUTION
    if token.last_used_at is None or token.last_used_at < stale_before:
        # Conditional, so of the concurrent requests that all read a stale value only one writes it.
        stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale_before)
        if ApiToken.objects.filter(stale, pk=token.pk).update(last_used_at=now):
            token.last_used_at = now
    token.tenant_list = tuple(tenant for _, tenant in links)
    token.tenant_ids = {tenant.pk for tenant in token.tenant_list}
    token.tasks_read = {task_id: named} if task_id is not None else {}
    return token


def token_require_scope(token: ApiToken, scopes: tuple[str, ...]) -> None:
    """Refuse (403 wrong_token_scope) a live token of a scope the endpoint does not take: a real token of the wrong
    kind is told so, rather than given the 401 of a bad token, which would send its owner looking for a typo."""
    if token.scope not in scopes:
        raise Refusal(
            "wrong_token_scope",
            f"this is a {token.scope} token, and this endpoint takes {' or '.join(scopes)} tokens: "
            f"use one issued with `manage.py create_api_token --scope {scopes[0]}`",
            status=403,
            detail={"token_scope": token.scope, "accepted_scopes": list(scopes)},
        )


def token_revoke(*, name: str, actor: Actor) -> ApiToken:
    """Revoke the token called `name`: it stops authenticating at once. ValueError if unknown or already revoked."""
    now = timezone.now()
    with transaction.atomic():
        token = ApiToken.objects.filter(name=name).first()
        if token is None:
            raise ValueError(f"no API token named {name!r}")
        if not ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now):
            raise ValueError(f"the API token {name!r} was already revoked")
        token.revoked_at = now
        append_event(
            action=AuditAction.API_TOKEN_REVOKED,
            actor=actor,
            reason="revoked",
            evidence={"name": token.name, "prefix": token.prefix},
        )
    return token

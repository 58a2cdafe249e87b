"""The console's 403, 404 and 500 pages, in its layout (docs/console.md, "Error pages and the favicon").
Django's technical pages only with RECOVERY_TECHNICAL_ERRORS=1 (console.middleware.ConsoleErrorPagesMiddleware).
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.views.common import nav_counts
from recovery.models.roles import ROLE_PERMISSIONS, ROLES

log = logging.getLogger(__name__)

TITLES = {403: "Not allowed", 404: "Page not found", 500: "Something went wrong"}


def _page(request: HttpRequest, status: int, context: dict) -> HttpResponse:
    context = {"status": status, "title": TITLES[status], "path": request.path, **context}
    try:
        if getattr(request, "user", None) is not None and request.user.is_authenticated:
            context["counts"] = nav_counts()
        response = render(request, "console/error.html", context, status=status)
    except Exception:  # the database may be what failed: a plain page rather than none
        log.exception("the %s page could not be drawn", status)
        response = HttpResponse(f"{status} {TITLES[status]}\n", status=status, content_type="text/plain")
    response.console_error_page = True
    return response


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    permission = str(exception.args[0]) if exception is not None and exception.args else ""
    needed = [role for role in ROLES if permission in ROLE_PERMISSIONS[role]]
    user = getattr(request, "user", None)
    held = sorted(user.groups.values_list("name", flat=True)) if user is not None and user.is_authenticated else []
    return _page(request, 403, {"needed": _either(needed), "held": ", ".join(held)})


def _either(names: list[str]) -> str:
    """ "approver"; "reviewer or approver"; "viewer, reviewer, approver or admin"."""
    return " or ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _page(request, 404, {})


def server_error(request: HttpRequest) -> HttpResponse:
    return _page(request, 500, {})  # a page that cannot be drawn falls back to plain text (_page)

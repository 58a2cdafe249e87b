"""Request middleware: the API's edge (one JSON error envelope, bounded bodies) and htmx requests of an ended
session sent to sign-in as a whole page."""

import sys
from functools import partialmethod
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.core.signals import got_request_exception
from django.http import HttpResponse
from django.utils.module_loading import import_string

from recovery.api.errors import error_response, exception_response, request_id, status_response
from recovery.api.versions import HEADER as API_VERSION_HEADER
from recovery.api.versions import api_version, refuse_old_client

API_PREFIX = "/api/"
API_DOCS = "/api/v1/docs"  # the API's one HTML page (Swagger UI): a page, with the pages' headers


class ApiEdgeMiddleware:
    """First in the chain for everything under /api/ (docs/api.md): every answer carries X-Request-Id and the API's
    version (Recovery-Api-Version, recovery/api/versions.py); a recovery-console-client older than the oldest served
    is refused (426) before anything else; a body over RECOVERY_API_MAX_BODY is refused (413) before anything reads
    it; a body shorter than its Content-Length — a client that gave up half-way — is refused (400) instead of being
    processed as if whole; and any answer that is not JSON (Django's own 404 for an unknown URL, its error pages for
    an exception raised outside the API's handlers, DEBUG's technical pages) is replaced by the API's error envelope,
    so a runtime parses one format."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path_info.startswith(API_PREFIX):
            return self.get_response(request)
        rid = request_id(request)
        response = refuse_old_client(request) or _refuse_body(request) or self.get_response(request)
        if response.status_code >= 400 and not response.get("Content-Type", "").startswith("application/json"):
            raised = getattr(request, "_api_exception", None)
            response = exception_response(request, raised) if raised else status_response(request, response.status_code)
        response["X-Request-Id"] = rid
        response[API_VERSION_HEADER] = api_version()
        return response


def _refuse_body(request):
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return error_response(400, "bad_request", "Content-Length must be a whole number of bytes")
    limit = settings.RECOVERY_API_MAX_BODY
    if length > limit:
        return error_response(413, "body_too_large", f"the request body is over {limit} bytes", detail={"limit": limit})
    if length <= 0:
        return None
    try:
        received = len(request.body)
    except OSError:  # the client went away while the body was read (UnreadablePostError)
        received = -1
    if received < length:
        return error_response(
            400,
            "incomplete_body",
            f"the body ended after {max(received, 0)} of the {length} bytes its Content-Length announced: "
            "nothing was processed; send the whole request again",
            detail={"content_length": length, "received": max(received, 0)},
        )
    return None


def _remember_exception(sender, request=None, **kwargs):
    # Django turns an exception raised outside the API's handlers (in a middleware, say) into its HTML 500 page;
    # this keeps the exception so ApiEdgeMiddleware can answer it as the envelope says (503 for the database).
    if request is not None and request.path_info.startswith(API_PREFIX):
        request._api_exception = sys.exc_info()[1]


got_request_exception.connect(_remember_exception, dispatch_uid="recovery-api-exception")


class HtmxSignInRedirectMiddleware:
    """An htmx request whose session ended gets the sign-in page as a whole-page redirect (HX-Redirect), instead of
    htmx swapping the sign-in form into a table row or the navigation."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            getattr(request, "htmx", False)
            and response.status_code == 302
            and response.get("Location", "").startswith(settings.LOGIN_URL)
        ):
            current = request.headers.get("HX-Current-URL", "")
            target = (
                f"{settings.LOGIN_URL}?{urlencode({'next': _local_path(current)})}" if current else settings.LOGIN_URL
            )
            redirect = HttpResponse(status=204)
            redirect["HX-Redirect"] = target
            return redirect
        return response


def _local_path(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class ConsoleErrorPagesMiddleware:
    """With DEBUG on (`make run`), Django answers a missing page or an uncaught exception with its technical pages —
    every URL pattern, a traceback with settings. Outside the API, this puts the console's own 404 and 500 pages in
    their place unless RECOVERY_TECHNICAL_ERRORS is set (a developer's explicit choice). With DEBUG off Django calls
    the console's handlers itself (console/urls.py), and this does nothing."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            settings.DEBUG
            and not settings.RECOVERY_TECHNICAL_ERRORS
            and response.status_code in (404, 500)
            and not getattr(response, "console_error_page", False)
            and not request.path_info.startswith(API_PREFIX)
            and response.get("Content-Type", "").startswith("text/html")
        ):
            from console.views import errors

            return errors.not_found(request) if response.status_code == 404 else errors.server_error(request)
        return response


def _api_call(request) -> bool:
    path = request.path_info
    return path.startswith(API_PREFIX) and not path.startswith(API_DOCS)


def _pages_only(path: str) -> type:
    """A middleware of the console's pages (sessions, signed-in users, messages, CSP, htmx) made to skip the
    API's calls: a runtime's request carries a bearer token and takes JSON, and none of them has anything to do
    there, while each cost a share of every API request's time (docs/benchmarks.md, the protected benchmark's fifth
    round). A subclass of the middleware itself (Django's checks still find it); its hooks (process_view,
    process_exception, process_template_response) run for pages only."""
    base = import_string(path)

    def __call__(self, request):
        return self.get_response(request) if _api_call(request) else base.__call__(self, request)

    body = {"__call__": __call__, "__module__": __name__, "__doc__": f"{path}, for the console's pages only."}
    for hook in ("process_view", "process_exception", "process_template_response"):
        method = getattr(base, hook, None)
        if method is not None:
            body[hook] = partialmethod(_page_hook, method)
    return type(f"PagesOnly{base.__name__}", (base,), body)


def _page_hook(self, method, request, *args):
    return None if _api_call(request) else method(self, request, *args)


PagesOnlySessionMiddleware = _pages_only("django.contrib.sessions.middleware.SessionMiddleware")
PagesOnlyAuthenticationMiddleware = _pages_only("django.contrib.auth.middleware.AuthenticationMiddleware")
PagesOnlyMessageMiddleware = _pages_only("django.contrib.messages.middleware.MessageMiddleware")
PagesOnlyCSPMiddleware = _pages_only("csp.middleware.CSPMiddleware")
PagesOnlyHtmxMiddleware = _pages_only("django_htmx.middleware.HtmxMiddleware")

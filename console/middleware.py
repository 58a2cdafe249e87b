"""Request middleware: oversized API bodies refused before anything reads them (SPEC §16: 413, nothing stored),
and htmx requests of an ended session sent to sign-in as a whole page."""

from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.http import HttpResponse, JsonResponse


class ApiBodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > settings.RECOVERY_API_MAX_BODY:
                return JsonResponse(
                    {
                        "error": {
                            "code": "body_too_large",
                            "message": f"the request body is over {settings.RECOVERY_API_MAX_BODY} bytes",
                            "field_errors": [],
                            "detail": {"limit": settings.RECOVERY_API_MAX_BODY},
                        }
                    },
                    status=413,
                )
        return self.get_response(request)


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

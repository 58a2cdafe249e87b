"""Refuse oversized API bodies before anything reads them (SPEC §16: 413, nothing stored)."""

from django.conf import settings
from django.http import JsonResponse


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

"""`/metrics`: docs/metrics.md's metrics as Prometheus text, for a bearer token (its tenants) or a signed-in role.
A token header decides whatever session comes with it; no credentials or a bad token answer 401, never a redirect.
GET only, and exempt from CSRF: it changes nothing.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from console.views.common import VIEW
from recovery.api.prometheus import scrape
from recovery.selectors.metrics import tools_of_tenants
from recovery.services.tokens import token_authenticate

REALM = 'Bearer realm="recovery-console"'


@csrf_exempt
@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, raw = header.partition(" ")
        token = token_authenticate(raw.strip()) if scheme.lower() == "bearer" else None
        if token is None:
            return _refused(401, "the token is not a valid, unrevoked API token", error="invalid_token")
        tenants = list(token.tenant_list)  # read with the token: no statement
        tools = tools_of_tenants(tenants)
        visible = None if any(tenant.all_tools for tenant in tenants) else set(tools.values_list("id", flat=True))
        body = scrape(now=timezone.now(), tenant_ids=tuple(sorted(token.tenant_ids)), tools=visible)
    elif not request.user.is_authenticated:
        return _refused(401, "send an API token (Authorization: Bearer <token>) or sign in to the console")
    elif not request.user.has_perm(VIEW):
        return HttpResponse("this account has no console role\n", status=403, content_type="text/plain")
    else:
        body = scrape(now=timezone.now())
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


def _refused(status: int, message: str, *, error: str = "") -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain")
    response["WWW-Authenticate"] = f'{REALM}, error="{error}"' if error else REALM
    return response


# Included at the top of console/urls.py as "metrics": the exact path Prometheus scrapes by default.
urlpatterns = [path("", metrics, name="prometheus-metrics")]

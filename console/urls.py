from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path

from console.forms import ThrottledAdminSignInForm
from console.views import (
    actions,
    approvals,
    audit,
    auth,
    bulk,
    calls,
    metrics,
    notifications,
    operations,
    overview,
    queues,
    tasks,
)
from recovery.api.routes import api

console_patterns = [
    path("", queues.home, name="home"),
    path("queues/counts/", queues.counts, name="counts"),
    path("queues/<slug:slug>/", queues.queue, name="queue"),
    path("calls/<int:call_id>/claim/", queues.claim, name="claim"),
    path("calls/<int:call_id>/release/", queues.release, name="release"),
    path("calls/<int:call_id>/assign/", queues.assign, name="assign"),
    *calls.urlpatterns,
    *tasks.urlpatterns,
    *overview.urlpatterns,
    *metrics.urlpatterns,
    *audit.urlpatterns,
    *operations.urlpatterns,
    *actions.urlpatterns,
    *bulk.urlpatterns,
    *approvals.urlpatterns,
    *notifications.urlpatterns,
]


def favicon(request):
    """Browsers and tools that ask for /favicon.ico without reading the page's icon link."""
    return HttpResponsePermanentRedirect(static("console/favicon.svg"))


admin.site.login_form = ThrottledAdminSignInForm  # the admin's door is throttled like the console's

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("metrics", include("console.views.prometheus")),  # Prometheus text (docs/metrics.md): token or role protected
    path("favicon.ico", favicon),
    path("sign-in/", auth.SignInView.as_view(), name="sign-in"),
    path("sign-out/", auth_views.LogoutView.as_view(next_page="sign-in"), name="sign-out"),
    path("", include((console_patterns, "console"))),
]

handler403 = "console.views.errors.forbidden"
handler404 = "console.views.errors.not_found"
handler500 = "console.views.errors.server_error"

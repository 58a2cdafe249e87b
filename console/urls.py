from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from console import views
from console.forms import ThrottledAdminSignInForm
from recovery.api import api

console_patterns = [
    path("", views.home, name="home"),
    path("queues/counts/", views.counts, name="counts"),
    path("queues/<slug:slug>/", views.queue, name="queue"),
    path("calls/<int:call_id>/claim/", views.claim, name="claim"),
    path("calls/<int:call_id>/release/", views.release, name="release"),
]

admin.site.login_form = ThrottledAdminSignInForm  # the admin's door is throttled like the console's

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("sign-in/", views.SignInView.as_view(), name="sign-in"),
    path("sign-out/", auth_views.LogoutView.as_view(next_page="sign-in"), name="sign-out"),
    path("", include((console_patterns, "console"))),
]

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from recovery.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]

from django.contrib import admin
from django.urls import path

from novelforge_sessions import health
from novelforge_sessions.api import api

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
]

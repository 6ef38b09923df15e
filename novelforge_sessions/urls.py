from functools import cache
from pathlib import Path

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.decorators.http import require_safe

from novelforge_sessions import health, metrics
from novelforge_sessions.dashboard import language, notifications
from novelforge_sessions.routers import api

# A page that fails on the database answers 503 in plain words (novelforge_sessions.unavailable).
handler500 = "novelforge_sessions.unavailable.server_error"
# Below /api/, a Host outside ALLOWED_HOSTS is the typed disallowed_host (server/hosts.py).
handler400 = "novelforge_sessions.server.hosts.bad_request"



@cache
def _favicon_bytes() -> bytes:
    return (Path(settings.STATICFILES_DIRS[0]) / "favicon.ico").read_bytes()


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which every browser asks for: the static icon (static/favicon.ico)."""
    return HttpResponse(_favicon_bytes(), content_type="image/x-icon", headers={"Cache-Control": "public, max-age=86400"})


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # Prometheus; off (404) unless METRICS_TOKEN or METRICS_ALLOW_IPS is set (metrics.py).
    path("metrics", metrics.view, name="metrics"),
    path("login/", language.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # the language switcher (base.html) posts here (docs/pages.md#language)
    path("i18n/setlang/", language.set_language, name="set_language"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("reviews/", include("reviews.urls")),
    # Each person's notification emails on or off (docs/notifications.md).
    path("notifications/", notifications.preferences, name="notifications"),
    path("", include("novelforge_sessions.dashboard.urls")),
]

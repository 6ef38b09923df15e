from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from novelforge_sessions import health, metrics
from novelforge_sessions.dashboard import notifications
from novelforge_sessions.routers import api

# A page that fails on the database answers 503 in plain words (novelforge_sessions.unavailable).
handler500 = "novelforge_sessions.unavailable.server_error"
# Below /api/, a Host outside ALLOWED_HOSTS is the typed disallowed_host (server/hosts.py).
handler400 = "novelforge_sessions.server.hosts.bad_request"

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # Prometheus; off (404) unless METRICS_TOKEN or METRICS_ALLOW_IPS is set (metrics.py).
    path("metrics", metrics.view, name="metrics"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("reviews/", include("reviews.urls")),
    # Each person's notification emails on or off (docs/notifications.md).
    path("notifications/", notifications.preferences, name="notifications"),
    path("", include("novelforge_sessions.dashboard.urls")),
]

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.utils import timezone
from django.views.decorators.http import last_modified
from django.views.i18n import JavaScriptCatalog

from novelforge_sessions import health, metrics
from novelforge_sessions.dashboard import language
from novelforge_sessions.routers import api

# A page that fails on the database answers 503 in plain words (novelforge_sessions.unavailable).
handler500 = "novelforge_sessions.unavailable.server_error"
# Below /api/, a Host outside ALLOWED_HOSTS is the typed disallowed_host (server/hosts.py).
handler400 = "novelforge_sessions.server.hosts.bad_request"

# The scripts' translations (djangojs catalogs): the same until the server restarts, so browsers
# revalidate them with If-Modified-Since instead of downloading them again (Django's own advice).
_STARTED = timezone.now()
_javascript_catalog = last_modified(lambda request, **kw: _STARTED)(JavaScriptCatalog.as_view(packages=[]))

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # Prometheus; off (404) unless METRICS_TOKEN or METRICS_ALLOW_IPS is set (metrics.py).
    path("metrics", metrics.view, name="metrics"),
    path("login/", language.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # the language switcher (base.html) posts here; JS strings of the pages come from jsi18n/
    path("i18n/setlang/", language.set_language, name="set_language"),
    path("i18n/js/", _javascript_catalog, name="javascript-catalog"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("reviews/", include("reviews.urls")),
    path("", include("novelforge_sessions.dashboard.urls")),
]

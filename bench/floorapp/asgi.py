"""The floor's ASGI entry, built exactly as ``novelforge_sessions/asgi.py`` builds ours.

Same wrapping, same order: the server patches (``novelforge_sessions.server.install()``: under
daphne, body limits while the body arrives, access-log redaction, the SIGTERM drain, autobahn's
memoised frame text), then ``pgnotify.ListenerStart`` around ``BodyLimitMiddleware`` around
``LeanApiApplication`` (the floor's endpoint lives under ``/api/v1/`` so it takes the lean path,
as the checkpoint route does), and ``gc.freeze()`` last. Only the URLconf differs
(``floorapp.settings``): the floor is slower or faster than ours only because of what its view does.
"""
import gc
import os

from django.core.asgi import get_asgi_application

from novelforge_sessions import bodylimit, server

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "floorapp.settings")
server.install()
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from novelforge_sessions.api.asgi import LeanApiApplication  # noqa: E402
from novelforge_sessions.live import pgnotify  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": pgnotify.ListenerStart(
            bodylimit.BodyLimitMiddleware(LeanApiApplication(django_asgi_app) if settings.API_LEAN else django_asgi_app)
        ),
    }
)

gc.freeze()

"""The floor's ASGI entry, built exactly as ``novelforge_sessions/asgi.py`` builds ours.

Same wrapping, same order: the daphne patches (access-log redaction, body limits while Twisted
receives, the drain on SIGTERM, Twisted's memoised Content-Type parse and dropped duplicate log
line, autobahn's memoised frame text), then ``pgnotify.ListenerStart`` around
``BodyLimitMiddleware`` around ``LeanApiApplication`` (the floor's endpoint lives under
``/api/v1/`` so it takes the lean path, as the checkpoint route does), and ``gc.freeze()`` last.
Only the URLconf differs (``floorapp.settings``): the floor is slower or faster than ours only
because of what its view does.
"""
import gc
import os

from django.core.asgi import get_asgi_application

from novelforge_sessions import bodylimit, logredact

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "floorapp.settings")
logredact.install()
bodylimit.install()
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from novelforge_sessions.api.asgi import LeanApiApplication, cache_twisted_content_type, drop_twisted_request_log  # noqa: E402
from novelforge_sessions.live import pgnotify, shutdown  # noqa: E402
from novelforge_sessions.live.wsframes import memoise_autobahn_hltype  # noqa: E402

shutdown.install()
cache_twisted_content_type()
drop_twisted_request_log()
memoise_autobahn_hltype()

application = ProtocolTypeRouter(
    {
        "http": pgnotify.ListenerStart(
            bodylimit.BodyLimitMiddleware(LeanApiApplication(django_asgi_app) if settings.API_LEAN else django_asgi_app)
        ),
    }
)

gc.freeze()

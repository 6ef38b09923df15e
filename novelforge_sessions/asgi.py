"""ASGI entry point: HTTP through Django, websockets through Channels.

HTTP is wrapped, outermost, in ``BodyLimitMiddleware``: a body over its route's limit gets a
413 while it streams in, before Django (or anything) buffers it; under daphne, which reads
whole bodies before it calls any application, the same limits are applied inside daphne's
request as the body arrives (``novelforge_sessions.server``).

Under daphne, ``server.install()`` first checks the installed daphne, Twisted and autobahn
against the versions its patches were tested with (any other refuses to start), then applies
them all: body limits while the body arrives, tokens redacted from daphne's access log, the
SIGTERM drain, autobahn's per-frame debug text memoised (``novelforge_sessions/server/patches.py``).

Websockets are wrapped, outermost first, in ``SameOriginValidator`` (a page from a foreign
Origin — another host, scheme or port — cannot open a socket with the manager's cookie: the
handshake is refused; ``novelforge_sessions.live.origins``), ``RawSendMiddleware`` (the
server's own ``send`` kept in the scope, so the stream's frames skip the session wrapper of
``send``, which acts on HTTP responses only) and ``AuthMiddlewareStack`` (the Django session
cookie becomes ``scope["user"]``). Agents present a bearer token instead; the consumer checks it
(``novelforge_sessions.live.consumers``). The API socket (``/ws/api/``, ``api/socket.py``: the API's
requests as frames) is served inside the Origin check and outside the session stack: its
requests run on the lean path's threads, which HTTP's ``/api/v1/`` uses too.

With ``OTEL_*`` tracing asked for (``novelforge_sessions.tracing``), the whole application is
wrapped, outermost, in OpenTelemetry's ASGI instrumentation; without it nothing is.

Last, the URLconf and the API socket's routes are built (not left to the first request), and
everything built so far is frozen out of the garbage collector's reach (``gc.freeze``); the
collector's thresholds are raised for a server's many connections (``GC_THRESHOLDS``).
"""
import gc
import os
from importlib import import_module

from django.core.asgi import get_asgi_application

from novelforge_sessions import bodylimit
from novelforge_sessions import server
from novelforge_sessions import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "novelforge_sessions.settings")
server.install()  # under daphne only: every server patch, version-checked, in one place
tracing.setup()  # OpenTelemetry, only when the OTEL_* environment asks for it (off: nothing imported)
# Build the Django app before importing anything that touches models: a model imported before the
# app registry is ready raises AppRegistryNotReady.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from novelforge_sessions.live.origins import SameOriginValidator  # noqa: E402
from novelforge_sessions.live.routing import websocket_urlpatterns  # noqa: E402
from novelforge_sessions.live import pgnotify  # noqa: E402
from novelforge_sessions.live.consumers import RawSendMiddleware  # noqa: E402
from novelforge_sessions.api.asgi import LeanApiApplication  # noqa: E402
from novelforge_sessions.api import socket as api_socket  # noqa: E402
from django.conf import settings  # noqa: E402

# The lean path's handler and threads: /api/v1/ over HTTP (with API_LEAN) and the API socket's
# requests (api/socket.py) both run on them.
lean_api = LeanApiApplication(django_asgi_app)

# With tracing on (tracing.setup above), everything is wrapped, outermost, in the ASGI
# instrumentation: one server span per request and per websocket; off, nothing is wrapped.
application = tracing.asgi(ProtocolTypeRouter(
    {
        # Bodies bounded while they stream (outermost); then /api/v1/ through the lean path (one
        # hop into a fixed pool, persistent connections, API_MIDDLEWARE only) and everything else
        # through Django's handler (settings.API_LEAN). The first request starts the process's
        # NOTIFY listener (live/pgnotify.py: a lone server then sends no NOTIFY).
        "http": pgnotify.ListenerStart(
            bodylimit.BodyLimitMiddleware(lean_api if settings.API_LEAN else django_asgi_app)
        ),
        # RawSendMiddleware: the stream's frames skip the session wrapper of send (live/consumers.py).
        # The API socket (api/socket.py) inside the Origin check, its requests on the lean path's threads.
        "websocket": SameOriginValidator(api_socket.Route(
            lean_api, RawSendMiddleware(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        )),
    }
))

# The URLconf (and through it every API route and its schemas) and the API socket's fast routes are
# built now rather than by the first request, which would wait for them (about half a second on a
# 2-core machine) and leave them outside the freeze below.
import_module(settings.ROOT_URLCONF)
api_socket.fast_routes()

# Everything imported and built up to here (Django, the apps, the URLconf, the API's schemas:
# a large heap) lives as long as the process. Left to the collector, every full collection would
# scan all of it, with every request and websocket frame of the process waiting; frozen, a full
# collection scans only what requests allocate. The price: a frozen object that later becomes
# cyclic garbage is never reclaimed, and what is alive at start-up is the process's code and
# configuration, which stays anyway.
gc.freeze()

#: The collector's thresholds in a server (``gc.set_threshold``): a young collection every 10,000
#: net allocations of containers instead of every 700. At the default, the objects of the requests
#: in flight were promoted so often that a full collection came every few seconds, walking every
#: connection's objects with the whole process stopped: with 800 agents and 50 dashboards
#: connected, about 80 ms every 8 s, and the p99 of their requests was 90-150 ms. With these, no
#: full collection came in a 30-second hold and the p99 was 34-54 ms (docs/performance.md).
GC_THRESHOLDS = (10_000, 10, 10)
gc.set_threshold(*GC_THRESHOLDS)

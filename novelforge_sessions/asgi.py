"""ASGI entry point: HTTP through Django, websockets through Channels."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "novelforge_sessions.settings")
# Build the Django app before importing anything that touches models (PITFALLS.md).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

application = ProtocolTypeRouter({"http": django_asgi_app})

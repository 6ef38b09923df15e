"""Django's own ASGI handler (what a bare django-ninja project is served with)."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "floorapp.settings")
application = get_asgi_application()

"""Websocket routes (mounted by ``novelforge_sessions.asgi``)."""
from django.urls import path

from novelforge_sessions.live.consumers import EventStreamConsumer

websocket_urlpatterns = [
    path("ws/events/", EventStreamConsumer.as_asgi()),
]

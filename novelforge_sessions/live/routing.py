"""Websocket routes (mounted by ``novelforge_sessions.asgi``)."""
from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from novelforge_sessions.live.consumers import EventStreamConsumer


class UnknownPath(AsyncWebsocketConsumer):
    """Any other websocket path: the handshake is refused (HTTP 403), never a 500 with a
    traceback (Channels' router raises for a path it has no route for, and that error names
    the path: a token put in it reached the log)."""

    channel_layer_alias = None  # no layer channel for a socket that is never accepted

    async def connect(self) -> None:
        await self.close()


websocket_urlpatterns = [
    path("ws/events/", EventStreamConsumer.as_asgi()),
    re_path(r"", UnknownPath.as_asgi()),
]

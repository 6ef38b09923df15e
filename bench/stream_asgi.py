"""The project's ASGI application plus one bench-only route, ``/ws/bare/``: a bare Channels
consumer that joins the group ``bench.bare`` and sends each group message's text as it comes.
It is the floor ``bench/stream.py`` compares the event stream against, on the same server."""
from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer

from novelforge_sessions.asgi import application as project_application

BARE_GROUP = "bench.bare"


class BareConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.channel_layer.group_add(BARE_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(BARE_GROUP, self.channel_name)

    async def bench_event(self, message: dict) -> None:
        await self.send(text_data=message["text"])


_bare = BareConsumer.as_asgi()


async def application(scope, receive, send):
    if scope["type"] == "websocket" and scope.get("path") == "/ws/bare/":
        return await _bare(scope, receive, send)
    return await project_application(scope, receive, send)

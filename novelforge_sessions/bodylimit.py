"""Request bodies over the limit are refused while they stream in, before anything buffers them.

The limits (settings, from the environment):

- ``/api/…``: ``API_MAX_BODY_BYTES`` (default 256 KiB) → ``413`` with the typed error
  ``payload_too_large`` (``details``: ``limit`` and ``size``, the declared length or the bytes
  received when the body was refused);
- every other route (pages, login, admin, static): ``PAGE_MAX_BODY_BYTES`` (default 2.5 MiB,
  Django's own form limit) → a plain-text ``413``.

A body is refused as soon as it is known to be too large: at once when its ``Content-Length``
says so (nothing of the body is read), else (``Transfer-Encoding: chunked``) when the bytes
received pass the limit. What the server holds for one request is therefore bounded by the
limit, whatever the client sends. Two layers do it:

1. :class:`BodyLimitMiddleware`, the outermost ASGI layer of the HTTP application
   (``novelforge_sessions.asgi``): any ASGI server that streams the body (uvicorn, hypercorn)
   hands it over in pieces with back-pressure; the middleware reads at most ``limit`` bytes
   before Django sees the request, and answers 413 without calling Django when the body is
   over. It replaces the former sync-only Django middleware (which split the async middleware
   chain into thread hops and could only look at ``Content-Length``).
2. Under daphne, that is not enough: daphne's Twisted request reads the *whole* body (into a
   temporary file) before it calls the application at all. ``novelforge_sessions.server``
   (``http.py``, installed with the other server patches by ``server.patches.install``) makes
   daphne build a request that checks the same limits (:func:`limit_for`, :func:`refusal`)
   while the body arrives, and answers the same 413 without calling the application.

Websocket frames have their own limits (``novelforge_sessions.live.consumers``) and are not
affected: an upgrade request has no body.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_api(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def limit_for(path: str) -> int:
    """The largest body accepted on ``path`` (a decoded path, without the query string)."""
    from django.conf import settings

    return settings.API_MAX_BODY_BYTES if is_api(path) else settings.PAGE_MAX_BODY_BYTES


def refusal(path: str, *, size: int, limit: int, declared: bool) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The 413's headers and body: the typed error on the API, plain text elsewhere."""
    if is_api(path):
        from novelforge_sessions.errors import PayloadTooLarge

        message = (
            f"the body is {size} bytes; at most {limit}" if declared
            else f"the body is over {limit} bytes (refused after {size})"
        )
        body = json.dumps(PayloadTooLarge(message, size=size, limit=limit).as_dict()).encode()
        content_type = b"application/json"
    else:
        body = f"413 Content Too Large: request bodies are at most {limit} bytes here.\n".encode()
        content_type = b"text/plain; charset=utf-8"
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"cache-control", b"no-store"),
        (b"connection", b"close"),
    ]
    return headers, body


def declared_length(headers: list[tuple[bytes, bytes]] | Any) -> int | None:
    """The request's ``Content-Length``, or None (absent or malformed: the server's business)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimitMiddleware:
    """ASGI: refuse an HTTP body over :func:`limit_for` before the application reads it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "/")
        limit = limit_for(path)
        length = declared_length(scope.get("headers") or [])
        if length is not None and length > limit:
            await self._refuse(send, path, size=length, limit=limit, declared=True)
            return
        # Read the body (at most ``limit`` bytes) before the application: Django reads all of
        # it before its view runs anyway, so this holds no more than Django would.
        messages: list[Message] = []
        received = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":  # http.disconnect: the client is gone
                break
            received += len(message.get("body", b""))
            if received > limit:
                await self._refuse(send, path, size=received, limit=limit, declared=False)
                return
            if not message.get("more_body", False):
                break
        pending = iter(messages)

        async def replay() -> Message:
            for message in pending:
                return message
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Send, path: str, *, size: int, limit: int, declared: bool) -> None:
        headers, body = refusal(path, size=size, limit=limit, declared=declared)
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

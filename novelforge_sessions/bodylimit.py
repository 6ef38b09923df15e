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
   temporary file) before it calls the application at all, then queues all of it at once
   (a 100 MB chunked ``POST /login/`` raised the server's memory by ~100 MB). :func:`install`
   (called by ``asgi.py`` when daphne loads it, like the shutdown drain) makes daphne build
   :class:`LimitedWebRequest` instead of its ``WebRequest``: the limit is checked in
   ``gotLength`` (the declared length, before any body byte) and in ``handleContentChunk``
   (every chunk, as it arrives); over it, the 413 is written at once, the rest of the body is
   read and discarded (never stored) for at most :data:`LINGER_SECONDS` so the client can read
   the answer, and the connection is closed. The application is never called.

Websocket frames have their own limits (``novelforge_sessions.live.consumers``) and are not
affected: an upgrade request has no body.
"""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

logger = logging.getLogger(__name__)

#: How long a refused connection keeps reading (and discarding) what the client still sends,
#: so that a client writing its body before it reads sees the 413 rather than a reset.
LINGER_SECONDS = 2.0

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


# --- daphne -------------------------------------------------------------------------------------

def install() -> bool:
    """Under daphne, refuse oversized bodies while Twisted receives them; idempotent."""
    server_module = sys.modules.get("daphne.server")
    if server_module is None:  # not under daphne (uvicorn, tests, management commands)
        return False
    factory = _limited_factory()
    # daphne's Server.run() builds ``HTTPFactory(self)`` by this module-level name.
    server_module.HTTPFactory = factory
    return True


_FACTORY: type | None = None


def _limited_factory() -> type:
    global _FACTORY
    if _FACTORY is None:
        _FACTORY = _build_daphne_classes()
    return _FACTORY


def _build_daphne_classes() -> type:
    from urllib.parse import unquote

    from daphne.http_protocol import HTTPFactory, WebRequest

    class LimitedWebRequest(WebRequest):
        """daphne's request, with the body limit applied while the body arrives."""

        _nf_limit: int | None = None
        _nf_path = "/"
        _nf_received = 0
        _nf_refused = False

        def gotLength(self, length: int | None) -> None:  # noqa: N802 - Twisted's name
            # The request line is parsed (the channel holds its target); the headers are in.
            target = getattr(self.channel, "_path", b"/") or b"/"
            try:
                self._nf_path = unquote(target.split(b"?", 1)[0].decode("ascii"))
            except UnicodeDecodeError:
                self._nf_path = "/"
            self._nf_limit = limit_for(self._nf_path)
            super().gotLength(length)
            if length is not None and length > self._nf_limit:
                # Twisted sends "100 Continue" right after this call when asked: not now.
                self.requestHeaders.removeHeader(b"expect")
                self._nf_refuse(size=length, declared=True)

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802
            if self._nf_refused:
                return
            self._nf_received += len(data)
            if self._nf_limit is not None and self._nf_received > self._nf_limit:
                self._nf_refuse(size=self._nf_received, declared=False)
                return
            super().handleContentChunk(data)

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:  # noqa: N802
            if self._nf_refused:  # the whole (discarded) body arrived within the linger
                return
            super().requestReceived(command, path, version)

        def _nf_refuse(self, *, size: int, declared: bool) -> None:
            from twisted.internet import reactor

            self._nf_refused = True
            channel, transport = self.channel, self.channel.transport
            headers, body = refusal(self._nf_path, size=size, limit=self._nf_limit or 0, declared=declared)
            head = b"HTTP/1.1 413 Content Too Large\r\n" + b"".join(
                name + b": " + value + b"\r\n" for name, value in headers
            )
            answer = head + b"\r\n" + body
            transport.write(answer)
            # From here on the channel discards what arrives (nothing is parsed or stored);
            # the write side is closed once the answer is flushed, the connection after the linger.
            channel.dataReceived = _discard
            channel.persistent = False
            half_close = getattr(transport, "loseWriteConnection", None)
            if half_close is not None:
                half_close()
            else:
                transport.loseConnection()
            reactor.callLater(LINGER_SECONDS, transport.loseConnection)
            self.content.close()
            self._nf_log(len(answer))

        def _nf_log(self, sent: int) -> None:
            """daphne's access-log line for the refusal (redacted like every other)."""
            try:
                peer = self.channel.transport.getPeer()
                client = f"{peer.host}:{peer.port}"
            except Exception:  # a transport without a peer (UNIX socket): no client column
                client = None
            method = (getattr(self.channel, "_command", b"") or b"").decode("ascii", "replace")
            target = (getattr(self.channel, "_path", b"") or b"").decode("ascii", "replace")
            self.server.log_action("http", "complete", {
                "path": target, "status": 413, "method": method, "client": client,
                "time_taken": 0.0, "size": sent,
            })

    class LimitedHTTPFactory(HTTPFactory):
        def buildProtocol(self, addr: Any) -> Any:  # noqa: N802
            protocol = super().buildProtocol(addr)
            protocol.requestFactory = LimitedWebRequest
            return protocol

    LimitedHTTPFactory.request_class = LimitedWebRequest
    return LimitedHTTPFactory


def _discard(data: bytes) -> None:
    """A refused connection's incoming bytes: dropped."""

"""daphne's HTTP request and factory, subclassed: body limits while the body arrives, no form parse, no second log.

daphne reads the *whole* body of a request (into a temporary file) before it calls the
application, then queues all of it at once (a huge chunked ``POST`` would grow the server's memory by
its whole size), so the ASGI ``BodyLimitMiddleware`` (``novelforge_sessions.bodylimit``)
comes too late under daphne. :class:`LimitedWebRequest` applies the same limits inside daphne's
request: in ``gotLength`` (the declared length, before any body byte) and in
``handleContentChunk`` (every chunk, as it arrives); over it, the 413 is written at once, the
rest of the body is read and discarded (never stored) for at most :data:`LINGER_SECONDS` so the
client can read the answer, and the connection is closed. The application is never called.

Two more things, through Twisted's public hooks rather than by replacing its functions:

- the request is built with ``parsePOSTFormSubmission=False`` (``twisted.web.http.Request``'s
  own switch): Twisted otherwise parses a POST's Content-Type with the ``email`` package (costly,
  on every POST) and a form body into
  ``request.args``, which daphne never reads (it hands the raw body to the application);
- :meth:`LimitedHTTPFactory.log` writes nothing: Twisted's own access line was formatted for
  every request and routed to the ``daphne.server`` logger at INFO, below the level
  ``settings.LOGGING`` gives ``daphne``, so it was built and dropped. daphne's own access log
  (``AccessLogGenerator``, redacted: ``server/patches.py``) is the access log.

``server.patches.install`` makes daphne's ``Server.run`` build :class:`LimitedHTTPFactory`
(it builds ``HTTPFactory(self)`` by its module-level name).
"""
from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from daphne.http_protocol import HTTPFactory, WebRequest

from novelforge_sessions.bodylimit import limit_for, refusal

#: How long a refused connection keeps reading (and discarding) what the client still sends,
#: so that a client writing its body before it reads sees the 413 rather than a reset.
LINGER_SECONDS = 2.0


def _discard(data: bytes) -> None:
    """A refused connection's incoming bytes: dropped."""


class LimitedWebRequest(WebRequest):
    """daphne's request, with the body limit applied while the body arrives."""

    nf_limit: int | None = None
    nf_path = "/"
    nf_received = 0
    nf_refused = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["parsePOSTFormSubmission"] = False  # daphne never reads request.args
        super().__init__(*args, **kwargs)

    def gotLength(self, length: int | None) -> None:  # noqa: N802 - Twisted's name
        # The request line is parsed and the headers are in, but Twisted gives the request its
        # method and target only in requestReceived, after the body: the channel holds them
        # until then (its ``_path``; HTTPChannel.lineReceived is in the patch's source hashes).
        target = getattr(self.channel, "_path", b"/") or b"/"
        try:
            self.nf_path = unquote(target.split(b"?", 1)[0].decode("ascii"))
        except UnicodeDecodeError:
            self.nf_path = "/"
        self.nf_limit = limit_for(self.nf_path)
        super().gotLength(length)
        if length is not None and length > self.nf_limit:
            # Twisted sends "100 Continue" right after this call when asked: not now.
            self.requestHeaders.removeHeader(b"expect")
            self.nf_refuse(size=length, declared=True)

    def handleContentChunk(self, data: bytes) -> None:  # noqa: N802
        if self.nf_refused:
            return
        self.nf_received += len(data)
        if self.nf_limit is not None and self.nf_received > self.nf_limit:
            self.nf_refuse(size=self.nf_received, declared=False)
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:  # noqa: N802
        if self.nf_refused:  # the whole (discarded) body arrived within the linger
            return
        super().requestReceived(command, path, version)

    def nf_refuse(self, *, size: int, declared: bool) -> None:
        from twisted.internet import reactor

        self.nf_refused = True
        channel, transport = self.channel, self.channel.transport
        headers, body = refusal(self.nf_path, size=size, limit=self.nf_limit or 0, declared=declared)
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
        self.nf_log(len(answer))

    def nf_log(self, sent: int) -> None:
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
    """daphne's factory: its protocols build :class:`LimitedWebRequest`; Twisted's line is not written."""

    request_class = LimitedWebRequest

    def buildProtocol(self, addr: Any) -> Any:  # noqa: N802
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = LimitedWebRequest
        return protocol

    def log(self, request: Any) -> None:
        """Twisted's per-request access line: not built (daphne's own access log is the log)."""

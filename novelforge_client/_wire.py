"""The clients' default transports: keep-alive HTTP/1.1 connections to the service, over the
standard library's :mod:`http.client` (:class:`Wire`, for :class:`~novelforge_client.Client`; and,
one worker thread per request in flight, :class:`AsyncWire` for :class:`~novelforge_client.AsyncClient`).
The standard library reads and writes HTTP; nothing here parses it.

Why not ``httpx`` for every call: an agent checkpoints at every boundary, on the same machine as
the service and its database, so the client's CPU per call is taken from the server. Through
``httpx.Client`` most of that CPU is the general-purpose machinery this client never uses (URL
merging, cookie jars, auth and redirect hooks, an h11 state machine per request). These transports
do only what the client needs, with the same behaviour where it matters:

- timeouts: ``timeout`` bounds the connect and every read and write, like ``httpx.Timeout(timeout)``;
- TLS: ``https`` URLs use the context ``httpx`` would build (:func:`httpx.create_ssl_context`:
  certifi, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``), host name checked;
- keep-alive: idle connections are reused, one request at a time each (:class:`Wire` is
  thread-safe: a thread takes a connection from the idle list or opens one). A connection the
  server closed while idle is noticed before the request is written (it is readable, or at EOF),
  and replaced, so that close is never mistaken for a lost answer;
- failures are raised as the ``httpx`` exceptions of the same meaning (``ConnectError``,
  ``ConnectTimeout`` before anything was sent; ``WriteError``, ``ReadError``, ``ReadTimeout``,
  ``RemoteProtocolError`` after), so the retry rules of :mod:`novelforge_client._core` apply
  unchanged.

The clients use ``httpx`` instead when a custom ``transport`` is given or a proxy is set in the
environment (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``: ``httpx`` honours them, these do not).
"""
from __future__ import annotations

import asyncio
import http.client
import select
import socket
import threading
import urllib.request
from urllib.parse import urlsplit

import httpx

#: Idle connections kept per client (more concurrent callers open more, and close the surplus).
MAX_IDLE = 16


def usable(base_url: str) -> bool:
    """Whether this transport can serve ``base_url`` exactly as ``httpx.Client`` would: an http(s)
    URL and no proxy configured in the environment for its scheme."""
    scheme = urlsplit(base_url).scheme
    if scheme not in ("http", "https"):
        return False
    proxies = urllib.request.getproxies()
    return scheme not in proxies and "all" not in proxies


class Wire:
    """Keep-alive HTTP/1.1 requests to one origin (``base_url``'s scheme, host and port)."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.headers = dict(headers)
        self.timeout = timeout
        self._ssl = httpx.create_ssl_context() if self.https else None
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connection(self) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if conn.sock is not None and not _readable(conn.sock):
                return conn
            conn.close()  # closed by the server while idle (or answered out of turn): not reusable
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._ssl)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and conn.sock is not None and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def request(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        """Send one request; the status and body of the answer. ``target`` is the path (and query)
        under ``base_url``; ``headers`` are sent in addition to the client's own."""
        url = self.prefix + target
        conn = self._connection()
        try:
            if conn.sock is None:
                try:
                    conn.connect()
                except TimeoutError as exc:
                    raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port}: {exc}") from exc
                except OSError as exc:  # refused, unreachable, a TLS handshake refused: nothing was sent
                    raise httpx.ConnectError(f"connecting to {self.host}:{self.port}: {exc}") from exc
            try:
                conn.request(method, url, body=body, headers={**self.headers, **headers} if headers else self.headers)
            except TimeoutError as exc:
                raise httpx.WriteTimeout(str(exc)) from exc
            except OSError as exc:
                raise httpx.WriteError(str(exc)) from exc
            try:
                response = conn.getresponse()
                content = response.read()
            except TimeoutError as exc:
                raise httpx.ReadTimeout(str(exc)) from exc
            except http.client.HTTPException as exc:  # closed before or during the answer, or not HTTP
                raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}") from exc
            except OSError as exc:
                raise httpx.ReadError(str(exc)) from exc
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            self._release(conn)
        return response.status, content

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _readable(sock: socket.socket | None) -> bool:
    """An idle keep-alive socket is readable only when the server closed it (or sent something
    unasked): either way the next request must not be written to it."""
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):  # any descriptor number (select() stops at FD_SETSIZE)
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):  # already closed
        return True
    return bool(readable)


def _checked(headers: dict[str, str]) -> dict[str, str]:
    """Header values that cannot end the header block early (a token pasted with a newline)."""
    for name, value in headers.items():
        if any(c in value for c in "\r\n\0") or any(c in name for c in "\r\n\0: "):
            raise ValueError(f"header {name!r} has a character not allowed in an HTTP header")
    return headers


class AsyncWire:
    """:class:`Wire` for asyncio: each request runs on the same keep-alive ``http.client``
    connections in a worker thread (``asyncio.to_thread``), so the standard library reads and
    writes HTTP for both clients, with the same timeouts, TLS context, stale-connection check and
    ``httpx`` exceptions. A thread hop costs far less than ``httpx.AsyncClient``'s request
    machinery, and no HTTP parsing is written here. A request whose caller is cancelled still
    finishes in its thread, as a request already sent would on the server."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        self._wire = Wire(base_url, headers, timeout)

    async def request(self, method: str, target: str, body: bytes | None,
                      headers: dict[str, str]) -> tuple[int, bytes]:
        """As :meth:`Wire.request`."""
        return await asyncio.to_thread(self._wire.request, method, target, body, headers)

    async def aclose(self) -> None:
        self._wire.close()

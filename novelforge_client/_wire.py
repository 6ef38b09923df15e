"""The synchronous client's default transport: keep-alive HTTP/1.1 connections to the service over
the standard library's :mod:`http.client`.

Why not ``httpx.Client`` for every call: an agent checkpoints at every boundary, on the same machine
as the service and its database, so the client's CPU per call is taken from the server. Through
``httpx.Client`` most of that CPU is the general-purpose machinery this client never uses (URL
merging, cookie jars, auth and redirect hooks, an h11 state machine per request). This transport
does only what the client needs, with the same behaviour where it matters:

- timeouts: ``timeout`` bounds the connect and every read and write, like ``httpx.Timeout(timeout)``;
- TLS: ``https`` URLs use the context ``httpx`` would build (:func:`httpx.create_ssl_context`:
  certifi, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``), hostname checked;
- keep-alive: idle connections are reused, one request at a time each (thread-safe: a thread takes
  a connection from the idle list or opens one). A connection the server closed while idle is
  noticed before the request is written (it is readable), and replaced, so that close is never
  mistaken for a lost answer;
- failures are raised as the ``httpx`` exceptions of the same meaning (``ConnectError``,
  ``ConnectTimeout`` before anything was sent; ``WriteError``, ``ReadError``, ``ReadTimeout``,
  ``RemoteProtocolError`` after), so the retry rules of :mod:`novelforge_client._core` apply
  unchanged.

The client uses ``httpx.Client`` instead when a custom ``transport`` is given or a proxy is set in
the environment (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``: ``httpx`` honours them, this does not).
"""
from __future__ import annotations

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


def _readable(sock: socket.socket) -> bool:
    """An idle keep-alive socket is readable only when the server closed it (or sent something
    unasked): either way the next request must not be written to it."""
    try:
        if hasattr(select, "poll"):  # any descriptor number (select() stops at FD_SETSIZE)
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):  # already closed
        return True
    return bool(readable)

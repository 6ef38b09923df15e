"""The clients' default transports: keep-alive HTTP/1.1 connections to the service, over the
standard library's :mod:`http.client` (:class:`Wire`, for :class:`~novelforge_client.Client`) and
asyncio streams (:class:`AsyncWire`, for :class:`~novelforge_client.AsyncClient`).

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
    """:class:`Wire` for asyncio: keep-alive HTTP/1.1 connections (asyncio streams) to one origin,
    one request at a time each, with the same timeouts, TLS context, stale-connection check and
    ``httpx`` exceptions. Its connections belong to the event loop that opened them, as
    ``httpx.AsyncClient``'s do."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self._ssl = httpx.create_ssl_context() if self.https else None
        host = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None and parts.port != (443 if self.https else 80):
            host = f"{host}:{parts.port}"
        fixed = "".join(f"{k}: {v}\r\n" for k, v in _checked({"Host": host, **headers}).items())
        self._fixed = fixed.encode("latin-1")
        self._idle: list[tuple[asyncio.AbstractEventLoop, asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._closed = False

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        while self._idle:
            opened_on, reader, writer = self._idle.pop()
            if opened_on is not loop:  # a connection of another (maybe closed) loop cannot serve this one
                _close_quietly(writer)
                continue
            # A close (or stray bytes) from the server while idle: an EOF the loop already read, or
            # still unread on the socket.
            if not reader.at_eof() and not writer.is_closing() and not _readable(writer.get_extra_info("socket")):
                return reader, writer
            writer.close()  # closed by the server while idle: not reusable
        try:
            async with asyncio.timeout(self.timeout):
                return await asyncio.open_connection(self.host, self.port, ssl=self._ssl,
                                                     server_hostname=self.host if self.https else None)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port}: timed out") from exc
        except OSError as exc:  # refused, unreachable, a TLS handshake refused: nothing was sent
            raise httpx.ConnectError(f"connecting to {self.host}:{self.port}: {exc}") from exc

    async def request(self, method: str, target: str, body: bytes | None,
                      headers: dict[str, str]) -> tuple[int, bytes]:
        """As :meth:`Wire.request`."""
        reader, writer = await self._connection()
        reusable = False
        try:
            head = [f"{method} {self.prefix}{target} HTTP/1.1\r\n".encode("ascii"), self._fixed]
            if headers:
                head.append("".join(f"{k}: {v}\r\n" for k, v in _checked(headers).items()).encode("latin-1"))
            if body is not None or method in ("POST", "PUT", "PATCH"):
                head.append(b"Content-Length: %d\r\n" % len(body or b""))
            head.append(b"\r\n")
            try:
                async with asyncio.timeout(self.timeout):
                    writer.write(b"".join(head) + (body or b""))
                    await writer.drain()
            except TimeoutError as exc:
                raise httpx.WriteTimeout("writing the request: timed out") from exc
            except OSError as exc:
                raise httpx.WriteError(str(exc)) from exc
            try:
                status, content, reusable = await self._response(reader, method)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("reading the answer: timed out") from exc
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}") from exc
            except OSError as exc:
                raise httpx.ReadError(str(exc)) from exc
        finally:
            if reusable and not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append((asyncio.get_running_loop(), reader, writer))
            else:
                writer.close()
        return status, content

    async def _response(self, reader: asyncio.StreamReader, method: str) -> tuple[int, bytes, bool]:
        """Status, body, and whether the connection may carry another request. Every read is
        bounded by ``timeout`` on its own (httpx's read timeout)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout) as deadline:
            while True:
                block = await reader.readuntil(b"\r\n\r\n")
                lines = block[:-4].decode("latin-1").split("\r\n")
                version, _, rest = lines[0].partition(" ")
                if not version.startswith("HTTP/1."):
                    raise ValueError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
                status = int(rest[:3])
                if not 100 <= status < 200:
                    break  # an interim 1xx answer is followed by the real one
                deadline.reschedule(loop.time() + self.timeout)
            fields: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    raise ValueError(f"malformed header line {line[:80]!r}")
                fields[name.strip().lower()] = value.strip()
            keep = version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
            if method == "HEAD" or status in (204, 304):
                return status, b"", keep
            chunks: list[bytes] = []
            if "chunked" in fields.get("transfer-encoding", "").lower():
                while True:
                    deadline.reschedule(loop.time() + self.timeout)
                    size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                            pass
                        return status, b"".join(chunks), keep
                    chunks.append((await reader.readexactly(size + 2))[:-2])
            if "content-length" in fields:
                return status, await reader.readexactly(int(fields["content-length"])), keep
            while data := await reader.read(65536):  # delimited by the server closing
                deadline.reschedule(loop.time() + self.timeout)
                chunks.append(data)
            return status, b"".join(chunks), False

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for _, _, writer in idle:
            _close_quietly(writer)


def _close_quietly(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
    except RuntimeError:  # its event loop is closed: so is the connection's transport
        pass

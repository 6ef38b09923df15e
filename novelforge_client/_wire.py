"""The clients' default transports: keep-alive HTTP/1.1 connections to the service, over the
standard library's :mod:`http.client` (:class:`Wire`, for :class:`~novelforge_client.Client`; and,
one worker thread per request in flight, :class:`AsyncWire` for :class:`~novelforge_client.AsyncClient`).
The standard library reads and writes HTTP; nothing here parses it. Beside them, :class:`Socket`
carries the calls that ask for it (the checkpoint write; the LangGraph saver's puts and writes)
over the service's API socket, one websocket (``websockets``' sans-I/O protocol reads and writes its frames).

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
import functools
import http.client
import json
import select
import socket
import threading
import urllib.request
from typing import Any
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


#: Where the API's paths start on the server (a frame names the path as HTTP would, below the root).
API_PREFIX = "/api/v1"
#: Larger bodies go over HTTP: a big write gains nothing from the socket, and a server's cap on a
#: websocket message (daphne's: 1 MiB) is then never near.
SOCKET_MAX_BODY = 64 * 1024


class Socket:
    """Requests over the service's API socket (``/ws/api/``): one websocket, opened on first use
    with the client's headers and the server's own Origin, each request a frame and each answer
    the status and body the same HTTP request gets (the server's ``api/socket.py``).

    Used for the calls that ask for it (``Call(socket=True)``: the client's checkpoint write; the
    LangGraph saver's puts and writes), which the server answers there without an HTTP request's cost. :meth:`request` returns ``None`` when
    the socket cannot take the request and nothing was sent (another thread is using it; the
    handshake failed): the caller sends it over HTTP instead. A server that refuses the handshake
    (an older service without the socket, a proxy without websockets) is not asked again by this
    client. Once a frame is sent, failures are the ``httpx`` exceptions of the same meaning
    (``ReadError``, ``ReadTimeout``, ``RemoteProtocolError``), so the retry rules apply unchanged.
    """

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(base_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        self.url = f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/ws/api/"
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        self.timeout = timeout
        self._ssl = httpx.create_ssl_context() if parts.scheme == "https" else None
        self._lock = threading.Lock()
        self._ws: _Frames | None = None
        self._next = 0
        self.refused = False  # the server refused the handshake: HTTP only from now on
        self._closed = False

    def _open(self) -> _Frames | None:
        from websockets.exceptions import InvalidHandshake, InvalidStatus

        try:
            return _Frames(self.url, self.origin, self.headers, self.timeout, self._ssl)
        except InvalidStatus as exc:
            # 4xx: no API socket there (an older service, a proxy without websockets, a token it
            # refuses: HTTP says which): HTTP from now on. 5xx: this time only.
            self.refused = exc.response.status_code < 500
            return None
        except (InvalidHandshake, OSError, TimeoutError):  # unreachable or cut short now: HTTP this time
            return None

    def request(self, method: str, target: str, body: bytes | None) -> tuple[int, bytes] | None:
        """One request (``target``: the path and query under ``/api/v1``); its status and body,
        or ``None`` when nothing was sent (use HTTP)."""
        if body is not None and len(body) > SOCKET_MAX_BODY:
            return None
        if self.refused or self._closed or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._ws is not None and not self._ws.settle():
                self._drop()  # closed by the server while idle: nothing was sent on it, open another
            if self._ws is None:
                self._ws = self._open()
                if self._ws is None:
                    return None
            self._next += 1
            frame_id = self._next
            frame = json.dumps({"id": frame_id, "method": method, "path": API_PREFIX + target,
                                "body": None if body is None else body.decode()}, ensure_ascii=False)
            try:
                self._ws.send(frame)
            except OSError:  # closed by the server while idle: nothing reached it
                self._drop()
                return None
            except BaseException:
                self._drop()
                raise
            try:
                text = self._ws.recv()
            except TimeoutError as exc:
                self._drop()
                raise httpx.ReadTimeout(f"no answer on the API socket in {self.timeout} s") from exc
            except Exception as exc:
                self._drop()
                raise httpx.ReadError(f"the API socket closed before the answer: {exc}") from exc
            try:
                answer = json.loads(text)
                if answer["id"] != frame_id:
                    raise ValueError(f"answer {answer['id']!r} to request {frame_id}")
                return int(answer["status"]), answer["body"].encode()
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self._drop()
                raise httpx.RemoteProtocolError(f"the API socket answered out of turn: {exc}") from exc
        finally:
            self._lock.release()

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._drop()


class _Frames:
    """One websocket on a blocking socket, driven by the thread that calls it through
    ``websockets``' sans-I/O :class:`~websockets.client.ClientProtocol` (its public interface for
    bringing your own I/O): the protocol writes and parses the handshake and the frames, answers
    pings and closes; this class only moves bytes. Unlike ``websockets.sync``'s connection it has
    no reader thread, so an answer reaches the caller without a hand-off between threads (one
    wake-up less per request, on machines where the agent shares its cores with the server).
    What the server sent while the socket was idle (its keep-alive pings, a close) is read
    before the next request (:meth:`settle`): a ping is answered then, a closed socket is
    replaced before anything is sent on it.

    ``timeout`` bounds the connect, the handshake and each read; failures are ``OSError``
    (``TimeoutError`` for a timeout), or ``websockets``' handshake exceptions while opening.
    """

    def __init__(self, url: str, origin: str, headers: dict[str, str], timeout: float, ssl_context: Any) -> None:
        from websockets.client import ClientProtocol
        from websockets.http11 import USER_AGENT
        from websockets.protocol import State
        from websockets.typing import Origin
        from websockets.uri import parse_uri

        uri = parse_uri(url)
        self._open_state = State.OPEN
        self.protocol = ClientProtocol(uri, origin=Origin(origin), max_size=None)  # no extension: no compression
        self.sock = socket.create_connection((uri.host, uri.port), timeout=timeout)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if uri.secure:
                self.sock = ssl_context.wrap_socket(self.sock, server_hostname=uri.host)
            request = self.protocol.connect()
            request.headers.update(headers)
            request.headers.setdefault("User-Agent", USER_AGENT)
            self.protocol.send_request(request)
            self._flush()
            while self.protocol.state is State.CONNECTING and self.protocol.handshake_exc is None:
                self._read()
            if self.protocol.handshake_exc is not None:
                raise self.protocol.handshake_exc
            self.protocol.events_received()  # the handshake's response
        except BaseException:
            self.sock.close()
            raise

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.sock.sendall(data)
            # b"": the protocol has nothing more to say (after a close): the peer sees EOF next

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
        self._flush()  # pongs, a close's answer
        if not data and self.protocol.handshake_exc is None:  # at EOF: closed (a refused handshake says why itself)
            raise ConnectionResetError("the API socket was closed")

    def settle(self) -> bool:
        """Take in what the server sent while this socket was idle (pings are answered, a close is
        seen); whether the socket is still open for a request."""
        try:
            while self._waiting():
                self._read()
        except OSError:
            return False
        self.protocol.events_received()  # nothing is waited for between requests: pings and pongs
        return self.protocol.state is self._open_state

    def _waiting(self) -> bool:
        pending = getattr(self.sock, "pending", None)  # TLS: bytes already decrypted
        return bool(pending and pending()) or _readable(self.sock)  # any descriptor number

    def _require_open(self) -> None:
        if self.protocol.state is not self._open_state:
            raise ConnectionResetError("the API socket was closed")

    def send(self, text: str) -> None:
        self._require_open()
        self.protocol.send_text(text.encode())
        self._flush()

    def recv(self) -> str:
        """The next text message (pings answered, binary messages skipped)."""
        from websockets.frames import Frame, Opcode

        parts: list[bytes] = []
        text = False
        while True:
            for event in self.protocol.events_received():
                if not isinstance(event, Frame):
                    continue
                if event.opcode is Opcode.TEXT or event.opcode is Opcode.BINARY:
                    text, parts = event.opcode is Opcode.TEXT, [event.data]
                elif event.opcode is Opcode.CONT:
                    parts.append(event.data)
                else:
                    continue  # ping (answered by the protocol), pong, close (seen by the state below)
                if event.fin and text:
                    return b"".join(parts).decode()
            self._require_open()  # a close received: no answer will come
            self._read()

    def close(self) -> None:
        try:
            if self.protocol.state is self._open_state:
                self.protocol.send_close()
                self._flush()
        except OSError:  # already gone
            pass
        finally:
            self.sock.close()


class Wire:
    """Keep-alive HTTP/1.1 requests to one origin (``base_url``'s scheme, host and port); with
    ``socket``, the calls that ask for it over the API socket (:class:`Socket`) first."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float, *, socket: Socket | None = None) -> None:
        self.socket = socket
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

    def request(self, method: str, target: str, body: bytes | None, headers: dict[str, str], *,
                socket: bool = False) -> tuple[int, bytes]:
        """Send one request; the status and body of the answer. ``target`` is the path (and query)
        under ``base_url``; ``headers`` are sent in addition to the client's own. ``socket``:
        over the API socket when there is one and it can take it (:class:`Socket`), else HTTP."""
        url = self.prefix + target
        if socket and self.socket is not None:
            answer = self.socket.request(method, target, body)
            if answer is not None:
                return answer
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
        if self.socket is not None:
            self.socket.close()
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _readable(sock: socket.socket | None) -> bool:
    """An idle keep-alive socket is readable only when the server closed it (or sent something
    unasked): either way the next request must not be written to it. (The API socket asks the
    same of its websocket between requests: pings to answer, a close.) A socket already closed
    is readable: reading it says so."""
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

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float, *, socket: Socket | None = None) -> None:
        self._wire = Wire(base_url, headers, timeout, socket=socket)

    async def request(self, method: str, target: str, body: bytes | None,
                      headers: dict[str, str], *, socket: bool = False) -> tuple[int, bytes]:
        """As :meth:`Wire.request`."""
        return await asyncio.to_thread(functools.partial(self._wire.request, socket=socket), method, target, body, headers)

    async def aclose(self) -> None:
        self._wire.close()

"""A loopback TCP proxy that can lose answers: it forwards a request to the real server, lets the
server commit and start answering, then closes the client's side instead of relaying the answer
(``drop_responses``), or answers ``503`` itself without forwarding (``fail_with_503``). It counts the
request lines it forwarded, so a test sees whether the client retried. Independent of the server.

The API socket (``/ws/api/``) passes through it as the HTTP requests do: its handshake is forwarded
(a ``101`` answer is never the one lost), each request frame the client sends is counted as the
request it names (frames are unmasked to be read), and an answer frame can be lost the same way.
"""
from __future__ import annotations

import re
import socket
import threading
from collections import Counter

REQUEST_LINE = re.compile(rb"(GET|POST|PUT|PATCH|DELETE) (/[^ ?]*)[^ ]* HTTP/1\.[01]\r\n")
#: A request frame of the API socket: its method and path (the client's frames put them first).
SOCKET_REQUEST = re.compile(rb'"method": "(GET|POST|PUT|PATCH|DELETE)", "path": "(/[^"?]*)')


def unmasked_frames(data: bytes) -> tuple[list[bytes], bytes]:
    """The payloads of the whole client frames at the start of ``data`` (unmasked), and the rest."""
    payloads = []
    while len(data) >= 2:
        length, at = data[1] & 0x7F, 2
        if length == 126:
            if len(data) < 4:
                break
            length, at = int.from_bytes(data[2:4], "big"), 4
        elif length == 127:
            if len(data) < 10:
                break
            length, at = int.from_bytes(data[2:10], "big"), 10
        masked = data[1] & 0x80
        mask = data[at:at + 4] if masked else b"\0\0\0\0"
        at += 4 if masked else 0
        if len(data) < at + length:
            break
        payloads.append(bytes(b ^ mask[i % 4] for i, b in enumerate(data[at:at + length])))
        data = data[at + length:]
    return payloads, data


class DroppingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.drop_responses = 0  # how many answers to lose (after the server sent them)
        self.fail_with_503 = 0  # how many requests to answer 503 without forwarding
        self.forwarded: Counter[tuple[str, str]] = Counter()
        self.dropped = 0
        self.connections = 0  # client connections accepted (keep-alive reuse keeps this low)
        self._open: list[socket.socket] = []  # both sides of every connection, for close_connections()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def close_connections(self) -> None:
        """Close every open connection, as a server closes idle keep-alive connections."""
        with self.lock:
            socks, self._open = self._open, []
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _take(self, name: str) -> bool:
        with self.lock:
            if getattr(self, name) > 0:
                setattr(self, name, getattr(self, name) - 1)
                return True
            return False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self._open.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            first = client.recv(65536)
            if not first:
                return
            if self._take("fail_with_503"):
                client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            upstream = socket.create_connection(self.upstream)
            with self.lock:
                self._open.append(upstream)
            threading.Thread(target=self._pump_requests, args=(client, upstream, first), daemon=True).start()
            while True:
                chunk = upstream.recv(65536)
                if not chunk:
                    return
                if chunk.startswith(b"HTTP/1.1 101 "):  # the API socket's handshake: not an answer to lose
                    client.sendall(chunk)
                    continue
                if self._take("drop_responses"):
                    # The server has committed and answered: lose the answer, as a dropped connection would.
                    with self.lock:
                        self.dropped += 1
                    return
                client.sendall(chunk)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    sock.close()

    def _pump_requests(self, client: socket.socket, upstream: socket.socket, first: bytes) -> None:
        data = first
        socket_frames: bytes | None = None  # after an upgrade: the client's frames not yet whole
        try:
            while data:
                with self.lock:
                    if socket_frames is None:
                        for method, path in REQUEST_LINE.findall(data):
                            self.forwarded[(method.decode(), path.decode())] += 1
                    else:
                        payloads, socket_frames = unmasked_frames(socket_frames + data)
                        for payload in payloads:
                            for method, path in SOCKET_REQUEST.findall(payload):
                                self.forwarded[(method.decode(), path.decode())] += 1
                upstream.sendall(data)
                if socket_frames is None and b"\r\nUpgrade: websocket\r\n" in data:
                    socket_frames = b""
                data = client.recv(65536)
        except OSError:
            pass

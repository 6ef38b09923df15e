"""A loopback TCP proxy that can lose answers: it forwards a request to the real server, lets the
server commit and start answering, then closes the client's side instead of relaying the answer
(``drop_responses``), or answers ``503`` itself without forwarding (``fail_with_503``). It counts the
request lines it forwarded, so a test sees whether the client retried. Independent of the server.
"""
from __future__ import annotations

import re
import socket
import threading
from collections import Counter

REQUEST_LINE = re.compile(rb"(GET|POST|PUT|PATCH|DELETE) (/[^ ?]*)[^ ]* HTTP/1\.[01]\r\n")


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
        try:
            while data:
                with self.lock:
                    for method, path in REQUEST_LINE.findall(data):
                        self.forwarded[(method.decode(), path.decode())] += 1
                upstream.sendall(data)
                data = client.recv(65536)
        except OSError:
            pass

"""The client's side of the API socket (``novelforge_client._wire.Socket``) against a real
websocket peer (``websockets``' own server, in a thread): the frames it must read as any
websocket client does (pings, fragmented answers, a close while idle) and the handshakes it must
tell apart. The service's own socket is exercised end to end in ``test_api_socket.py``."""
from __future__ import annotations

import json
import select
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.datastructures import Headers
from websockets.http11 import Response
from websockets.sync.server import ServerConnection, serve

from novelforge_client._wire import Socket


class Peer:
    """A websocket server on a free port; ``handler`` serves each connection."""

    def __init__(self, handler: Callable[[ServerConnection], None], status: int | None = None) -> None:
        self.connections = 0
        self.seen: list[dict[str, Any]] = []
        self.headers: list[Headers] = []

        def refuse(conn: ServerConnection, request: Any) -> Response | None:
            self.headers.append(request.headers)
            return None if status is None else conn.respond(status, "refused\n")

        def serve_one(conn: ServerConnection) -> None:
            self.connections += 1
            handler(conn)

        self.server = serve(serve_one, "127.0.0.1", 0, process_request=refuse)
        self.url = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, conn: ServerConnection, status: int = 200, body: str = "{}") -> dict[str, Any]:
        frame = json.loads(conn.recv())
        self.seen.append(frame)
        conn.send(json.dumps({"id": frame["id"], "status": status, "body": body}))
        return frame

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    made: list[Peer] = []
    yield made
    for peer in made:
        peer.close()


def socket_to(peer: Peer) -> Socket:
    return Socket(peer.url, {"Authorization": "Bearer t0k", "Content-Type": "application/json"}, timeout=10)


def test_a_request_is_one_frame_and_its_answer_the_status_and_body(peers: list[Peer]) -> None:
    def handler(conn: ServerConnection) -> None:
        peer.answer(conn, 201, '{"seq": 1}')
        peer.answer(conn, 409, '{"code": "lease_lost"}')

    peer = Peer(handler)
    peers.append(peer)
    sock = socket_to(peer)
    try:
        assert sock.request("POST", "/runs/7/checkpoints", b'{"boundary": "x"}') == (201, b'{"seq": 1}')
        assert sock.request("POST", "/runs/7/checkpoints", b"{}") == (409, b'{"code": "lease_lost"}')
    finally:
        sock.close()
    assert peer.connections == 1
    assert peer.seen == [
        {"id": 1, "method": "POST", "path": "/api/v1/runs/7/checkpoints", "body": '{"boundary": "x"}'},
        {"id": 2, "method": "POST", "path": "/api/v1/runs/7/checkpoints", "body": "{}"},
    ]
    headers = peer.headers[0]
    assert headers["Authorization"] == "Bearer t0k"
    assert headers["Origin"] == peer.url
    assert "Content-Type" not in headers
    assert "Sec-WebSocket-Extensions" not in headers  # no compression asked for


def test_a_ping_before_the_answer_is_answered_and_a_fragmented_answer_is_read_whole(peers: list[Peer]) -> None:
    pongs: list[bool] = []
    done = threading.Event()

    def handler(conn: ServerConnection) -> None:
        frame = json.loads(conn.recv())
        pong = conn.ping()
        answer = json.dumps({"id": frame["id"], "status": 200, "body": "x" * 3000})
        conn.send(iter([answer[:10], answer[10:2000], answer[2000:]]))  # one message, three frames
        pongs.append(pong.wait(10))
        done.set()

    peer = Peer(handler)
    peers.append(peer)
    sock = socket_to(peer)
    try:
        assert sock.request("POST", "/graph-threads/writes", b"{}") == (200, b"x" * 3000)
        assert done.wait(10)
    finally:
        sock.close()
    assert pongs == [True]


def test_a_ping_sent_while_the_socket_was_idle_is_answered_before_the_next_request(peers: list[Peer]) -> None:
    answered_before: list[bool] = []
    idle = threading.Event()

    def handler(conn: ServerConnection) -> None:
        peer.answer(conn)
        assert idle.wait(10)
        pong = conn.ping()  # the client is not reading now
        frame = json.loads(conn.recv())
        answered_before.append(pong.is_set())  # the pong came on the wire ahead of the second request
        conn.send(json.dumps({"id": frame["id"], "status": 200, "body": "{}"}))

    peer = Peer(handler)
    peers.append(peer)
    sock = socket_to(peer)
    try:
        assert sock.request("POST", "/a", b"{}") == (200, b"{}")
        idle.set()
        assert select.select([sock._ws.sock], [], [], 10)[0]  # the ping has reached the idle client
        assert sock.request("POST", "/b", b"{}") == (200, b"{}")
    finally:
        sock.close()
    assert answered_before == [True]
    assert peer.connections == 1


def test_a_socket_the_server_closed_while_idle_is_replaced_before_the_request_is_sent(peers: list[Peer]) -> None:
    def handler(conn: ServerConnection) -> None:
        peer.answer(conn)
        if peer.connections == 1:
            conn.close(1012, "restart")  # between two requests of the client

    peer = Peer(handler)
    peers.append(peer)
    sock = socket_to(peer)
    try:
        assert sock.request("POST", "/a", b"{}") == (200, b"{}")
        # the server's close has reached the client (it waits for the client's answer to it):
        # the next request opens a new socket instead of being written into the closed one
        assert select.select([sock._ws.sock], [], [], 10)[0]
        assert sock.request("POST", "/b", b"{}") == (200, b"{}")
    finally:
        sock.close()
    assert peer.connections == 2
    assert [f["path"] for f in peer.seen] == ["/api/v1/a", "/api/v1/b"]


@pytest.mark.parametrize(("status", "refused"), [(403, True), (404, True), (503, False)])
def test_a_refused_handshake_sends_nothing_and_a_4xx_is_not_asked_again(peers: list[Peer], status: int,
                                                                       refused: bool) -> None:
    peer = Peer(lambda conn: None, status=status)
    peers.append(peer)
    sock = socket_to(peer)
    try:
        assert sock.request("POST", "/a", b"{}") is None
        assert sock.refused is refused
        assert sock.request("POST", "/a", b"{}") is None
    finally:
        sock.close()
    assert len(peer.headers) == (1 if refused else 2)
    assert peer.seen == []


def test_an_answer_cut_short_is_a_read_error_and_the_next_request_opens_a_new_socket(peers: list[Peer]) -> None:
    import httpx

    def handler(conn: ServerConnection) -> None:
        frame = json.loads(conn.recv())
        peer.seen.append(frame)
        if peer.connections == 1:
            conn.close()  # the request arrived, its answer never will
        else:
            conn.send(json.dumps({"id": frame["id"], "status": 200, "body": "{}"}))

    peer = Peer(handler)
    peers.append(peer)
    sock = socket_to(peer)
    try:
        with pytest.raises(httpx.ReadError):
            sock.request("POST", "/a", b"{}")
        assert sock.request("POST", "/a", b"{}") == (200, b"{}")
    finally:
        sock.close()
    assert peer.connections == 2


def test_a_socket_whose_descriptor_is_past_fd_setsize_is_used_as_any_other(peers: list[Peer]) -> None:
    """An agent process holding more than 1,024 descriptors (an orchestrator of many agents, a
    process with many files open) gets sockets numbered past FD_SETSIZE, which ``select()``
    refuses: the check for what the server sent while the socket was idle made every request
    after the first a ``ValueError``. It polls: the second request is answered."""
    import os
    import socket as sockets

    from tests.support.descriptors import descriptors_up_to

    high = 1500

    def handler(conn: ServerConnection) -> None:
        peer.answer(conn)
        peer.answer(conn)

    peer = Peer(handler)
    peers.append(peer)
    with descriptors_up_to(high):
        sock = socket_to(peer)
        try:
            assert sock.request("POST", "/a", b"{}") == (200, b"{}")
            frames = sock._ws
            old = frames.sock
            frames.sock = sockets.socket(fileno=os.dup2(old.fileno(), high))  # the same connection, renumbered
            frames.sock.settimeout(old.gettimeout())
            old.close()
            assert frames.sock.fileno() == high
            assert sock.request("POST", "/b", b"{}") == (200, b"{}")
        finally:
            sock.close()
    assert [f["path"] for f in peer.seen] == ["/api/v1/a", "/api/v1/b"] and peer.connections == 1
